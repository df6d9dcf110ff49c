"""The online RL loop: sample -> score -> prepare -> update -> log, top to bottom.

The trainer composes the pieces: the :class:`~posttrain.train.context.RunContext` (envs, policy,
backend, logger, evaluation, checkpoints) and the :class:`~posttrain.algorithms.Algorithm`, which
owns every algorithmic decision (what it needs, advantages, the loss, which rows can be skipped).
The policy is in train mode for every update (so gradient checkpointing and LoRA dropout act) and in
eval mode for generation, evaluation and the no-gradient passes.
"""

from __future__ import annotations

import time
import uuid
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

from posttrain.algorithms import Algorithm, Normaliser
from posttrain.algorithms.preference import sft_loss
from posttrain.config import RunConfig
from posttrain.data.demonstrations import load_demonstrations
from posttrain.data.store import TrajectoryStore
from posttrain.envs.contract import step_metrics
from posttrain.eval import EvalResult
from posttrain.models.value import Critic
from posttrain.rewards.composition import RewardComposer
from posttrain.rollout.episodes import raise_if_all_failed
from posttrain.train.async_rollout import AsyncSampler
from posttrain.train.context import ProgressHook, RunContext, TrainResult
from posttrain.train.curriculum import scheduled_max_turns, task_sampler
from posttrain.train.optimizer import adamw, lr_schedule
from posttrain.train.resume import cut_run_dir, load_trainer_state, load_weights, restoring, resume_from
from posttrain.train.stats import RunningStats
from posttrain.train.stopping import RunGuard
from posttrain.types import Batch, Rewards, Task, Trajectory


