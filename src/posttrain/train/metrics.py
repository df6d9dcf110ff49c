"""Metric sinks: metrics.jsonl always; TensorBoard by default; Weights & Biases and trackio when
installed and enabled in the ``logging`` config section.

Every record goes to every sink under ``split/name`` (``train/reward_mean``, ``eval/accuracy``)
at its train step. The trackers are optional: neither is a dependency, and enabling one that is
not installed is a config error (exit 2), not a silent no-op.
"""

from __future__ import annotations

import importlib.util
import json
import math
import time
from pathlib import Path
from typing import Any, Protocol

from posttrain.config import ConfigError, LoggingSection


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


class Sink(Protocol):
    def log(self, split: str, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def _scalars(split: str, metrics: dict[str, Any]) -> dict[str, float]:
    return {f"{split}/{k}": float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


class TensorBoardSink:
    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, split: str, step: int, metrics: dict[str, float]) -> None:
        for tag, value in _scalars(split, metrics).items():
            self._writer.add_scalar(tag, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def _require(package: str, key: str) -> None:
    if importlib.util.find_spec(package) is None:
        raise ConfigError(f"{key} is true but {package} is not installed (pip install {package}), or set it to false")


class WandbSink:
    def __init__(self, run_dir: Path, cfg: LoggingSection, run_config: dict[str, Any]):
        _require("wandb", "logging.wandb.enabled")
        import wandb

        self._run = wandb.init(project=cfg.wandb.project, entity=cfg.wandb.entity or None, name=run_dir.name,
                               dir=str(run_dir), mode=cfg.wandb.mode, config=run_config)

    def log(self, split: str, step: int, metrics: dict[str, float]) -> None:
        self._run.log(_scalars(split, metrics), step=step)

    def close(self) -> None:
        self._run.finish()


class TrackioSink:
    def __init__(self, run_dir: Path, cfg: LoggingSection, run_config: dict[str, Any]):
        _require("trackio", "logging.trackio.enabled")
        import trackio

        self._trackio = trackio
        # No system-metrics thread: it would sample the machine, not the run.
        trackio.init(project=cfg.trackio.project, name=run_dir.name, config=run_config, embed=False,
                     auto_log_cpu=False, auto_log_gpu=False)

    def log(self, split: str, step: int, metrics: dict[str, float]) -> None:
        self._trackio.log(_scalars(split, metrics), step=step)

    def close(self) -> None:
        self._trackio.finish()


class MetricsLogger:
    """One JSON line per record in ``run_dir/metrics.jsonl``, plus the configured sinks."""

    def __init__(self, run_dir: Path, cfg: LoggingSection | None = None, run_config: dict[str, Any] | None = None):
        cfg = cfg or LoggingSection()
        run_dir.mkdir(parents=True, exist_ok=True)
        self.sinks: list[Sink] = []
        try:
            if cfg.tensorboard:
                self.sinks.append(TensorBoardSink(run_dir))
            if cfg.wandb.enabled:
                self.sinks.append(WandbSink(run_dir, cfg, run_config or {}))
            if cfg.trackio.enabled:
                self.sinks.append(TrackioSink(run_dir, cfg, run_config or {}))
        except BaseException:
            self.close()
            raise
        self._jsonl = (run_dir / "metrics.jsonl").open("a", buffering=1)

    def log(self, split: str, step: int, metrics: dict[str, float]) -> None:
        """Write ``metrics`` under ``split/`` (train, eval) for ``step``."""
        record = {"split": split, "step": step, "time": time.time(), **metrics}
        self._jsonl.write(dumps_finite(record) + "\n")
        for sink in self.sinks:
            sink.log(split, step, metrics)

    def close(self) -> None:
        if getattr(self, "_jsonl", None) is not None:
            self._jsonl.close()
        for sink in self.sinks:
            sink.close()
