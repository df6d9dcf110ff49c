"""Offline training on stored data: DPO, IPO, cDPO, KTO, rejection-sampling fine-tuning, SFT.

No sampling during training: the data is read once (preference pairs or labelled trajectories
from a trajectory store, or demonstrations), the reference log-probabilities are computed once
before the first update (by the policy itself, which is the reference until it is trained, so
no second copy of the model is kept), then ``offline.epochs`` passes of minibatch updates run.
Held-out accuracy is measured before and after, as in online training.

``--resume`` continues from the newest checkpoint exactly, as online training does: the checkpoint
also holds the reference log-probabilities (the policy has moved since they were computed) and a
digest of the training examples, so that a store or demonstrations file changed since the run began
is refused rather than trained on under another run's reference and batch order.

Sequence log-probabilities are sums over the agent's tokens only (loss mask 1), computed by
:func:`posttrain.models.logprobs.policy_forward`: the chosen and rejected answers to one prompt
share a single forward of that prompt, and only agent tokens go through the LM head.
"""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from posttrain.algorithms.preference import dpo_loss, ipo_loss, kto_kl_estimate, kto_loss, sft_loss
from posttrain.config import ConfigError, RunConfig
from posttrain.data.demonstrations import load_demonstrations
from posttrain.data.pairs import PreferencePair, preference_pairs, split_by_success
from posttrain.data.store import DataError, TrajectoryStore
from posttrain.eval import EvalResult
from posttrain.models import Policy
from posttrain.train.context import ProgressHook, RunContext, TrainResult
from posttrain.train.epochs import epoch_batches, examples_digest
from posttrain.train.optimizer import adamw, lr_schedule
from posttrain.train.resume import (
    check_examples,
    cut_run_dir,
    load_trainer_state,
    load_weights,
    restoring,
    resume_from,
)
from posttrain.train.stats import RunningStats
from posttrain.train.stopping import RunGuard
from posttrain.types import Batch, Trajectory

PAIRED = ("dpo", "ipo", "cdpo")


@dataclass
class SequenceLogps:
    """Per-sequence sums of agent-token log-probabilities ``[N]`` and agent-token counts ``[N]``."""

    logps: torch.Tensor
    tokens: torch.Tensor


def sequence_logps(policy: Policy, trajectories: list[Trajectory]) -> SequenceLogps:
    """Sum of log p(token) over each trajectory's agent tokens (gradient flows if enabled)."""
    batch = Batch.from_trajectories(trajectories, policy.pad_id)
    lp, _ = policy.logprobs(batch.input_ids, batch.attention_mask, batch.loss_mask, batch.prompt_lengths)
    return SequenceLogps((lp * batch.loss_mask).sum(-1), batch.loss_mask.sum(-1))


def mismatched(trajectories: list[Trajectory], seed: int) -> list[Trajectory]:
    """For KTO's KL estimate: each prompt with the completion of another example (a fixed random cycle)."""
    order = list(range(len(trajectories)))
    random.Random(seed).shuffle(order)
    partner = {order[k]: order[(k + 1) % len(order)] for k in range(len(order))}
    out = []
    for i, t in enumerate(trajectories):
        o = trajectories[partner[i]]
        out.append(Trajectory(task=t.task, prompt_ids=t.prompt_ids, completion_ids=o.completion_ids,
                              loss_mask=o.loss_mask, behaviour_logprobs=o.behaviour_logprobs))
    return out


