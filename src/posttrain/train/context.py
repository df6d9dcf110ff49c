"""The run context: what every command sets up from a config, written once.

``posttrain train``, ``dpo``/``sft``, ``collect`` and ``eval`` all need the same things: seeded
RNGs and a thread count, a run directory, a pool of environment instances and its task splits, the
policy, a generation backend, a metrics logger, held-out evaluation and checkpoints. A
:class:`RunContext` holds them; the commands differ only in what they do with them.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from posttrain.config import RunConfig
from posttrain.envs import EnvError, make_env
from posttrain.eval import EvalResult, evaluate
from posttrain.eval.evaluate import merge_results
from posttrain.models import Policy
from posttrain.rollout import (
    EnvPool,
    HFBackend,
    SamplingParams,
    check_backend,
    make_backend,
    run_episodes,
    sampler_dtype,
)
from posttrain.rollout.env_workers import RayEnvPool
from posttrain.rollout.ray_runtime import RayRuntime
from posttrain.rollout.rollout_workers import RolloutWorkers
from posttrain.train.checkpoint import checkpoint_path, save_checkpoint
from posttrain.train.distributed import Distributed
from posttrain.train.metrics import MetricsLogger, dumps_finite
from posttrain.types import Task, Trajectory

ProgressHook = Callable[[str, int, int, dict], None]
"""Called as hook(phase, done, total, info) with phase 'train' or 'eval'."""


@dataclass
class TrainResult:
    run_dir: Path
    before: EvalResult | None
    after: EvalResult | None
    steps: int
    seconds: float


def seed_everything(seed: int, threads: int = 0) -> None:
    """Seed Python's and torch's global RNGs; fix torch's CPU thread count (0 keeps torch's default)."""
    if threads:
        torch.set_num_threads(threads)
    random.seed(seed)
    torch.manual_seed(seed)


class RunContext:
    """Seeding, run directory, env pool and tasks, policy, backend, logger, evaluation, checkpoints.

    ``generation_batch`` is the backend's most sequences per batched call (the rollout's by default);
    ``checkpoint`` loads a saved policy instead of ``model.name``; ``need_reference`` keeps a frozen
    reference model for a KL term.
    """

    def __init__(self, cfg: RunConfig, progress: ProgressHook | None = None, *, need_reference: bool = False,
                 checkpoint: str | None = None, generation_batch: int | None = None):
        self.cfg = cfg
        self.progress: ProgressHook = progress or (lambda *a: None)
        self.dist = Distributed(cfg)
        if not self.dist.is_main:  # one progress display, from rank 0
            self.progress = lambda *a: None
        seed_everything(cfg.seed, cfg.train.threads)
        self.run_dir = Path(cfg.output_dir)
        self.logger: MetricsLogger | None = None
        self.ray = RayRuntime(cfg.ray) if cfg.env.workers or cfg.rollout.workers else None
        self.envs = None
        try:  # Ray's processes must not outlive a run whose setup fails
            self.envs = self.make_envs()
            check_backend(cfg)  # a missing vLLM fails before the model loads
            self.policy = Policy.load(cfg.model, need_reference=need_reference, checkpoint=checkpoint,
                                      sampler_dtype=sampler_dtype(cfg))
            self.policy.model.eval()  # trainers switch to train mode for their updates only
            self.dist.broadcast_parameters(self.policy.model)
            self.dist.shard_model(self.policy.model)
            self.backend = self._make_backend(generation_batch)
        except BaseException:
            self.close()
            raise

    def _make_backend(self, generation_batch: int | None):
        """rollout.workers Ray actors, or the configured engine in this process (HF: seeded per rank)."""
        cfg, batch = self.cfg, generation_batch or self.cfg.rollout.batch_size
        if cfg.rollout.workers:
            return RolloutWorkers(cfg, self.policy, batch)
        if cfg.rollout.backend == "hf":
            pack = self.policy.pack_weights and not cfg.train.fsdp  # packing would copy the gathered weights
            return HFBackend(self.policy.model, self.policy.tokenizer, batch, cfg.seed + self.dist.rank, pack,
                             decode_dtype=cfg.rollout.decode_dtype)
        return make_backend(cfg, self.policy, generation_batch)

    def make_envs(self) -> EnvPool | RayEnvPool:
        """A pool of env instances: in this process, or in env.workers Ray actors."""
        env = self.cfg.env
        if env.workers:
            return RayEnvPool(env.id, env.kwargs, env.workers, env.step_timeout, seed=self.cfg.seed)
        return EnvPool(lambda: make_env(env.id, env.kwargs), seed=self.cfg.seed)

    # ------------------------------------------------------------------ tasks and rollouts

    def tasks(self, split: str) -> list[Task]:
        """The env's tasks of ``split`` (seed tasks for envs without ``tasks()``); eval is cut to eval.num_tasks."""
        env = self.cfg.env
        tasks = self.envs.tasks(split, env.train_seeds, env.eval_seed_start, self.cfg.eval.num_tasks)
        return tasks[: self.cfg.eval.num_tasks] if split == "eval" else tasks

    def train_tasks(self) -> list[Task]:
        tasks = self.tasks("train")
        if not tasks:
            raise EnvError(f"env {self.cfg.env.id!r} has no training tasks (its tasks('train') is empty)")
        return tasks

    def sampling(self) -> SamplingParams:
        """The rollout section's sampling parameters."""
        r = self.cfg.rollout
        return SamplingParams(temperature=r.temperature, top_p=r.top_p, max_new_tokens=r.max_new_tokens,
                              stop=tuple(r.stop))

    def rollout(self, tasks: list[Task], params: SamplingParams, samples_per_task: int,
                max_turns: int | None = None) -> list[Trajectory]:
        """``samples_per_task`` episodes of each task under the config's turn (or ``max_turns``), context
        and time limits."""
        cfg = self.cfg
        return run_episodes(self.envs, self.backend, self.policy.tokenizer, tasks, params, samples_per_task,
                            max_turns or cfg.rollout.max_turns, cfg.rollout.max_context_tokens, cfg.env.step_timeout,
                            cfg.env.success_reward)

    # ------------------------------------------------------------------ the run directory

    def start_run(self) -> MetricsLogger | None:
        """Create the run directory, record the config, open the metrics logger (rank 0 only)."""
        if not self.dist.is_main:
            return None
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.json").write_text(self.cfg.model_dump_json(indent=2))
        self.logger = MetricsLogger(self.run_dir, self.cfg.logging, self.cfg.model_dump(mode="json"))
        return self.logger

    def close(self) -> None:
        """Close the logger, stop env and rollout workers and a Ray this run started (safe to call twice)."""
        if self.logger is not None:
            self.logger.close()
            self.logger = None
        for part in (self.envs, getattr(self, "backend", None)):
            if part is not None and hasattr(part, "close"):
                part.close()
        if self.ray is not None:
            self.ray.close()
        self.dist.close()

    def __enter__(self) -> "RunContext":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def log(self, split: str, step: int, metrics: dict[str, float]) -> None:
        if self.logger is not None:
            self.logger.log(split, step, metrics)

    def evaluate(self, step: int, tasks: list[Task] | None = None,
                 on_progress: Callable[[int], None] | None = None) -> EvalResult:
        """Held-out evaluation after ``step`` updates, reported to the progress hook and, once the run has
        started, logged with its samples written to ``run_dir/eval_samples``."""
        tasks = self.tasks("eval") if tasks is None else tasks
        done = 0

        def tick(n: int) -> None:
            nonlocal done
            done += n
            self.progress("eval", done, len(tasks), {})
            if on_progress:
                on_progress(n)

        cfg = self.cfg
        self.backend.sync_weights()  # an engine with its own copy of the weights gets the latest
        with self.evaluation_sampling(step), self.dist.full_weights(self.policy.model):  # each rank its share, gathered
            share = evaluate(self.envs, self.backend, self.policy.tokenizer, self.dist.shard(tasks), cfg.eval,
                             cfg.rollout, cfg.env.step_timeout, tick, cfg.env.success_reward)
        result = merge_results(self.dist.gather(share))
        self.progress("eval", len(tasks), len(tasks), {"step": step, **result.metrics()})
        if self.logger is not None:
            self.logger.log("eval", step, result.metrics())
            samples = self.run_dir / "eval_samples" / f"step-{step:06d}.jsonl"
            samples.parent.mkdir(parents=True, exist_ok=True)
            samples.write_text("".join(dumps_finite(s) + "\n" for s in result.samples))
        return result

    @contextmanager
    def evaluation_sampling(self, step: int) -> Iterator[None]:
        """Sampled evaluations draw from a generator of their own, seeded by the step: they never shift the
        training samples (so eval settings do not change a run, and a resumed run evaluates as an uninterrupted
        one), and an evaluation at step N is reproducible. HFBackend keeps its sampling RNG in ``generator``; a
        backend without one samples as it does."""
        generator = getattr(self.backend, "generator", None)
        saved = generator.get_state() if isinstance(generator, torch.Generator) else None
        if saved is not None:
            generator.manual_seed(self.cfg.seed * 1_000_003 + step + self.dist.rank)
        try:
            yield
        finally:
            if saved is not None:
                generator.set_state(saved)

    def checkpoint_due(self, step: int) -> bool:
        """Whether ``train.checkpoint_every`` asks for a checkpoint after ``step`` (the trainers also save after
        their last step, where this is False)."""
        every = self.cfg.train.checkpoint_every
        return bool(every) and step % every == 0

    def save_checkpoint(self, step: int, optimizer, scheduler, extra: dict) -> Path:
        """Rank 0 writes it; with FSDP every rank takes part in gathering the weights, and the sharded
        optimiser state is left out (FSDP runs do not resume yet)."""
        # An engine with its own sampling state (vLLM, rollout workers) has no generator to save here.
        generator = getattr(self.backend, "generator", None)
        extra = {**extra, "rng": {"backend": generator.get_state() if generator is not None else None,
                                  "envs": self.envs.rng_states()}}
        full = self.dist.full_state_dict(self.policy.model)
        if self.dist.is_main:
            save_checkpoint(self.run_dir, step, self.policy, None if self.dist.fsdp else optimizer, scheduler, extra,
                            full, self.cfg.model_dump_json(indent=2))
        return checkpoint_path(self.run_dir, step)

    def restore_rngs(self, state: dict) -> None:
        """Python's, torch's, the backend's and every env instance's generators, as a checkpoint saved them."""
        random.setstate(state["python_rng"])
        torch.set_rng_state(state["torch_rng"])
        generator = getattr(self.backend, "generator", None)
        if generator is not None and state["rng"]["backend"] is not None:
            generator.set_state(state["rng"]["backend"])
        self.envs.load_rng_states(state["rng"]["envs"])

    def write_summary(self, summary: dict) -> None:
        if self.dist.is_main:
            (self.run_dir / "summary.json").write_text(dumps_finite(summary, indent=2))
