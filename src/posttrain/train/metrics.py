"""Metrics sinks: one JSON line per record in metrics.jsonl, and TensorBoard event files."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from torch.utils.tensorboard import SummaryWriter


def without_non_finite(value: Any) -> tuple[Any, int]:
    """``value`` with every NaN or infinite float replaced by None, and how many were replaced.

    JSON has no NaN or Infinity (``json.dumps`` writes them as bare words no other parser reads).
    """
    if isinstance(value, float) and not math.isfinite(value):
        return None, 1
    if isinstance(value, dict):
        pairs = [(k, *without_non_finite(v)) for k, v in value.items()]
        return {k: v for k, v, _ in pairs}, sum(n for _, _, n in pairs)
    if isinstance(value, (list, tuple)):
        items = [without_non_finite(v) for v in value]
        return [v for v, _ in items], sum(n for _, n in items)
    return value, 0


def dumps_finite(record: dict[str, Any], **kwargs: Any) -> str:
    """Valid JSON for ``record``: non-finite numbers as null, counted in ``non_finite_values``."""
    clean, replaced = without_non_finite(record)
    if replaced:
        clean["non_finite_values"] = replaced
    return json.dumps(clean, allow_nan=False, **kwargs)


class MetricsLogger:
    def __init__(self, run_dir: Path):
        run_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = (run_dir / "metrics.jsonl").open("a", buffering=1)
        self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, split: str, step: int, metrics: dict[str, float]) -> None:
        """Write ``metrics`` under ``split/`` (train, eval) for ``step``."""
        record = {"split": split, "step": step, "time": time.time(), **metrics}
        self._jsonl.write(dumps_finite(record) + "\n")
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                self._tb.add_scalar(f"{split}/{key}", value, step)
        self._tb.flush()

    def close(self) -> None:
        self._jsonl.close()
        self._tb.close()
