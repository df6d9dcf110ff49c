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

from posttrain.data.store import DataError, TrajectoryStore
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

    def section(self, key: str) -> dict[str, Any]:
        """A section of the run's config (``"model"``, ``"env"``, ...), empty where the config has none."""
        return _section(self.config, key)


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
    configured = _section(config, "store").get("path")
    return Path(configured) if configured and isinstance(configured, str) else run_dir / "trajectories"


def with_steps(trajectories: list[Trajectory]) -> list[StoredTrajectory]:
    """Each stored trajectory with the train step that sampled it (``metadata["step"]``, which the
    trainer records; -1 for rows written by ``posttrain collect``)."""
    return [StoredTrajectory(int(t.metadata.get("step", -1)), t) for t in trajectories]


def load_run(run_dir: str | Path) -> RunData:
    """Everything the report shows; FileNotFoundError when ``run_dir`` is not a run directory."""
    run_dir = Path(run_dir)
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        raise FileNotFoundError(f"{run_dir}: not a run directory (expected the metrics.jsonl that "
                                "`posttrain train` writes)")
    config = _json_object(run_dir / "config.json") or {}
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
    trajectories = with_steps(store.trajectories()) if store.files() else []
    summary = _json_object(run_dir / "summary.json")
    return RunData(run_dir, config, train, evals, samples, trajectories, summary, skipped)


def _section(config: dict[str, Any], key: str) -> dict[str, Any]:
    value = config.get(key)
    return value if isinstance(value, dict) else {}


def _json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path`` (None where there is no such file); a :class:`DataError` naming it otherwise."""
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise DataError(f"{path}: not JSON ({str(e)[:200]}); posttrain writes a JSON object there") from None
    if not isinstance(value, dict):
        raise DataError(f"{path}: holds {json.dumps(value)[:60]}, not a JSON object; posttrain writes a JSON object "
                        "there")
    return value