def optimizer_steps_per_batch(cfg: RunConfig) -> int:
    """How many optimiser steps one sampled batch serves: num_iterations x minibatches."""
    batch = cfg.train.tasks_per_step * cfg.algorithm.group_size
    minibatches = -(-batch // cfg.train.minibatch_size) if cfg.train.minibatch_size else 1
    return cfg.algorithm.num_iterations * minibatches


class Trainer:
    """``resume``: a run directory to continue from its newest complete checkpoint (see train.resume)."""

    def __init__(self, cfg: RunConfig, progress: ProgressHook | None = None, resume: str | Path | None = None):
        checkpoint, cfg = resume_from(resume, cfg)
        self.cfg = cfg
        self.algorithm = Algorithm(cfg.algorithm, max_new_tokens=cfg.rollout.max_new_tokens,
                                   optimizer_steps_per_batch=optimizer_steps_per_batch(cfg))
        self.ctx = RunContext(cfg, progress, need_reference=self.algorithm.needs_reference)
        self.policy = self.ctx.policy
        self.dist = self.ctx.dist  # data parallel: this rank's share of tasks, batch and gradient
        self.train_tasks = self.dist.shard(self.ctx.train_tasks())
        self.tasks_per_step = cfg.train.tasks_per_step // self.dist.world
        self.eval_tasks = self.ctx.tasks("eval")
        self.critic = Critic(self.policy.model, cfg.algorithm.value_model) if self.algorithm.needs_critic else None
        groups = [{"params": self.policy.trainable_parameters()}]
        if self.critic is not None:
            groups.append({"params": list(self.critic.parameters()),
                           "lr": cfg.algorithm.value_learning_rate or cfg.train.learning_rate})
        self.optimizer = adamw(groups, cfg.train.learning_rate, cfg.train.weight_decay, fused=not cfg.train.fsdp)
        self.scheduler = lr_schedule(self.optimizer, cfg.train.warmup_steps,
                                     cfg.train.steps * optimizer_steps_per_batch(cfg), cfg.train.lr_schedule,
                                     cfg.train.min_lr_ratio)
        self.sampling = self.ctx.sampling()
        # The reward hook: trajectories -> composed rewards, step rewards, dense process rewards, metrics.
        self.reward = RewardComposer(cfg.reward)
        self.scored = Rewards(total=[], step_rewards=[], dense=[])  # of the batch sample() last returned
        self.tasks = task_sampler(self.train_tasks, cfg.curriculum, cfg.seed)
        self._max_turns = cfg.rollout.max_turns  # this step's turn limit (curriculum.turns_start schedules it)
        self.step = 0
        self.store = (TrajectoryStore(cfg.store.path or self.ctx.run_dir / "trajectories")
                      if cfg.store.write and self.dist.is_main else None)
        self.run_id = f"{self.ctx.run_dir.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        self.run_ids = [self.run_id]  # every process of this run, resumed ones included (store rows)
        # Demonstrations whose SFT loss is mixed into every update, to keep base abilities.
        self.demonstrations = (load_demonstrations(cfg.sft.demonstrations, self.policy.tokenizer)
                               if cfg.sft.weight > 0 else [])
        self._next_demo = 0
        self.updates = 0  # the policy version: updates made so far
        self.async_sampler: AsyncSampler | None = None  # train.async_steps: started by train()
        self.resumed_from = checkpoint
        if checkpoint is not None:
            self.restore(checkpoint)

    # ----------------------------------------------------------------- the loop

    def train(self) -> TrainResult:
        cfg, ctx = self.cfg, self.ctx
        start = time.time()
        ctx.start_run()
        # A signal, a failing disk or a step without one working episode stops the run, saved first.
        with RunGuard(self.save, lambda: self.step) as guard:
            try:
                before = self.evaluate() if cfg.eval.before_training and self.resumed_from is None else None
                if before is not None:
                    before.raise_if_all_failed("before training")
                if cfg.train.async_steps:
                    self.async_sampler = AsyncSampler(ctx, self._sample_with_scores, cfg.train.steps - self.step,
                                                      cfg.train.async_steps)
                while self.step < cfg.train.steps:
                    guard.check()
                    metrics = self.train_step()  # raises EpisodesFailed before updating if every episode failed
                    self.step += 1
                    ctx.log("train", self.step, metrics)
                    ctx.progress("train", self.step, cfg.train.steps, metrics)
                    if cfg.eval.every and self.step % cfg.eval.every == 0 and self.step < cfg.train.steps:
                        self.evaluate()
                    if ctx.checkpoint_due(self.step):
                        self.save()
                guard.check()
                after = self.evaluate()
                after.raise_if_all_failed(f"after step {self.step}")
                if not ctx.checkpoint_due(self.step):  # the last step's checkpoint, unless just written
                    self.save()
            finally:
                if self.async_sampler is not None:
                    self.async_sampler.close()
                ctx.close()
        result = TrainResult(ctx.run_dir, before, after, self.step, time.time() - start)
        ctx.write_summary({"steps": self.step, "seconds": result.seconds,
                           "before": before.metrics() if before else None, "after": after.metrics()})
        return result

    def evaluate(self) -> EvalResult:
        return self.ctx.evaluate(self.step, self.eval_tasks)

    def save(self):
        extra = {"tasks": self.tasks.state_dict(), "algorithm": self.algorithm.state_dict(),
                 "next_demo": self._next_demo, "run_ids": self.run_ids, "reward": self.reward.state_dict()}
        if self.critic is not None:
            extra["critic"] = self.critic.state_dict()
        return self.ctx.save_checkpoint(self.step, self.optimizer, self.scheduler, extra)

    def restore(self, checkpoint: Path) -> None:
        """Continue exactly where ``checkpoint`` left off; the run directory is cut back to its step (last, so
        that a checkpoint that cannot be restored leaves the run directory as it was)."""
        state = load_trainer_state(checkpoint, ("tasks", "algorithm", "next_demo", "run_ids",
                                                *(("critic",) if self.critic is not None else ())))
        load_weights(self.policy, checkpoint / "model")
        with restoring(checkpoint):
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            self.tasks.load_state_dict(state["tasks"])
            self.algorithm.load_state_dict(state["algorithm"])
            if self.critic is not None:
                self.critic.load_state_dict(state["critic"])
            self.reward.load_state_dict(state.get("reward", {}))
            self._next_demo = int(state["next_demo"])
            self.step = int(state["step"])
            self.run_ids = [*map(str, state["run_ids"]), self.run_id]
            self.ctx.restore_rngs(state)
        cut_run_dir(self.ctx.run_dir, self.step, self.store, set(self.run_ids))

    def train_step(self) -> dict[str, float]:
        """One step: sample groups, score them, let the algorithm prepare the batch, update, report."""
        t0 = time.time()
        with self.dist.full_weights(self.policy.model):  # FSDP: generation and scoring on gathered weights
            trajectories, rewards, metrics = self._next_batch()
            metrics["generation_seconds"] = time.time() - t0  # async: the wait for the sampler
            if trajectories:
                batch = self.batch(trajectories)
                sampled = self.behaviour_logprobs(batch, trajectories)
                # The trainer's own log-probs unless another engine (vLLM), other kernels (bf16 decoding
                # or a training pass under model.autocast) or an older policy (async) sampled.
                own = (self.ctx.backend.same_logprobs_as_trainer and self.policy.autocast_dtype is None
                       and self.async_sampler is None)
                metrics.update(self.algorithm.prepare(batch, rewards, self.scored.step_rewards, self,
                                                      sampled if own else None, None if own else sampled,
                                                      dense=self.scored.dense))
        if trajectories:
            with self.async_sampler.updating() if self.async_sampler else nullcontext():
                metrics.update(self.update(batch))
            self.updates += 1
            t_sync = time.time()
            self.ctx.backend.sync_weights()  # the next rollout samples from the updated policy
            metrics["weight_sync_seconds"] = time.time() - t_sync
            self.algorithm.after_step(metrics, len(trajectories))
        else:
            metrics.update(loss=0.0, grad_norm=0.0, optimizer_steps=0.0)
        metrics["kl_coef"] = self.algorithm.beta
        metrics["step_seconds"] = time.time() - t0
        metrics["tokens_per_second"] = metrics["completion_tokens"] / max(metrics["step_seconds"], 1e-9)
        metrics["learning_rate"] = self.scheduler.get_last_lr()[0]
        return metrics

    # ----------------------------------------------------------------- sample and score

    def sample(self, rollout=None) -> tuple[list[Trajectory], torch.Tensor, dict[str, float]]:
        """Roll out tasks_per_step groups and score them with the reward hook (``reward`` config); when
        the algorithm drops groups without signal (DAPO's dynamic sampling), sample more tasks until the
        batch is full or the rounds run out. Returns the kept trajectories, their shaped rewards and the
        metrics; ``self.scored`` keeps the kept trajectories' step and dense rewards.
        ``rollout(tasks, params, n)`` samples (the asynchronous sampler passes its own)."""
        cfg, algo = self.cfg, self.algorithm
        rollout = rollout or self._rollout
        g = cfg.algorithm.group_size
        kept: list[Trajectory] = []
        kept_rewards: list[torch.Tensor] = []
        kept_scored = Rewards(total=[], step_rewards=[], dense=[])
        reward_stats = RunningStats()
        sampled: list[Trajectory] = []
        flat_count = rounds = 0
        c = cfg.curriculum
        step = self.step + 1  # the step being sampled for (self.step counts finished ones)
        # The turn-limit schedule applies to this process's rollouts (the asynchronous sampler keeps its own).
        self._max_turns = scheduled_max_turns(step, cfg.rollout.max_turns, c.turns_start, c.turns_increase,
                                              c.turns_every)
        while len(kept) < self.tasks_per_step * g and rounds < algo.max_sampling_rounds:
            rounds += 1
            trajectories = rollout(self.tasks.sample(self.tasks_per_step - len(kept) // g), self.sampling, g)
            self.tasks.observe(trajectories)
            sampled += trajectories
            scored = self.reward(trajectories, g)
            for key, value in scored.metrics.items():
                reward_stats.add(key, value, len(trajectories))
            device = self.policy.device
            rewards = algo.shaped_rewards(torch.tensor(scored.total, device=device),
                                          torch.tensor([t.num_sampled_tokens for t in trajectories], device=device))
            flat = algo.flat_groups(rewards)
            flat_count += int(flat.sum())
            for k in range(len(trajectories) // g):
                if algo.drops_flat_groups and flat[k]:
                    continue
                group = slice(k * g, (k + 1) * g)
                kept += trajectories[group]
                kept_rewards.append(rewards[group])
                kept_scored.total += scored.total[group]
                kept_scored.step_rewards += scored.step_rewards[group]
                kept_scored.dense += scored.dense[group]
        everyone = [t for part in self.dist.gather(sampled) for t in part]  # data parallel: all ranks' samples
        if self.store is not None:  # policy version: optimiser steps taken by the sampling policy
            for t in everyone:
                t.metadata["step"] = step
            self.store.append(everyone, self.run_id, policy_version=self.scheduler.last_epoch)
        info = {"sampling_rounds": float(rounds), "zero_variance_groups": flat_count / (len(sampled) // g),
                "max_turns": float(self._max_turns), **self.tasks.metrics()}
        rewards = torch.cat(kept_rewards) if kept_rewards else torch.zeros(0, device=self.policy.device)
        raise_if_all_failed(everyone, f"training step {self.step + 1}")  # nothing to learn from: stop, say why
        self.scored = kept_scored
        return kept, rewards, {**info, **rollout_metrics(everyone), **reward_stats.result()}

    def _sample_with_scores(self, rollout):
        """``sample(rollout)`` and its ``self.scored``, as one item for the asynchronous sampler's queue."""
        return (*self.sample(rollout), self.scored)

    def _next_batch(self) -> tuple[list[Trajectory], torch.Tensor, dict[str, float]]:
        """This step's batch: sampled now, or (train.async_steps) the background sampler's next one."""
        if self.async_sampler is None:
            return self.sample()
        trajectories, rewards, metrics, self.scored = self.async_sampler.next()
        return trajectories, rewards, metrics

    def _rollout(self, tasks: list[Task], params, n: int) -> list[Trajectory]:
        trajectories = self.ctx.rollout(tasks, params, n, self._max_turns)
        for t in trajectories:
            t.policy_version = self.updates
        return trajectories

    def batch(self, trajectories: list[Trajectory]) -> Batch:
        """Padded tensors of the trajectories. A trajectory cut short by an environment failure says
        nothing about the policy's answer: it counts in its group's statistics (as reward 0) but its
        tokens are not trained on."""
        batch = Batch.from_trajectories(trajectories, self.policy.pad_id, self.policy.device)
        failed = torch.tensor([t.error is not None for t in trajectories], device=batch.device)
        batch.loss_mask = batch.loss_mask * (~failed).unsqueeze(-1)
        return batch

    def behaviour_logprobs(self, batch: Batch, trajectories: list[Trajectory]) -> torch.Tensor | None:
        """The sampler's log-probabilities as ``[B, T]``, when they are the policy's own.

        Synchronously the policy has not changed since it sampled, so when it sampled from its own
        distribution (temperature 1, no top-p) these equal a fresh forward pass, which is then not
        needed; with another temperature or top-p they are of another distribution, and this returns
        None. Asynchronously they are the behaviour policy's, for the importance weights.
        """
        if self.sampling.temperature != 1.0 or self.sampling.top_p < 1.0:
            return None
        out = torch.zeros(batch.loss_mask.shape)  # filled on the host, moved once
        for i, t in enumerate(trajectories):
            start = len(t.prompt_ids)
            out[i, start : start + len(t.behaviour_logprobs)] = torch.tensor(t.behaviour_logprobs)
        return out.to(batch.device) * batch.loss_mask

    # ----------------------------------------------------------------- no-gradient passes (BatchScorer)

    @torch.no_grad()
    def _per_microbatch(self, batch: Batch, fn) -> torch.Tensor:
        out = torch.zeros_like(batch.loss_mask)
        size = self.cfg.train.microbatch_size
        for s in range(0, len(batch), size):
            part = batch.select(slice(s, s + size))
            out[s : s + size, : part.input_ids.shape[1]] = fn(part.input_ids, part.attention_mask, part.loss_mask,
                                                              part.prompt_lengths)
        return out

    def logprobs(self, batch: Batch) -> torch.Tensor:
        return self._per_microbatch(batch, lambda *a: self.policy.logprobs(*a)[0])

    def reference_logprobs(self, batch: Batch) -> torch.Tensor:
        return self._per_microbatch(batch, self.policy.reference_logprobs)

    def values(self, batch: Batch) -> torch.Tensor:
        return self._per_microbatch(batch, self.critic.values)

    # ----------------------------------------------------------------- update

    @contextmanager
    def _training_mode(self):
        """Train mode for the update (activation checkpointing and dropout act only then), eval after."""
        modules = [self.policy.model] + ([self.critic] if self.critic is not None else [])
        for m in modules:
            m.train()
        try:
            yield
        finally:
            for m in modules:
                m.eval()

    def update(self, batch: Batch) -> dict[str, float]:
        """num_iterations passes of minibatch updates over one prepared batch."""
        t0 = time.time()
        keep = self.algorithm.trained_rows(batch)
        minibatch = self.cfg.train.minibatch_size // self.dist.world or len(batch)
        stats = RunningStats()
        dist = self.dist  # data parallel: counts are summed over ranks, so every rank takes the same steps
        if dist.sum(keep.numel()):
            active = batch.select(keep)
            # Minibatches are cut from the full batch, so each keeps its own normaliser (the
            # sampled tokens of all its rows, skipped ones included, on every rank).
            owner = keep // minibatch
            with self._training_mode():
                for _ in range(self.cfg.algorithm.num_iterations):
                    for mb_index in range(dist.max(-(-len(batch) // minibatch))):
                        rows = (owner == mb_index).nonzero().squeeze(-1)
                        if dist.sum(rows.numel()) == 0:
                            continue
                        full = batch.loss_mask[mb_index * minibatch : (mb_index + 1) * minibatch]
                        norm = Normaliser(tokens=max(dist.sum(float(full.sum())), 1.0),
                                          sequences=dist.sum(float(full.shape[0])))
                        self._minibatch_step(active.select(rows), norm, stats, pad=batch.select(slice(0, 1)))
        out = stats.result()
        if "loss" in out:
            out["loss"] = dist.sum(out["loss"])  # each rank's share of the global loss
        out.setdefault("loss", 0.0)  # nothing contributed: the loss and gradient are exactly zero
        out.setdefault("grad_norm", 0.0)
        out["optimizer_steps"] = float(stats.count("grad_norm"))
        out["train_seconds"] = time.time() - t0
        return out

    def _forward(self, micro: Batch):
        """Logprobs, entropy and (with a critic) values of one micro-batch."""
        head = self.critic.head if self.critic is not None and self.critic.trunk is None else None
        outputs = self.policy.forward(micro.input_ids, micro.attention_mask, micro.loss_mask, micro.prompt_lengths,
                                      value_head=head, entropy_grad=self.cfg.algorithm.entropy_coef > 0)
        if self.critic is not None and self.critic.trunk is not None:
            values = self.critic.values(micro.input_ids, micro.attention_mask, micro.loss_mask, micro.prompt_lengths)
            outputs = outputs._replace(values=values)
        return outputs

    def _minibatch_step(self, mb: Batch, norm: Normaliser, stats: RunningStats, pad: Batch) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        # Micro-batches keep the batch order, so the samples of one group stay together and
        # share a single forward of their prompt.
        size = self.cfg.train.microbatch_size
        loss_total = 0.0
        # FSDP: every rank runs as many micro-batches (collectives in forward and backward); a rank
        # with fewer pads with a row whose loss counts 0.
        micro_batches = self.dist.max(-(-len(mb) // size)) if self.dist.fsdp else -(-len(mb) // size)
        for s in range(0, micro_batches * size, size):
            micro = mb.select(slice(s, s + size)) if s < len(mb) else pad
            outputs = self._forward(micro)
            result = self.algorithm.loss(outputs, micro, norm)
            (result.loss if s < len(mb) else 0.0 * result.loss).backward()
            if s >= len(mb):
                continue
            loss_total += result.loss.item()
            n = float(micro.loss_mask.sum())
            stats.add("entropy", float((outputs.entropy.detach() * micro.loss_mask).sum()) / max(n, 1.0), n)
            for k, v in result.stats.items():
                stats.add(k, v, n)
        if self.demonstrations:
            sft = self._sft_backward()
            stats.add("sft_loss", sft)
            loss_total += self.cfg.sft.weight * sft
        self.dist.sum_gradients([p for group in self.optimizer.param_groups for p in group["params"]])
        self._clip_gradients(stats)
        self.optimizer.step()
        self.scheduler.step()
        stats.add("loss", loss_total)

    def _clip_gradients(self, stats: RunningStats) -> None:
        """Clip the policy's and the critic's gradients each to train.max_grad_norm, separately: one
        norm over both would let large value-loss gradients shrink every policy step."""
        limit = self.cfg.train.max_grad_norm
        for name, group in zip(("grad_norm", "critic_grad_norm"), self.optimizer.param_groups):
            stats.add(name, self.dist.clip_grad_norm(group["params"], limit))

    def _sft_backward(self) -> float:
        """Backward of sft.weight x the NLL of the next sft.batch_size demonstrations; returns the NLL."""
        n = self.cfg.sft.batch_size
        demos = [self.demonstrations[(self._next_demo + i) % len(self.demonstrations)] for i in range(n)]
        self._next_demo = (self._next_demo + n) % len(self.demonstrations)
        batch = Batch.from_trajectories(demos, self.policy.pad_id, self.policy.device)
        lp, _ = self.policy.logprobs(batch.input_ids, batch.attention_mask, batch.loss_mask, batch.prompt_lengths)
        nll = sft_loss(lp, batch.loss_mask)
        (self.cfg.sft.weight / self.dist.world * nll).backward()  # data parallel: summed over ranks
        return nll.item()


def rollout_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """What the sampled trajectories say about the policy, before any filtering; the env's own
    counters (``info["metrics"]``, see :class:`posttrain.envs.contract.StepInfo`) are summed."""
    n = max(len(trajectories), 1)
    raw = torch.tensor([t.reward for t in trajectories], dtype=torch.float32)
    sampled = sum(t.num_sampled_tokens for t in trajectories)
    out = {
        "samples": float(len(trajectories)),
        "reward_mean": raw.mean().item() if len(raw) else 0.0,
        "reward_std": raw.std().item() if len(raw) > 1 else 0.0,
        "accuracy": sum(t.correct for t in trajectories) / n,
        "completion_tokens": float(sampled),
        "completion_tokens_mean": sampled / n,
        "truncated_fraction": sum(t.finish_reason == "length" for t in trajectories) / n,
        "errors": float(sum(t.error is not None for t in trajectories)),
        "env_timeouts": float(sum(t.error_kind == "timeout" for t in trajectories)),
        "env_workers_lost": float(sum(t.error_kind == "worker_lost" for t in trajectories)),
        "turns_mean": sum(len(t.steps) for t in trajectories) / n,
    }
    for t in trajectories:
        for s in t.steps:
            for key, value in step_metrics(s.info).items():
                out[key] = out.get(key, 0.0) + value
    return out
