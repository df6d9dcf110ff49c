"""The online RL loop: sample tasks -> roll out G completions -> reward -> advantages -> update.

The trainer composes the pieces; the algorithm math lives in ``posttrain.algorithms``.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from posttrain.algorithms import AdaptiveKLController, FixedKLController, RunningMeanStd, kl_estimate, zero_variance_groups
from posttrain.algorithms.objective import (
    loss as algorithm_loss,
    needs_sampling_logprobs,
    shaped_rewards,
    token_advantages,
    uses_critic,
)
from posttrain.algorithms.preference import sft_loss
from posttrain.config import RunConfig
from posttrain.data.demonstrations import load_demonstrations
from posttrain.data.store import TrajectoryStore
from posttrain.envs import EnvError, make_env
from posttrain.eval import EvalResult, evaluate
from posttrain.models import Policy
from posttrain.models.value import Critic
from posttrain.rollout import EnvPool, HFBackend, SamplingParams, run_episodes
from posttrain.train.checkpoint import save_checkpoint
from posttrain.train.metrics import MetricsLogger
from posttrain.train.optimizer import adamw
from posttrain.types import Batch, Task, Trajectory

ProgressHook = Callable[[str, int, int, dict], None]
"""Called as hook(phase, done, total, info) with phase 'train' or 'eval'."""


@dataclass
class TrainResult:
    run_dir: Path
    before: EvalResult | None
    after: EvalResult | None
    steps: int
    seconds: float


class Trainer:
    def __init__(self, cfg: RunConfig, progress: ProgressHook | None = None):
        self.cfg = cfg
        self.progress = progress or (lambda *a: None)
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.run_dir = Path(cfg.output_dir)
        self.envs = EnvPool(lambda: make_env(cfg.env.id, cfg.env.kwargs))
        self.train_tasks = self.envs.tasks("train")
        self.eval_tasks = self.envs.tasks("eval")[: cfg.eval.num_tasks]
        if not self.train_tasks:
            raise EnvError(f"env {cfg.env.id!r} has no training tasks (its tasks('train') is empty)")
        algo = cfg.algorithm
        self.policy = Policy.load(cfg.model, need_reference=algo.beta > 0)
        self.backend = HFBackend(self.policy.model, self.policy.tokenizer, cfg.rollout.batch_size, cfg.seed,
                                 cfg.model.pack_weights)
        self.critic = Critic(self.policy.model, algo.value_model) if uses_critic(algo) else None
        groups = [{"params": self.policy.trainable_parameters()}]
        if self.critic is not None:
            groups.append({"params": list(self.critic.parameters()),
                           "lr": algo.value_learning_rate or cfg.train.learning_rate})
        self.optimizer = adamw(groups, cfg.train.learning_rate, cfg.train.weight_decay)
        self.kl_controller = (
            AdaptiveKLController(algo.beta, algo.kl_target, algo.kl_horizon) if algo.kl_target
            else FixedKLController(algo.beta)
        )
        warmup = cfg.train.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0
        )
        self.sampling = SamplingParams(
            temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
            max_new_tokens=cfg.rollout.max_new_tokens, stop=tuple(cfg.rollout.stop),
        )
        self._task_rng = random.Random(cfg.seed)
        self._task_order: list[int] = []
        self._reward_stats = RunningMeanStd()
        self.step = 0
        # Every sampled trajectory, kept for offline reuse (see posttrain.data.store).
        self.store = TrajectoryStore(cfg.store.path or self.run_dir / "trajectories") if cfg.store.write else None
        self.run_id = f"{self.run_dir.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        # Demonstrations whose SFT loss is mixed into every update, to keep base abilities.
        self.demonstrations = (load_demonstrations(cfg.sft.demonstrations, self.policy.tokenizer)
                               if cfg.sft.weight > 0 else [])
        self._next_demo = 0

    # ----------------------------------------------------------------- loop

    def train(self) -> TrainResult:
        cfg = self.cfg
        start = time.time()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.json").write_text(cfg.model_dump_json(indent=2))
        logger = MetricsLogger(self.run_dir)
        try:
            before = self.evaluate(logger) if cfg.eval.before_training else None
            while self.step < cfg.train.steps:
                self.step += 1
                metrics = self.train_step()
                logger.log("train", self.step, metrics)
                self.progress("train", self.step, cfg.train.steps, metrics)
                if cfg.eval.every and self.step % cfg.eval.every == 0 and self.step < cfg.train.steps:
                    self.evaluate(logger)
                if cfg.train.checkpoint_every and self.step % cfg.train.checkpoint_every == 0:
                    self.save()
            after = self.evaluate(logger)
            if not cfg.train.checkpoint_every or self.step % cfg.train.checkpoint_every:
                self.save()
        finally:
            logger.close()
        result = TrainResult(self.run_dir, before, after, self.step, time.time() - start)
        summary = {
            "steps": self.step, "seconds": result.seconds,
            "before": before.metrics() if before else None, "after": after.metrics(),
        }
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return result

    def evaluate(self, logger: MetricsLogger | None = None) -> EvalResult:
        return evaluate_and_record(self.cfg, self.envs, self.backend, self.policy.tokenizer, self.eval_tasks,
                                   self.step, self.run_dir, self.progress, logger)

    def save(self) -> Path:
        extra = {"task_rng": self._task_rng.getstate(), "task_order": self._task_order,
                 "kl_coef": self.kl_controller.value}
        if self.critic is not None:
            extra["critic"] = self.critic.state_dict()
        return save_checkpoint(self.run_dir, self.step, self.policy, self.optimizer, self.scheduler, extra)

    # ----------------------------------------------------------------- one step

    def _next_tasks(self, n: int) -> list[Task]:
        """Draw tasks without replacement, reshuffling the training split each epoch."""
        picked = []
        for _ in range(n):
            if not self._task_order:
                self._task_order = list(range(len(self.train_tasks)))
                self._task_rng.shuffle(self._task_order)
            picked.append(self.train_tasks[self._task_order.pop()])
        return picked

    def _sample_groups(self) -> tuple[list[Trajectory], torch.Tensor, dict[str, float]]:
        """Roll out tasks_per_step groups; with dynamic sampling (DAPO), keep only groups whose
        rewards differ and sample more tasks until the batch is full or the rounds run out."""
        cfg, algo = self.cfg, self.cfg.algorithm
        g = algo.group_size
        kept: list[Trajectory] = []
        kept_rewards: list[torch.Tensor] = []
        sampled: list[Trajectory] = []
        zero_var = rounds = 0
        max_rounds = algo.max_sampling_rounds if algo.dynamic_sampling else 1
        while len(kept) < cfg.train.tasks_per_step * g and rounds < max_rounds:
            rounds += 1
            tasks = self._next_tasks(cfg.train.tasks_per_step - len(kept) // g)
            trajectories = run_episodes(self.envs, self.backend, self.policy.tokenizer, tasks, self.sampling, g,
                                        cfg.rollout.max_turns, cfg.rollout.max_context_tokens, cfg.env.step_timeout)
            sampled += trajectories
            if self.store is not None:  # policy version: optimiser steps taken by the sampling policy
                self.store.append(trajectories, self.run_id, policy_version=self.scheduler.last_epoch)
            rewards = shaped_rewards(
                algo, torch.tensor([t.reward for t in trajectories]),
                torch.tensor([t.num_sampled_tokens for t in trajectories]), cfg.rollout.max_new_tokens, self._reward_stats,
            )
            flat = zero_variance_groups(rewards, g)
            zero_var += int(flat.sum())
            for k in range(len(tasks)):
                if algo.dynamic_sampling and flat[k]:
                    continue
                kept += trajectories[k * g : (k + 1) * g]
                kept_rewards.append(rewards[k * g : (k + 1) * g])
        info = {"sampling_rounds": float(rounds), "zero_variance_groups": zero_var / (len(sampled) // g)}
        rewards = torch.cat(kept_rewards) if kept_rewards else torch.zeros(0)
        return kept, rewards, {**info, **_rollout_metrics(sampled)}

    def train_step(self) -> dict[str, float]:
        algo = self.cfg.algorithm
        t0 = time.time()
        trajectories, rewards, metrics = self._sample_groups()
        metrics["generation_seconds"] = time.time() - t0
        if trajectories:
            batch = Batch.from_trajectories(trajectories, self.policy.pad_id)
            # A trajectory cut short by an environment failure says nothing about the policy's
            # answer: it counts in its group's statistics (as reward 0) but is not trained on.
            failed = torch.tensor([t.error is not None for t in trajectories])
            batch.loss_mask = batch.loss_mask * (~failed).unsqueeze(-1)
            beta = self.kl_controller.value
            if algo.num_iterations > 1 or needs_sampling_logprobs(algo, beta):
                batch.old_logprobs = self._behaviour_logprobs(batch, trajectories)
            if needs_sampling_logprobs(algo, beta):
                if batch.old_logprobs is None:
                    batch.old_logprobs = self._no_grad_logprobs(batch, reference=False)
                batch.ref_logprobs = self._no_grad_logprobs(batch, reference=True)
                kl = kl_estimate(batch.old_logprobs, batch.ref_logprobs, algo.kl_estimator)
                metrics["kl"] = float((kl * batch.loss_mask).sum() / batch.loss_mask.sum().clamp(min=1))
            if self.critic is not None:
                batch.old_values = self._no_grad_values(batch)
            batch.advantages, batch.returns = token_advantages(
                algo, rewards, batch.loss_mask, beta=beta, logprobs=batch.old_logprobs, ref_logprobs=batch.ref_logprobs,
                values=batch.old_values, step_rewards=[t.step_rewards for t in trajectories],
            )
            metrics.update(self._update(batch))
            if "kl" in metrics:
                self.kl_controller.update(metrics["kl"], len(trajectories))
            metrics["kl_coef"] = self.kl_controller.value
        else:
            metrics.update(loss=0.0, grad_norm=0.0, optimizer_steps=0.0)
        metrics["step_seconds"] = time.time() - t0
        metrics["tokens_per_second"] = metrics["completion_tokens"] / max(metrics["step_seconds"], 1e-9)
        metrics["learning_rate"] = self.scheduler.get_last_lr()[0]
        return metrics

    def _update(self, batch: Batch) -> dict[str, float]:
        """num_iterations passes of minibatch updates over one sampled batch."""
        cfg, algo = self.cfg, self.cfg.algorithm
        t0 = time.time()
        # Rows whose advantage is 0 everywhere add nothing to the clipped surrogate; when there
        # is no KL term they are skipped (their tokens still count in the normaliser, so the
        # gradient is exactly the full batch's).
        if algo.beta == 0 and self.critic is None and not algo.entropy_coef:
            contributing = (batch.advantages.abs() * batch.loss_mask).sum(-1) > 0
        else:
            contributing = batch.loss_mask.sum(-1) > 0
        keep = contributing.nonzero().squeeze(-1)
        minibatch = cfg.train.minibatch_size or len(batch)
        stats = RunningStats()
        if keep.numel():
            active = batch.select(keep)
            if algo.num_iterations > 1 and active.old_logprobs is None:
                active.old_logprobs = self._no_grad_logprobs(active, reference=False)
            if self.kl_controller.value > 0 and not algo.kl_in_reward:
                active.ref_logprobs = self._no_grad_logprobs(active, reference=True)
            # Minibatches are cut from the full batch, so each keeps its own normaliser (the
            # sampled tokens of all its rows, skipped ones included).
            owner = keep // minibatch
            for _ in range(algo.num_iterations):
                for mb_index in range(-(-len(batch) // minibatch)):
                    rows = (owner == mb_index).nonzero().squeeze(-1)
                    if rows.numel() == 0:
                        continue
                    full_rows = slice(mb_index * minibatch, (mb_index + 1) * minibatch)
                    total_tokens = float(batch.loss_mask[full_rows].sum().clamp(min=1))
                    total_sequences = float(batch.loss_mask[full_rows].shape[0])
                    self._minibatch_step(active.select(rows), total_tokens, total_sequences, stats)
        out = stats.result()
        out.setdefault("loss", 0.0)  # nothing contributed: the loss and gradient are exactly zero
        out.setdefault("grad_norm", 0.0)
        out["optimizer_steps"] = float(stats.count("grad_norm"))
        out["train_seconds"] = time.time() - t0
        return out

    def _behaviour_logprobs(self, batch: Batch, trajectories: list[Trajectory]) -> torch.Tensor | None:
        """The sampler's log-probabilities as ``[B, T]``, when they are the policy's own.

        The policy has not changed since it sampled, so when it sampled from its own distribution
        (temperature 1, no top-p) these equal a fresh forward pass, which is then not needed; with
        another temperature or top-p they are of another distribution, and this returns None.
        """
        if self.sampling.temperature != 1.0 or self.sampling.top_p < 1.0:
            return None
        out = torch.zeros_like(batch.loss_mask)
        for i, t in enumerate(trajectories):
            start = len(t.prompt_ids)
            out[i, start : start + len(t.behaviour_logprobs)] = torch.tensor(t.behaviour_logprobs)
        return out * batch.loss_mask

    @torch.no_grad()
    def _no_grad_logprobs(self, batch: Batch, reference: bool) -> torch.Tensor:
        out = torch.zeros_like(batch.loss_mask)
        mb = self.cfg.train.microbatch_size
        fn = self.policy.reference_logprobs if reference else (lambda *a: self.policy.logprobs(*a)[0])
        for s in range(0, len(batch), mb):
            part = batch.select(slice(s, s + mb))
            out[s : s + mb, : part.input_ids.shape[1]] = fn(part.input_ids, part.attention_mask, part.loss_mask,
                                                            part.prompt_lengths)
        return out

    @torch.no_grad()
    def _no_grad_values(self, batch: Batch) -> torch.Tensor:
        out = torch.zeros_like(batch.loss_mask)
        mb = self.cfg.train.microbatch_size
        for s in range(0, len(batch), mb):
            part = batch.select(slice(s, s + mb))
            out[s : s + mb, : part.input_ids.shape[1]] = self.critic.values(
                part.input_ids, part.attention_mask, part.loss_mask, part.prompt_lengths
            )
        return out

    def _forward(self, micro: Batch):
        """Logprobs, entropy and (with a critic) values of one micro-batch."""
        algo = self.cfg.algorithm
        head = self.critic.head if self.critic is not None and self.critic.trunk is None else None
        outputs = self.policy.forward(micro.input_ids, micro.attention_mask, micro.loss_mask, micro.prompt_lengths,
                                      value_head=head, entropy_grad=algo.entropy_coef > 0)
        if self.critic is not None and self.critic.trunk is not None:
            values = self.critic.values(micro.input_ids, micro.attention_mask, micro.loss_mask, micro.prompt_lengths)
            outputs = outputs._replace(values=values)
        return outputs

    def _minibatch_step(self, mb: Batch, total_tokens: float, total_sequences: float, stats: "RunningStats") -> None:
        algo = self.cfg.algorithm
        self.optimizer.zero_grad(set_to_none=True)
        # Micro-batches keep the batch order, so the samples of one group stay together and
        # share a single forward of their prompt.
        size = self.cfg.train.microbatch_size
        loss_total = 0.0
        for s in range(0, len(mb), size):
            micro = mb.select(slice(s, s + size))
            outputs = self._forward(micro)
            loss, loss_stats = algorithm_loss(
                algo, outputs, micro, beta=self.kl_controller.value, total_tokens=total_tokens,
                total_sequences=total_sequences, max_new_tokens=self.cfg.rollout.max_new_tokens,
            )
            loss.backward()
            loss_total += loss.item()
            n = float(micro.loss_mask.sum())
            stats.add("entropy", float((outputs.entropy.detach() * micro.loss_mask).sum()) / max(n, 1.0), n)
            for k, v in loss_stats.items():
                stats.add(k, float(v), n)
        if self.demonstrations:
            sft = self._sft_backward()
            stats.add("sft_loss", sft)
            loss_total += self.cfg.sft.weight * sft
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.train.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        stats.add("loss", loss_total)
        stats.add("grad_norm", float(grad_norm))

    def _sft_backward(self) -> float:
        """Backward of sft.weight x the NLL of the next sft.batch_size demonstrations; returns the NLL."""
        n = self.cfg.sft.batch_size
        demos = [self.demonstrations[(self._next_demo + i) % len(self.demonstrations)] for i in range(n)]
        self._next_demo = (self._next_demo + n) % len(self.demonstrations)
        batch = Batch.from_trajectories(demos, self.policy.pad_id)
        lp, _ = self.policy.logprobs(batch.input_ids, batch.attention_mask, batch.loss_mask, batch.prompt_lengths)
        nll = sft_loss(lp, batch.loss_mask)
        (self.cfg.sft.weight * nll).backward()
        return nll.item()


def evaluate_and_record(cfg: RunConfig, envs: EnvPool, backend: HFBackend, tokenizer, tasks: list[Task], step: int,
                        run_dir: Path, progress: ProgressHook, logger: MetricsLogger | None) -> EvalResult:
    """Held-out evaluation after ``step`` updates, reported to ``progress`` and, with a logger,
    logged and its samples written to ``run_dir/eval_samples``; shared by the online and offline trainers."""
    done = 0

    def tick(n: int) -> None:
        nonlocal done
        done += n
        progress("eval", done, len(tasks), {})

    result = evaluate(envs, backend, tokenizer, tasks, cfg.eval, cfg.rollout, cfg.env.step_timeout, tick)
    progress("eval", len(tasks), len(tasks), {"step": step, **result.metrics()})
    if logger:
        logger.log("eval", step, result.metrics())
        samples = run_dir / "eval_samples" / f"step-{step:06d}.jsonl"
        samples.parent.mkdir(parents=True, exist_ok=True)
        samples.write_text("".join(json.dumps(s) + "\n" for s in result.samples))
    return result


class RunningStats:
    """Weighted means over micro-batches; keys ending in _min/_max keep the extreme instead."""

    def __init__(self) -> None:
        self._sum: dict[str, float] = {}
        self._weight: dict[str, float] = {}
        self._count: dict[str, int] = {}

    def add(self, key: str, value: float, weight: float = 1.0) -> None:
        self._count[key] = self._count.get(key, 0) + 1
        if key.endswith("_min") or key.endswith("_max"):
            pick = min if key.endswith("_min") else max
            self._sum[key] = pick(self._sum.get(key, value), value)
            self._weight[key] = 1.0
            return
        self._sum[key] = self._sum.get(key, 0.0) + value * weight
        self._weight[key] = self._weight.get(key, 0.0) + weight

    def count(self, key: str) -> int:
        return self._count.get(key, 0)

    def result(self) -> dict[str, float]:
        return {k: self._sum[k] / self._weight[k] if self._weight[k] else 0.0 for k in self._sum}


def _rollout_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """What the sampled trajectories say about the policy, before any filtering."""
    n = max(len(trajectories), 1)
    raw = torch.tensor([t.reward for t in trajectories], dtype=torch.float32)
    sampled = sum(t.num_sampled_tokens for t in trajectories)
    return {
        "samples": float(len(trajectories)),
        "reward_mean": raw.mean().item() if len(raw) else 0.0,
        "reward_std": raw.std().item() if len(raw) > 1 else 0.0,
        "accuracy": sum(t.correct for t in trajectories) / n,
        "completion_tokens": float(sampled),
        "completion_tokens_mean": sampled / n,
        "truncated_fraction": sum(t.finish_reason == "length" for t in trajectories) / n,
        "errors": float(sum(t.error is not None for t in trajectories)),
        "env_timeouts": float(sum("TimeoutError" in (t.error or "") for t in trajectories)),
        "turns_mean": sum(len(t.steps) for t in trajectories) / n,
        # Tool environments mark their turns in the step info (see envs/tool_env.py).
        "tool_calls": float(sum("tool" in s.info or s.info.get("malformed_call", False) for t in trajectories
                                for s in t.steps)),
        "malformed_tool_calls": float(sum(bool(s.info.get("malformed_call")) for t in trajectories for s in t.steps)),
        "tool_errors": float(sum(bool(s.info.get("tool_error")) for t in trajectories for s in t.steps)),
    }
