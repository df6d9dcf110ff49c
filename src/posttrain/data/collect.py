"""Sample trajectories with a fixed policy and append them to a store (`posttrain collect`)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from posttrain.config import RunConfig
from posttrain.data.store import TrajectoryStore
from posttrain.envs import EnvError


@dataclass
class CollectResult:
    run_id: str
    trajectories: int
    successes: int
    errors: int
    seconds: float
    first_error: str | None = None  # what the first failed episode said, if any failed


def collect(
    cfg: RunConfig,
    out: str | Path,
    samples_per_task: int,
    num_tasks: int | None = None,
    checkpoint: str | None = None,
    on_append: Callable[[int, int, Path], None] | None = None,
) -> CollectResult:
    """``samples_per_task`` trajectories for each of the first ``num_tasks`` training tasks.

    Sampling uses the rollout section (temperature, max tokens, turns). Each batch of tasks is
    appended as its own part file as soon as it is sampled, so an interrupted collection keeps
    every batch it finished; ``on_append(written, total, part)`` is called after each append
    returns, when the part is durable.
    """
    from posttrain.train.context import RunContext  # the context imports the data package

    with RunContext(cfg, checkpoint=checkpoint) as ctx:
        tasks = ctx.tasks("train")
        tasks = tasks[:num_tasks] if num_tasks else tasks
        if not tasks:
            raise EnvError(f"env {cfg.env.id!r} has no training tasks to collect on")
        params = ctx.sampling()
        store = TrajectoryStore(out)
        run_id = f"collect-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        per_batch = max(1, cfg.rollout.batch_size // samples_per_task)
        start = time.time()
        written = successes = errors = 0
        first_error = None
        total = len(tasks) * samples_per_task
        for i in range(0, len(tasks), per_batch):
            trajectories = ctx.rollout(tasks[i : i + per_batch], params, samples_per_task)
            part = store.append(trajectories, run_id, policy_version=0)
            written += len(trajectories)
            successes += sum(t.correct for t in trajectories)
            errors += sum(t.error is not None for t in trajectories)
            first_error = first_error or next((t.error for t in trajectories if t.error is not None), None)
            if on_append and part is not None:
                on_append(written, total, part)
    return CollectResult(run_id, written, successes, errors, time.time() - start, first_error)
