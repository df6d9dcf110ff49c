"""Reading a run directory back: its config, metrics, held-out samples and stored trajectories.

What ``posttrain train`` leaves in ``output_dir``: ``config.json``, ``metrics.jsonl`` (one record
per train step and per evaluation), ``eval_samples/step-*.jsonl`` (every held-out episode of each
evaluation), ``summary.json``, ``checkpoints/`` and, with ``store.write``, the trajectory store.
A run killed mid-write may leave a partial last line in metrics.jsonl; it is skipped and counted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posttrain.data.store import TrajectoryStore
from posttrain.types import Trajectory


@dataclass
class StoredTrajectory:
    """A training trajectory from the store with the train step that sampled it."""

    step: int
    trajectory: Trajectory


@dataclass
class RunData:
    run_dir: Path
    config: dict[str, Any]
    train: list[dict[str, Any]]
    evals: list[dict[str, Any]]
    eval_samples: dict[int, list[dict[str, Any]]]  # eval step -> eval_samples rows
    trajectories: list[StoredTrajectory] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    skipped_lines: int = 0

    @property
    def name(self) -> str:
        return self.run_dir.resolve().name


def _read_jsonl(path: Path) -> tuple[list[dict[str, Any]], int]:
    rows, bad = [], 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(value, dict):
            rows.append(value)
        else:
            bad += 1
    return rows, bad


def store_path(run_dir: Path, config: dict[str, Any]) -> Path:
    """Where the run's trajectory store is (``store.path``, or ``<run>/trajectories``)."""
    configured = (config.get("store") or {}).get("path") or ""
    return Path(configured) if configured else run_dir / "trajectories"


def assign_steps(trajectories: list[Trajectory], train: list[dict[str, Any]]) -> list[StoredTrajectory]:
    """The train step of each stored trajectory, in store order.

    The trainer records ``metadata["step"]``; stores written before it did are matched by
    order instead: step s appended ``samples`` trajectories (its train record), the steps
    appending in turn.
    """
    if all("step" in t.metadata for t in trajectories):
        return [StoredTrajectory(int(t.metadata["step"]), t) for t in trajectories]
    out, i = [], 0
    for record in sorted(train, key=lambda r: r["step"]):
        n = int(record.get("samples", 0))
        out += [StoredTrajectory(int(record["step"]), t) for t in trajectories[i : i + n]]
        i += n
    last = max((r["step"] for r in train), default=0)
    out += [StoredTrajectory(last + 1, t) for t in trajectories[i:]]  # a step cut short before its record
    return out


def load_run(run_dir: str | Path) -> RunData:
    """Everything the report shows; FileNotFoundError when ``run_dir`` is not a run directory."""
    run_dir = Path(run_dir)
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        raise FileNotFoundError(f"{run_dir}: not a run directory (expected the metrics.jsonl that "
                                "`posttrain train` writes)")
    config_file = run_dir / "config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    records, skipped = _read_jsonl(metrics)
    train = [r for r in records if r.get("split") == "train" and isinstance(r.get("step"), int)]
    evals = [r for r in records if r.get("split") == "eval" and isinstance(r.get("step"), int)]
    samples: dict[int, list[dict[str, Any]]] = {}
    for path in sorted((run_dir / "eval_samples").glob("step-*.jsonl")):
        rows, bad = _read_jsonl(path)
        skipped += bad
        try:
            samples[int(path.stem.removeprefix("step-"))] = rows
        except ValueError:
            continue
    store = TrajectoryStore(store_path(run_dir, config))
    trajectories = assign_steps(store.trajectories(), train) if store.files() else []
    summary_file = run_dir / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else None
    return RunData(run_dir, config, train, evals, samples, trajectories, summary, skipped)
