"""One owner for every algorithmic decision: the :class:`Algorithm` object.

Built once from the ``algorithm`` config section, it says what it needs (a critic, a reference
model, old log-probabilities), turns sampled rewards into a prepared batch (shaped rewards, KL,
values, advantages), decides which rows can be skipped without changing the gradient, returns its
loss with diagnostics as a :class:`LossResult`, and owns the state that moves between steps (the
KL controller, running reward statistics). The trainers compose it; they hold no algorithm math and
never branch on an algorithm's name (compare OpenRLHF's experience maker and ART's loss function).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from posttrain.algorithms.advantages import (
    dr_grpo_advantages,
    group_relative_advantages,
    group_relative_turn_advantages,
    overlong_penalty,
    rloo_advantages,
    turn_returns,
    zero_variance_groups,
)
from posttrain.algorithms.gae import gae, outcome_token_rewards, reinforce_pp_advantages, turn_ids, turn_level_gae
from posttrain.algorithms.kl import AdaptiveKLController, FixedKLController, kl_estimate
from posttrain.algorithms.losses import aggregate, explained_variance, grpo_loss, gspo_loss, value_loss
from posttrain.algorithms.normalization import RunningMeanStd, clip_advantages, normalize_rewards, whiten
from posttrain.algorithms.off_policy import logprob_mismatch, truncated_importance_weights
from posttrain.algorithms.process import dense_token_rewards, process_supervised_advantages
from posttrain.config import AlgorithmSection
from posttrain.models.logprobs import TokenOutputs
from posttrain.types import Batch

# Sequence-level estimators, fn(rewards [N], group_size) -> advantages [N], by the name they resolve from.
ADVANTAGE_ESTIMATORS = {
    "grpo": lambda rewards, g: group_relative_advantages(rewards, g, scale=True),
    "dr_grpo": dr_grpo_advantages,
    "rloo": rloo_advantages,
}
# Policy losses over [B, T] tensors: fn(logprobs, old_logprobs, advantages, mask, **options) -> (loss, stats).
POLICY_LOSSES = {"grpo": grpo_loss, "gspo": gspo_loss}


class BatchScorer(Protocol):
    """No-gradient passes the algorithm asks the trainer for; each returns ``[B, T]`` aligned with the batch."""

    def logprobs(self, batch: Batch) -> torch.Tensor: ...

    def reference_logprobs(self, batch: Batch) -> torch.Tensor: ...

    def values(self, batch: Batch) -> torch.Tensor: ...


@dataclass
class LossResult:
    """One micro-batch's loss (with gradient) and its detached diagnostics, by metric name."""

    loss: torch.Tensor
    stats: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Normaliser:
    """What a minibatch's loss is divided by: its sampled tokens and its sequences (skipped rows included)."""

    tokens: float
    sequences: float


