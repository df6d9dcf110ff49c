"""Asynchronous rollouts: sampling for the next K steps overlaps the update (``train.async_steps: K``).

A background thread samples step batches on a snapshot of the policy (its own copy of the model,
its own generation backend and env instances) while the trainer updates the live policy. Staleness
is bounded when work is admitted, as in AReaL (Fu et al. 2025, arXiv:2505.24298): the batch for
step ``b`` (counting from 0) may start only once the trainer has made at least ``b - K`` updates, and
it samples with the newest weights at that moment. Every trajectory carries the version (updates
made) of the weights that sampled it, so the staleness of a step's batch, the trainer's version
minus the batch's, never exceeds K; nothing is dropped for being stale (dropping would bias the
batch towards tasks that are answered fast). The trainer recomputes the old log-probs with its current
weights (the PPO ratio's proximal policy, AReaL's decoupled objective) and weights each token by the
truncated importance weight against the sampler's (see :mod:`posttrain.algorithms.off_policy`).
"""

from __future__ import annotations

import copy
import queue
import threading
from collections.abc import Callable
from contextlib import contextmanager

import torch

from posttrain.rollout import HFBackend, SamplingParams, run_episodes
from posttrain.types import Task, Trajectory

SampleFn = Callable[[Callable[[list[Task], SamplingParams, int], list[Trajectory]]], tuple]
"""Samples one step's batch with the rollout function given: returns (trajectories, rewards, metrics, ...)."""


class AsyncSampler:
    """Produces the batches of ``steps`` training steps in a background thread, at most ``k`` updates ahead."""

    def __init__(self, ctx, sample: SampleFn, steps: int, k: int):
        cfg = ctx.cfg
        self.ctx, self.k, self.steps = ctx, k, steps
        self._sample = sample
        self.snapshot = copy.deepcopy(ctx.policy.model).eval().requires_grad_(False)
        self.backend = HFBackend(self.snapshot, ctx.policy.tokenizer, cfg.rollout.batch_size, cfg.seed + 7919,
                                 cfg.model.pack_weights, decode_dtype=cfg.rollout.decode_dtype)
        self.envs = ctx.make_envs()  # the trainer evaluates with ctx.envs meanwhile
        self.version = 0  # updates the trainer has made
        self._snapshot_version = 0
        self._cond = threading.Condition()
        self._ready: queue.Queue = queue.Queue()
        self._stop = False
        self._thread = threading.Thread(target=self._produce, name="async-rollouts", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the trainer's side

    def next(self) -> tuple:
        """The next step's batch as the sample function returned it (waits for it), with its staleness
        added to the metrics (the third item)."""
        item = self._ready.get()
        if isinstance(item, BaseException):
            raise item
        trajectories, metrics = item[0], item[2]
        staleness = [self.version - t.policy_version for t in trajectories] or [0]
        metrics["staleness_mean"] = sum(staleness) / len(staleness)
        metrics["staleness_max"] = float(max(staleness))
        return item

    def pending(self) -> int:
        """Finished batches waiting for the trainer."""
        return self._ready.qsize()

    @contextmanager
    def updating(self):
        """Hold off weight snapshots while the trainer updates; then publish the new version."""
        with self._cond:
            yield
            self.version += 1
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=600)
        self.envs.close()

    # ------------------------------------------------------------------ the background thread

    def _produce(self) -> None:
        try:
            for b in range(self.steps):
                with self._cond:  # admission: at most k updates behind when this batch starts
                    self._cond.wait_for(lambda: self._stop or self.version >= b - self.k)
                    if self._stop:
                        return
                    if self._snapshot_version != self.version:
                        self._copy_weights()
                self._ready.put(self._sample(self._rollout))
        except BaseException as e:  # noqa: BLE001 - re-raised in the trainer's thread by next()
            self._ready.put(e)

    def _copy_weights(self) -> None:
        with torch.no_grad():
            for dst, src in zip(self.snapshot.parameters(), self.ctx.policy.model.parameters()):
                dst.copy_(src)
        self._snapshot_version = self.version

    def _rollout(self, tasks: list[Task], params: SamplingParams, n: int) -> list[Trajectory]:
        cfg = self.ctx.cfg
        trajectories = run_episodes(self.envs, self.backend, self.ctx.policy.tokenizer, tasks, params, n,
                                    cfg.rollout.max_turns, cfg.rollout.max_context_tokens, cfg.env.step_timeout,
                                    cfg.env.success_reward)
        for t in trajectories:
            t.policy_version = self._snapshot_version
        return trajectories