class OfflineTrainer:
    """``cfg.offline.method`` on the data it names; see the module docstring. ``resume``: a run directory to
    continue from its newest complete checkpoint (see train.resume)."""

    def __init__(self, cfg: RunConfig, progress: ProgressHook | None = None, resume: str | Path | None = None):
        checkpoint, cfg = resume_from(resume, cfg)
        self.cfg = cfg
        self.off = cfg.offline
        self.ctx = RunContext(cfg, progress, generation_batch=cfg.eval.batch_size)
        self.policy = self.ctx.policy
        self.eval_tasks = self.ctx.tasks("eval")
        self.skipped_parts: list[tuple[str, str]] = []  # (store part, why it was left out)
        self.examples, self.labels = self._load_examples()
        self.examples_digest = examples_digest(self._rows(list(range(len(self.examples)))),
                                               None if self.labels is None else self.labels.tolist())
        self.optimizer = adamw(self.policy.trainable_parameters(), self.off.learning_rate, cfg.train.weight_decay)
        total = self.off.epochs * -(-len(self.examples) // self.off.batch_size)
        self.scheduler = lr_schedule(self.optimizer, cfg.train.warmup_steps, total, cfg.train.lr_schedule,
                                     cfg.train.min_lr_ratio)
        self.reference: dict[str, torch.Tensor] = {}
        # KTO: the sequences of its KL estimate
        self._mismatched = mismatched(self.examples, cfg.seed) if self.off.method == "kto" else []
        self.step = 0
        self.resumed_from = checkpoint
        if checkpoint is not None:
            self.restore(checkpoint)

    # ----------------------------------------------------------------- data

    def _load_examples(self) -> tuple[list, torch.Tensor | None]:
        """Pairs (DPO family), or trajectories with success labels (KTO), or SFT targets."""
        off = self.off
        if off.method == "sft":
            if not self.cfg.sft.demonstrations:
                raise ConfigError("offline.method=sft trains on demonstrations: set sft.demonstrations to a JSONL file")
            return load_demonstrations(self.cfg.sft.demonstrations, self.policy.tokenizer), None
        if not off.store:
            raise ConfigError(f"offline.method={off.method} reads a trajectory store: set offline.store")
        store = TrajectoryStore(off.store, skip_bad_parts=off.skip_bad_parts)
        trajectories = store.trajectories()
        self.skipped_parts = store.skipped
        if not trajectories:
            raise DataError(f"trajectory store {off.store} holds no readable trajectories (write one with "
                            "`posttrain collect`)")
        self._check_held_out(trajectories)
        if off.method in PAIRED:
            pairs = preference_pairs(trajectories, off.min_reward_gap, off.max_pairs_per_task)
            if not pairs:
                raise DataError(f"trajectory store {off.store}: no preference pairs (no task has samples with "
                                "different rewards)")
            return pairs, None
        successes, failures = split_by_success(trajectories, off.success_threshold)
        if off.method == "rft":
            if not successes:
                raise DataError(f"trajectory store {off.store}: no trajectory reaches offline.success_threshold "
                                f"({off.success_threshold})")
            return successes, None
        labels = torch.tensor([True] * len(successes) + [False] * len(failures))
        return successes + failures, labels

    def _check_held_out(self, trajectories: list[Trajectory]) -> None:
        """Refuse a store that holds tasks of the held-out split this config evaluates on: trained on, they
        would raise the accuracy reported after training (a store collected under other env settings, such
        as another ``num_eval``, can hold them)."""
        held_out = {task.id for task in self.eval_tasks}
        leaked = sorted({t.task.id for t in trajectories} & held_out)
        if leaked:
            raise DataError(
                f"trajectory store {self.off.store} holds {len(leaked)} of the {len(held_out)} held-out tasks this "
                f"config evaluates on (for example {leaked[0]!r}); training on them would inflate the evaluation. "
                "Expected a store of training tasks only: collect it with this config (`posttrain collect`) or "
                "change the held-out split (env.kwargs, eval.num_tasks)")

    def _rows(self, items: list[int]) -> list[Trajectory]:
        """The sequences one group of examples needs: chosen then rejected answers for pairs."""
        if self.off.method in PAIRED:
            pairs: list[PreferencePair] = [self.examples[i] for i in items]
            return [p.chosen for p in pairs] + [p.rejected for p in pairs]
        return [self.examples[i] for i in items]

    @torch.no_grad()
    def precompute_reference(self) -> None:
        """Reference log-probabilities of every sequence, once, before the policy moves."""
        if self.off.method in ("sft", "rft"):
            return
        mb = self.off.microbatch_size
        logps = []
        for s in range(0, len(self.examples), mb):
            items = list(range(s, min(s + mb, len(self.examples))))
            logps.append(sequence_logps(self.policy, self._rows(items)))
        if self.off.method in PAIRED:
            self.reference["chosen"] = torch.cat([x.logps[: len(x.logps) // 2] for x in logps])
            self.reference["rejected"] = torch.cat([x.logps[len(x.logps) // 2 :] for x in logps])
        else:
            self.reference["logps"] = torch.cat([x.logps for x in logps])
            self.reference["mismatched"] = torch.cat([
                sequence_logps(self.policy, self._mismatched[s : s + mb]).logps
                for s in range(0, len(self._mismatched), mb)
            ])

    # ----------------------------------------------------------------- loop

    def train(self) -> TrainResult:
        cfg, off, ctx = self.cfg, self.off, self.ctx
        start = time.time()
        ctx.start_run()
        with RunGuard(self.save, lambda: self.step) as guard:  # a signal or a failing disk: save, then stop
            try:
                before = self.evaluate() if cfg.eval.before_training and self.resumed_from is None else None
                if self.resumed_from is None:
                    t0 = time.time()
                    self.precompute_reference()
                    ctx.log("train", 0, {"examples": float(len(self.examples)),
                                         "reference_seconds": time.time() - t0})
                elif not self.reference:  # saved on a signal before it was computed: the weights are the start's
                    self.precompute_reference()
                total = off.epochs * -(-len(self.examples) // off.batch_size)
                # The order is drawn from the seed, so a resumed run draws the batches it has done and skips them.
                batches = epoch_batches(len(self.examples), off.batch_size, off.epochs, random.Random(cfg.seed))
                for epoch, batch in itertools.islice(batches, self.step, None):
                    guard.check()
                    metrics = self.train_step(batch)
                    self.step += 1
                    metrics["epoch"] = float(epoch + 1)
                    ctx.log("train", self.step, metrics)
                    ctx.progress("train", self.step, total, metrics)
                    if ctx.checkpoint_due(self.step):
                        self.save()
                guard.check()
                after = self.evaluate()
                if not ctx.checkpoint_due(self.step):  # the last step's checkpoint, unless just written
                    self.save()
            finally:
                ctx.close()
        result = TrainResult(ctx.run_dir, before, after, self.step, time.time() - start)
        ctx.write_summary({"method": off.method, "examples": len(self.examples), "steps": self.step,
                           "seconds": result.seconds, "before": before.metrics() if before else None,
                           "after": after.metrics()})
        return result

    def evaluate(self) -> EvalResult:
        return self.ctx.evaluate(self.step, self.eval_tasks)

    def save(self) -> Path:
        return self.ctx.save_checkpoint(self.step, self.optimizer, self.scheduler,
                                        {"method": self.off.method, "reference": self.reference,
                                         "examples": [len(self.examples), self.examples_digest]})

    def restore(self, checkpoint: Path) -> None:
        """Continue exactly where ``checkpoint`` left off; the run directory is cut back to its step (last, so
        that a checkpoint that cannot be restored leaves the run directory as it was)."""
        state = load_trainer_state(checkpoint, ("reference", "examples"))
        source = f"sft.demonstrations ({self.cfg.sft.demonstrations})" if self.off.method == "sft" \
            else f"offline.store ({self.off.store})"
        check_examples(checkpoint, state["examples"], len(self.examples), self.examples_digest, source)
        load_weights(self.policy, checkpoint / "model")
        with restoring(checkpoint):
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            self.reference = {key: value.clone() for key, value in state["reference"].items()}
            self.step = int(state["step"])
            self.ctx.restore_rngs(state)
        cut_run_dir(self.ctx.run_dir, self.step, None, set())

    # ----------------------------------------------------------------- one step

    def train_step(self, items: list[int]) -> dict[str, float]:
        """One optimiser step on the examples ``items``, in micro-batches."""
        t0 = time.time()
        kl = self._kto_reference_point(items) if self.off.method == "kto" else None
        self.policy.model.train()  # for the update only: dropout and activation checkpointing act
        self.optimizer.zero_grad(set_to_none=True)
        stats = RunningStats()
        rows = self._rows(items)
        if self.off.method in PAIRED:  # RPO's likelihood term is a mean over the chosen answers' tokens
            rows = rows[: len(items)]
        tokens = float(sum(t.num_sampled_tokens for t in rows))
        loss_total = 0.0
        for s in range(0, len(items), self.off.microbatch_size):
            micro = items[s : s + self.off.microbatch_size]
            loss = self._micro_loss(micro, len(items), tokens, kl, stats)
            loss.backward()
            loss_total += loss.item()
        self.policy.model.eval()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.trainable_parameters(), self.cfg.train.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        out = stats.result()
        out.update(loss=loss_total, grad_norm=float(grad_norm), step_seconds=time.time() - t0,
                   learning_rate=self.scheduler.get_last_lr()[0])
        if kl is not None:
            out["kl"] = float(kl)
        return out

    @torch.no_grad()
    def _kto_reference_point(self, items: list[int]) -> torch.Tensor:
        policy = sequence_logps(self.policy, [self._mismatched[i] for i in items]).logps
        return kto_kl_estimate(policy, self.reference["mismatched"][items])

    def _micro_loss(self, micro: list[int], batch_examples: int, batch_tokens: float, kl, stats: RunningStats):
        """One micro-batch's loss, scaled so that a step's micro-batches add up; ``batch_tokens`` counts the
        agent tokens of the step's SFT targets, or of its chosen answers for the DPO family (RPO's NLL)."""
        off = self.off
        seq = sequence_logps(self.policy, self._rows(micro))
        idx = torch.tensor(micro)
        if off.method in PAIRED:
            n = len(micro)
            chosen, rejected = seq.logps[:n], seq.logps[n:]
            ref_c, ref_r = self.reference["chosen"][idx], self.reference["rejected"][idx]
            if off.method == "ipo":
                losses = ipo_loss(chosen, rejected, ref_c, ref_r, seq.tokens[:n], seq.tokens[n:], off.beta)
            else:
                smoothing = off.label_smoothing if off.method == "cdpo" else 0.0
                losses = dpo_loss(chosen, rejected, ref_c, ref_r, off.beta, smoothing)
            with torch.no_grad():
                margin = off.beta * ((chosen - ref_c) - (rejected - ref_r))
                stats.add("reward_accuracy", float((margin > 0).float().mean()), n)
                stats.add("reward_margin", float(margin.mean()), n)
                stats.add("chosen_logratio", float((chosen - ref_c).mean()), n)
                stats.add("rejected_logratio", float((rejected - ref_r).mean()), n)
            loss = losses.sum() / batch_examples
            if off.rpo_alpha:
                nll = sft_loss(chosen, torch.ones_like(chosen), total_tokens=batch_tokens)
                micro_tokens = float(seq.tokens[:n].sum())
                stats.add("chosen_nll_per_token", nll.item() * batch_tokens / max(micro_tokens, 1.0), micro_tokens)
                loss = loss + off.rpo_alpha * nll
            return loss
        if off.method == "kto":
            losses = kto_loss(seq.logps, self.reference["logps"][idx], self.labels[idx], kl, off.beta,
                              off.kto_desirable_weight, off.kto_undesirable_weight)
            with torch.no_grad():
                stats.add("logratio", float((seq.logps - self.reference["logps"][idx]).mean()), len(micro))
            return losses.sum() / batch_examples
        loss = sft_loss(seq.logps, torch.ones_like(seq.logps), total_tokens=batch_tokens)
        stats.add("nll_per_token", loss.item() * batch_tokens / float(seq.tokens.sum().clamp(min=1)),
                  float(seq.tokens.sum()))
        return loss