class Algorithm:
    """The configured algorithm; see the module docstring.

    ``optimizer_steps_per_batch`` is how many optimiser steps one sampled batch serves
    (``num_iterations`` x minibatches): above 1 the policy moves before the batch is used up, so
    the loss needs the sampling policy's log-probabilities to form its ratio.
    """

    def __init__(self, cfg: AlgorithmSection, *, max_new_tokens: int, optimizer_steps_per_batch: int = 1):
        self.cfg = cfg
        self.max_new_tokens = max_new_tokens
        self.reuses_batch = optimizer_steps_per_batch > 1
        self.kl_controller = (AdaptiveKLController(cfg.beta, cfg.kl_target, cfg.kl_horizon) if cfg.kl_target
                              else FixedKLController(cfg.beta))
        self.reward_stats = RunningMeanStd()
        estimator = "rloo" if cfg.name == "rloo" else ("grpo" if cfg.scale_rewards else "dr_grpo")
        self._estimator = ADVANTAGE_ESTIMATORS[estimator]
        self._policy_loss = POLICY_LOSSES["gspo" if cfg.name == "gspo" else "grpo"]

    # ------------------------------------------------------------------ what it needs

    @property
    def needs_critic(self) -> bool:
        return self.cfg.name == "ppo"

    @property
    def needs_reference(self) -> bool:
        return self.cfg.beta > 0

    @property
    def beta(self) -> float:
        return self.kl_controller.value

    def needs_old_logprobs(self) -> bool:
        """The sampling policy's log-probs are needed: for the ratio when a batch serves several
        optimiser steps, or for the per-token KL in the reward."""
        return self.reuses_batch or (self.cfg.kl_in_reward and self.beta > 0)

    # ------------------------------------------------------------------ sampling decisions

    def shaped_rewards(self, rewards: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Environment rewards plus DAPO's overlong penalty, then the configured normalisation."""
        if self.cfg.overlong_buffer:
            rewards = rewards + overlong_penalty(lengths, self.max_new_tokens, self.cfg.overlong_buffer)
        return normalize_rewards(rewards, self.cfg.reward_normalization, self.cfg.group_size, self.reward_stats)

    def flat_groups(self, rewards: torch.Tensor) -> torch.Tensor:
        """``[num_groups]`` True where all G rewards are equal (no signal for a group baseline)."""
        return zero_variance_groups(rewards, self.cfg.group_size)

    @property
    def drops_flat_groups(self) -> bool:
        """DAPO's dynamic sampling: flat groups are dropped and more tasks sampled to refill the batch."""
        return self.cfg.dynamic_sampling

    @property
    def max_sampling_rounds(self) -> int:
        return self.cfg.max_sampling_rounds if self.cfg.dynamic_sampling else 1

    # ------------------------------------------------------------------ batch preparation

    def prepare(self, batch: Batch, rewards: torch.Tensor, step_rewards: list[list[float]], scorer: BatchScorer,
                behaviour_logprobs: torch.Tensor | None = None,
                sampler_logprobs: torch.Tensor | None = None,
                dense: list[list[tuple[int, float]]] | None = None) -> dict[str, float]:
        """Fill the batch's old/reference log-probs, old values, advantages and returns; return metrics.

        ``behaviour_logprobs`` are the sampler's, when they are the current policy's own (same
        weights, temperature 1); otherwise (None) old log-probs are recomputed when needed.
        ``sampler_logprobs`` are another engine's (vLLM) for the same distribution: the trainer's own
        are then computed as the old log-probs, their gap is logged (``logprob_mismatch``) and, with
        ``tis_cap`` > 0, each token's loss is weighted by truncated importance sampling.
        ``dense`` holds each row's process rewards as ``(completion token index, reward)`` pairs
        (:class:`~posttrain.types.Rewards`), for ``credit == "step"`` and PPO's token-level GAE.
        """
        metrics: dict[str, float] = {}
        if sampler_logprobs is not None and not self.needs_old_logprobs() and self.beta == 0:
            # One on-policy step: the old log-probs are the training pass's own, so the gap and the
            # importance weights are computed there instead of in a pass of their own.
            batch.sampler_logprobs = sampler_logprobs
            sampler_logprobs = None
        if self.needs_old_logprobs() or sampler_logprobs is not None:
            batch.old_logprobs = behaviour_logprobs if behaviour_logprobs is not None else scorer.logprobs(batch)
        if sampler_logprobs is not None:
            metrics["logprob_mismatch"] = float(logprob_mismatch(sampler_logprobs, batch.old_logprobs,
                                                                 batch.loss_mask))
            if self.cfg.tis_cap > 0:
                batch.importance_weights = truncated_importance_weights(batch.old_logprobs, sampler_logprobs,
                                                                        self.cfg.tis_cap)
                sampled = batch.loss_mask.bool()
                metrics["tis_weight_mean"] = float(batch.importance_weights[sampled].mean()) if sampled.any() else 1.0
        if self.beta > 0:
            batch.ref_logprobs = scorer.reference_logprobs(batch)
            current = batch.old_logprobs if batch.old_logprobs is not None else scorer.logprobs(batch)
            kl = kl_estimate(current, batch.ref_logprobs, self.cfg.kl_estimator)
            metrics["kl"] = float((kl * batch.loss_mask).sum() / batch.loss_mask.sum().clamp(min=1))
        if self.needs_critic:
            batch.old_values = scorer.values(batch)
        steps = (dense_token_rewards(dense, batch.prompt_lengths, batch.loss_mask.shape, batch.loss_mask.device)
                 if dense and any(dense) else None)
        batch.advantages, batch.returns = self.advantages(
            rewards, batch.loss_mask, logprobs=batch.old_logprobs, ref_logprobs=batch.ref_logprobs,
            values=batch.old_values, step_rewards=step_rewards, dense=steps)
        return metrics

    def advantages(self, rewards: torch.Tensor, mask: torch.Tensor, *, logprobs: torch.Tensor | None = None,
                   ref_logprobs: torch.Tensor | None = None, values: torch.Tensor | None = None,
                   step_rewards: list[list[float]] | None = None,
                   dense: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``[B, T]`` advantages (and value targets, for PPO) for (shaped) outcome ``rewards`` ``[B]``.

        Group estimators give one advantage per trajectory, spread over its sampled tokens, or with
        ``credit == "turn"`` one per turn from its discounted return. REINFORCE++ and PPO put the
        outcome on the last sampled token and, with ``kl_in_reward``, subtract beta * KL on every
        token; REINFORCE++ whitens the returns over the batch, PPO runs GAE against the critic's
        ``values``, over tokens or (``gae_level == "turn"``) over agent turns, where
        ``step_rewards[b][k]`` is the env's reward after turn k of row b. ``dense`` is ``([B, T]``
        step rewards at their tokens, ``[B, T]`` step-end mask) from a dense process reward: PPO
        adds them to its token rewards, ``credit == "step"`` runs GRPO with process supervision.
        """
        cfg = self.cfg
        returns = None
        kl_beta = self.beta if cfg.kl_in_reward else 0.0
        if cfg.name == "reinforce_pp":
            adv = reinforce_pp_advantages(rewards, mask, logprobs, ref_logprobs, beta=kl_beta)
        elif cfg.name == "ppo" and cfg.gae_level == "turn":
            adv, returns = turn_level_gae(turn_rewards(rewards, mask, step_rewards), values, mask, cfg.gamma, cfg.lam)
        elif cfg.name == "ppo":
            token_rewards = outcome_token_rewards(rewards, mask)
            if dense is not None:
                token_rewards = token_rewards + dense[0] * mask
            if kl_beta > 0:
                token_rewards = token_rewards - kl_beta * kl_estimate(logprobs, ref_logprobs, cfg.kl_estimator) * mask
            adv, returns = gae(token_rewards, values, mask, cfg.gamma, cfg.lam)
        elif cfg.credit == "step":
            step_r, ends = dense if dense is not None else (torch.zeros_like(mask), torch.zeros_like(mask).bool())
            adv = process_supervised_advantages(rewards, step_r, ends, mask, cfg.group_size, scale=cfg.scale_rewards)
        elif cfg.credit == "turn":
            ids = turn_ids(mask)
            num_turns = ids.max(dim=1).values + 1
            returns_k = turn_returns(turn_rewards(rewards, mask, step_rewards), num_turns, cfg.gamma)
            per_turn = group_relative_turn_advantages(returns_k, num_turns, cfg.group_size, scale=cfg.scale_rewards)
            adv = per_turn.gather(1, ids.clamp(min=0)) * (ids >= 0)
        else:
            adv = self._estimator(rewards, cfg.group_size).unsqueeze(-1) * mask.float()
        if cfg.whiten_advantages:
            adv = whiten(adv, mask)
        if cfg.advantage_clip:
            adv = clip_advantages(adv, cfg.advantage_clip)
        return adv, returns

    def trained_rows(self, batch: Batch) -> torch.Tensor:
        """Indices of the rows whose loss has a gradient.

        A row whose advantage is 0 on every token adds nothing to the clipped surrogate; without a
        KL term, critic or entropy bonus its gradient is exactly zero, so it is skipped (its tokens
        still count in the minibatch's :class:`Normaliser`, so the gradient equals the full batch's).
        """
        has_tokens = batch.loss_mask.sum(-1) > 0
        if self.beta == 0 and not self.needs_critic and not self.cfg.entropy_coef:
            has_tokens &= (batch.advantages.abs() * batch.loss_mask).sum(-1) > 0
        return has_tokens.nonzero().squeeze(-1)

    # ------------------------------------------------------------------ the loss

    def loss(self, outputs: TokenOutputs, batch: Batch, norm: Normaliser) -> LossResult:
        """The loss of one micro-batch, normalised by its minibatch's totals.

        Policy term (the clipped surrogate, or GSPO's sequence ratio), plus the KL in the loss when it
        is not in the reward, plus ``value_coef`` x the clipped value loss with a critic, minus
        ``entropy_coef`` x the mean token entropy. Raises when the batch serves several optimiser
        steps but carries no old log-probs: the ratio would silently be 1 and clipping off.
        """
        cfg, mask = self.cfg, batch.loss_mask
        if batch.old_logprobs is None:
            if self.reuses_batch:
                raise ValueError("this batch serves several optimiser steps (num_iterations or minibatches) but "
                                 "carries no old log-probs: the ratio would be 1 and clipping off")
            old = outputs.logprobs.detach()  # on-policy, one step: the ratio is exactly 1
        else:
            old = batch.old_logprobs
        weights, engine_stats = batch.importance_weights, {}
        if batch.sampler_logprobs is not None:  # another engine sampled; see prepare()
            engine_stats["logprob_mismatch"] = logprob_mismatch(batch.sampler_logprobs, old, mask)
            if cfg.tis_cap > 0:
                weights = truncated_importance_weights(old, batch.sampler_logprobs, cfg.tis_cap)
                sampled = mask.bool()
                engine_stats["tis_weight_mean"] = weights[sampled].mean() if sampled.any() else 1.0
        if cfg.name == "gspo":
            total, stats = self._policy_loss(outputs.logprobs, old, batch.advantages, mask,
                                             epsilon_low=cfg.epsilon_low, epsilon_high=cfg.epsilon_high,
                                             total_sequences=norm.sequences, token_weights=weights)
        else:
            total, stats = self._policy_loss(
                outputs.logprobs, old, batch.advantages, mask, epsilon_low=cfg.epsilon_low,
                epsilon_high=cfg.epsilon_high, beta=0.0 if cfg.kl_in_reward else self.beta,
                ref_logprobs=batch.ref_logprobs, kl_kind=cfg.kl_estimator, aggregation=cfg.loss_aggregation,
                total_tokens=norm.tokens, total_sequences=norm.sequences, max_tokens=float(self.max_new_tokens),
                token_weights=weights)
        stats.update(engine_stats)
        if outputs.values is not None:
            old_values = batch.old_values if batch.old_values is not None else outputs.values.detach()
            v_loss = value_loss(outputs.values, old_values, batch.returns, mask, cfg.value_clip or None, norm.tokens)
            total = total + cfg.value_coef * v_loss
            stats["value_loss"] = v_loss.detach()
            stats["explained_variance"] = explained_variance(outputs.values, batch.returns, mask)
        if cfg.entropy_coef:
            total = total - cfg.entropy_coef * aggregate(outputs.entropy, mask, "token", norm.tokens)
        return LossResult(total, {k: float(v) for k, v in stats.items()})

    # ------------------------------------------------------------------ state between steps

    def after_step(self, metrics: dict[str, float], num_samples: int) -> None:
        """Move the KL controller by the step's measured KL."""
        if "kl" in metrics:
            self.kl_controller.update(metrics["kl"], num_samples)

    def state_dict(self) -> dict:
        stats = self.reward_stats
        return {"kl_coef": self.kl_controller.value,
                "reward_stats": {"mean": stats.mean, "m2": stats.m2, "count": stats.count}}

    def load_state_dict(self, state: dict) -> None:
        self.kl_controller.value = state["kl_coef"]
        for key, value in state["reward_stats"].items():
            setattr(self.reward_stats, key, value)


def turn_rewards(rewards: torch.Tensor, mask: torch.Tensor, step_rewards: list[list[float]] | None) -> torch.Tensor:
    """``[B, K]``: each turn's step reward; the last turn's is set so that the row sums to its
    (shaped) reward, which is the return (the sum of step rewards) plus any shaping."""
    turns = (turn_ids(mask).max(dim=1).values + 1).tolist()
    out = torch.zeros(len(turns), max(max(turns), 1))
    totals = rewards.tolist()
    for b, k in enumerate(turns):
        if k == 0:
            continue
        given = (step_rewards[b] if step_rewards else [])[: k - 1]
        out[b, : len(given)] = torch.tensor(given, dtype=torch.float32)
        out[b, k - 1] = totals[b] - sum(given)
    return out.to(mask.device)  # built on the host from Python lists, moved once
