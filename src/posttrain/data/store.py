"""An append-only store of trajectories: a directory of Parquet part files.

Sampling is the expensive part of RL on a CPU, so every trajectory worth keeping is written once
and reused offline (preference pairs, DPO, rejection-sampling fine-tuning). Each ``append`` writes
its trajectories as one new part file: first under a hidden temporary name, flushed and fsynced,
then atomically renamed to ``part-*.parquet`` (and the directory entry fsynced). A process killed
at any instant therefore leaves only complete part files plus, at worst, a hidden temporary one
that readers never list; nothing appended before the crash is touched again.

A row holds the token ids, the loss mask, the sampler's logprobs, the outcome and per-turn
rewards, the task, the run id and the policy version (the optimiser step that sampled it). The
directory reads with Hugging Face ``datasets``:
``load_dataset("parquet", data_files=store.files())``.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from posttrain.types import Step, Task, Trajectory

SCHEMA = pa.schema([
    ("run_id", pa.string()),
    ("policy_version", pa.int64()),
    ("task_id", pa.string()),
    ("task_prompt", pa.string()),
    ("task_answer", pa.string()),  # JSON: answers may be numbers, strings or structures
    ("task_metadata", pa.string()),  # JSON
    ("prompt_ids", pa.list_(pa.int32())),
    ("completion_ids", pa.list_(pa.int32())),
    ("loss_mask", pa.list_(pa.int8())),
    ("behaviour_logprobs", pa.list_(pa.float32())),
    ("reward", pa.float64()),
    ("step_rewards", pa.list_(pa.float64())),
    ("correct", pa.bool_()),
    ("error", pa.string()),
    ("finish_reason", pa.string()),
    ("steps", pa.string()),  # JSON list of {action, observation, reward, terminated, truncated, info}
    ("metadata", pa.string()),  # JSON
])


class DataError(ValueError):
    """Offline data that cannot be used as asked (an empty store, a malformed demonstration); the message says why."""


def _json(value: Any) -> str:
    # Environment info may hold anything; what JSON cannot encode is kept as its repr.
    return json.dumps(value, default=repr)


def trajectory_row(traj: Trajectory, run_id: str, policy_version: int) -> dict[str, Any]:
    """One store row for ``traj``."""
    return {
        "run_id": run_id,
        "policy_version": policy_version,
        "task_id": traj.task.id,
        "task_prompt": traj.task.prompt,
        "task_answer": _json(traj.task.answer),
        "task_metadata": _json(traj.task.metadata),
        "prompt_ids": traj.prompt_ids,
        "completion_ids": traj.completion_ids,
        "loss_mask": traj.loss_mask,
        "behaviour_logprobs": traj.behaviour_logprobs,
        "reward": float(traj.reward),
        "step_rewards": traj.step_rewards,
        "correct": traj.correct,
        "error": traj.error,
        "finish_reason": traj.finish_reason,
        "steps": _json([{"action": s.action, "observation": s.observation, "reward": s.reward,
                         "terminated": s.terminated, "truncated": s.truncated, "info": s.info} for s in traj.steps]),
        "metadata": _json(traj.metadata),
    }


def row_trajectory(row: dict[str, Any]) -> Trajectory:
    """The trajectory a store row was written from; ``metadata`` gains ``run_id`` and ``policy_version``."""
    task = Task(row["task_id"], row["task_prompt"], json.loads(row["task_answer"]), json.loads(row["task_metadata"]))
    steps = [Step(**s) for s in json.loads(row["steps"])]
    metadata = {**json.loads(row["metadata"]), "run_id": row["run_id"], "policy_version": row["policy_version"]}
    return Trajectory(task=task, prompt_ids=list(row["prompt_ids"]), completion_ids=list(row["completion_ids"]),
                      loss_mask=list(row["loss_mask"]), behaviour_logprobs=list(row["behaviour_logprobs"]),
                      steps=steps, reward=row["reward"], error=row["error"], finish_reason=row["finish_reason"],
                      metadata=metadata)


class TrajectoryStore:
    """Append-only Parquet trajectories under ``path`` (created on the first append).

    A part that cannot be read (truncated, empty, not Parquet, another schema, rows that do not
    decode) stops reading with a :class:`DataError` naming it; with ``skip_bad_parts`` it is
    left out instead and listed in ``skipped`` as ``(part, reason)``.
    """

    def __init__(self, path: str | Path, skip_bad_parts: bool = False):
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise DataError(f"trajectory store {self.path} is a file (expected a directory)")
        self.skip_bad_parts = skip_bad_parts
        self.skipped: list[tuple[str, str]] = []

    def files(self) -> list[str]:
        """The finished part files, oldest first (names sort by creation time)."""
        if not self.path.is_dir():
            return []
        return sorted(str(p) for p in self.path.glob("part-*.parquet") if p.is_file())

    def append(self, trajectories: Iterable[Trajectory], run_id: str, policy_version: int = 0) -> Path | None:
        """Write ``trajectories`` as one new part file; durable on disk when this returns."""
        rows = [trajectory_row(t, run_id, policy_version) for t in trajectories]
        if not rows:
            return None
        self.path.mkdir(parents=True, exist_ok=True)
        # Nanosecond time first so that names sort in write order; the uuid keeps concurrent
        # writers (several runs appending to one store) from ever colliding.
        name = f"part-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.parquet"
        final = self.path / name
        tmp = self.path / f".{name}.tmp"
        table = pa.Table.from_pylist(rows, schema=SCHEMA)
        with open(tmp, "wb") as f:
            pq.write_table(table, f)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, final)
        fsync_dir(self.path)
        return final

    def read_table(self) -> pa.Table:
        """Every finished row as one Arrow table (empty with the store's schema if none)."""
        tables = [t for t in map(self._read_part, self.files()) if t is not None]
        return pa.concat_tables(tables) if tables else SCHEMA.empty_table()

    def __iter__(self) -> Iterator[Trajectory]:
        for f in self.files():
            for trajectory in self._part_trajectories(f):
                yield trajectory

    def __len__(self) -> int:
        return sum(t.num_rows for t in map(self._read_part, self.files()) if t is not None)

    def trajectories(self) -> list[Trajectory]:
        return list(self)

    def _read_part(self, part: str) -> pa.Table | None:
        try:
            return pq.read_table(part, schema=SCHEMA)
        except (pa.ArrowException, OSError, ValueError) as e:
            return self._bad_part(part, f"not a readable Parquet part of this store's schema: {_first_line(e)}")

    def _part_trajectories(self, part: str) -> list[Trajectory]:
        """A part's trajectories, all or none: a part with one row that does not decode is bad as a whole."""
        table = self._read_part(part)
        if table is None:
            return []
        try:
            return [row_trajectory(row) for row in table.to_pylist()]
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            return self._bad_part(part, f"a row does not decode as a trajectory: {type(e).__name__}: "
                                        f"{_first_line(e)}") or []

    def _bad_part(self, part: str, reason: str) -> None:
        if not self.skip_bad_parts:
            raise DataError(f"trajectory store part {part}: {reason} (remove the part, or set "
                            "offline.skip_bad_parts=true to train without it)")
        if part not in (p for p, _ in self.skipped):
            self.skipped.append((part, reason))
        return None


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0][:200] if lines else type(error).__name__


def fsync_dir(path: Path) -> None:
    """Make the rename itself durable (POSIX: the directory entry lives in the directory)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
