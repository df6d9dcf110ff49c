"""Metrics sinks: one JSON line per record in metrics.jsonl, and TensorBoard event files."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter


class MetricsLogger:
    def __init__(self, run_dir: Path):
        run_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = (run_dir / "metrics.jsonl").open("a", buffering=1)
        self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, split: str, step: int, metrics: dict[str, float]) -> None:
        """Write ``metrics`` under ``split/`` (train, eval) for ``step``."""
        record = {"split": split, "step": step, "time": time.time(), **metrics}
        self._jsonl.write(json.dumps(record) + "\n")
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                self._tb.add_scalar(f"{split}/{key}", value, step)
        self._tb.flush()

    def close(self) -> None:
        self._jsonl.close()
        self._tb.close()
