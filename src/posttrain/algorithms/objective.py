"""Compose the pure functions into what one algorithm does: rewards -> advantages -> loss.

The trainer calls these three functions with its config section and never branches on the
algorithm's name itself.
"""

from __future__ import annotations

import torch

from posttrain.algorithms.advantages import (
    group_relative_advantages,
    group_relative_turn_advantages,
    overlong_penalty,
    rloo_advantages,
    turn_returns,
)
from posttrain.algorithms.gae import gae, outcome_token_rewards, reinforce_pp_advantages, turn_ids, turn_level_gae
from posttrain.algorithms.kl import kl_estimate
from posttrain.algorithms.losses import aggregate, explained_variance, grpo_loss, gspo_loss, value_loss
from posttrain.algorithms.normalization import RunningMeanStd, clip_advantages, normalize_rewards, whiten
from posttrain.config import AlgorithmSection
from posttrain.models.logprobs import TokenOutputs
from posttrain.types import Batch


def shaped_rewards(
    cfg: AlgorithmSection,
    rewards: torch.Tensor,
    lengths: torch.Tensor,
    max_new_tokens: int,
    running: RunningMeanStd | None = None,
) -> torch.Tensor:
    """Environment rewards plus DAPO's overlong penalty, then the configured normalisation."""
    if cfg.overlong_buffer:
        rewards = rewards + overlong_penalty(lengths, max_new_tokens, cfg.overlong_buffer)
    return normalize_rewards(rewards, cfg.reward_normalization, cfg.group_size, running)


def uses_critic(cfg: AlgorithmSection) -> bool:
    return cfg.name == "ppo"


def needs_sampling_logprobs(cfg: AlgorithmSection, beta: float) -> bool:
    """True when the advantages need the sampling policy's and the reference's logprobs (KL in the reward)."""
    return cfg.kl_in_reward and beta > 0


def token_advantages(
    cfg: AlgorithmSection,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    *,
    beta: float = 0.0,
    logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    step_rewards: list[list[float]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[B, T]`` advantages (and value targets, for PPO) for outcome ``rewards`` ``[B]``.

    Group-based estimators give one advantage per trajectory, spread over its sampled tokens.
    REINFORCE++ and PPO put the outcome reward on the last sampled token and, with
    ``cfg.kl_in_reward``, subtract beta * KL on every token; REINFORCE++ then whitens the
    returns over the batch, PPO runs GAE against the critic's ``values``, over tokens or, with
    ``cfg.gae_level == "turn"``, over agent turns (``step_rewards[b][k]`` is the environment's
    reward after turn k of row b; the last turn gets the outcome reward instead). Turn-level
    GAE has no per-token KL in the reward: its KL belongs in the loss. With ``cfg.credit ==
    "turn"`` the group estimators give each turn its own advantage from its discounted return.
    """
    returns = None
    kl_beta = beta if cfg.kl_in_reward else 0.0
    if cfg.name == "reinforce_pp":
        advantages = reinforce_pp_advantages(rewards, mask, logprobs, ref_logprobs, beta=kl_beta)
    elif cfg.name == "ppo" and cfg.gae_level == "turn":
        advantages, returns = turn_level_gae(_turn_rewards(rewards, mask, step_rewards), values, mask, cfg.gamma,
                                             cfg.lam)
    elif cfg.name == "ppo":
        token_rewards = outcome_token_rewards(rewards, mask)
        if kl_beta > 0:
            token_rewards = token_rewards - kl_beta * kl_estimate(logprobs, ref_logprobs, cfg.kl_estimator) * mask
        advantages, returns = gae(token_rewards, values, mask, cfg.gamma, cfg.lam)
    elif cfg.credit == "turn":
        ids = turn_ids(mask)
        num_turns = ids.max(dim=1).values + 1
        returns_k = turn_returns(_turn_rewards(rewards, mask, step_rewards), num_turns, cfg.gamma)
        per_turn = group_relative_turn_advantages(returns_k, num_turns, cfg.group_size, scale=cfg.scale_rewards)
        advantages = per_turn.gather(1, ids.clamp(min=0)) * (ids >= 0)
    elif cfg.name == "rloo":
        advantages = rloo_advantages(rewards, cfg.group_size).unsqueeze(-1) * mask.float()
    else:
        per_sequence = group_relative_advantages(rewards, cfg.group_size, scale=cfg.scale_rewards)
        advantages = per_sequence.unsqueeze(-1) * mask.float()
    if cfg.whiten_advantages:
        advantages = whiten(advantages, mask)
    if cfg.advantage_clip:
        advantages = clip_advantages(advantages, cfg.advantage_clip)
    return advantages, returns


def _turn_rewards(rewards: torch.Tensor, mask: torch.Tensor, step_rewards: list[list[float]] | None) -> torch.Tensor:
    """``[B, K]``: each turn's step reward; the last turn's is set so that the row sums to its
    (shaped) reward, which is the return (the sum of step rewards) plus any shaping."""
    turns = (turn_ids(mask).max(dim=1).values + 1).tolist()
    out = torch.zeros(len(turns), max(max(turns), 1))
    for b, k in enumerate(turns):
        if k == 0:
            continue
        given = (step_rewards[b] if step_rewards else [])[: k - 1]
        out[b, : len(given)] = torch.tensor(given, dtype=torch.float32)
        out[b, k - 1] = rewards[b] - sum(given)
    return out


def loss(
    cfg: AlgorithmSection,
    outputs: TokenOutputs,
    batch: Batch,
    *,
    beta: float,
    total_tokens: float,
    total_sequences: float,
    max_new_tokens: int,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The algorithm's loss for one micro-batch, normalised by the totals of its minibatch.

    Policy term (GRPO-style clipped surrogate, or GSPO's sequence ratio), plus the KL in the
    loss when it is not in the reward, plus ``value_coef`` x the clipped value loss when the
    algorithm has a critic, minus ``entropy_coef`` x the mean token entropy.
    """
    mask = batch.loss_mask
    old = batch.old_logprobs if batch.old_logprobs is not None else outputs.logprobs.detach()
    if cfg.name == "gspo":
        total, stats = gspo_loss(outputs.logprobs, old, batch.advantages, mask, epsilon_low=cfg.epsilon_low,
                                 epsilon_high=cfg.epsilon_high, total_sequences=total_sequences)
    else:
        total, stats = grpo_loss(
            outputs.logprobs, old, batch.advantages, mask,
            epsilon_low=cfg.epsilon_low, epsilon_high=cfg.epsilon_high,
            beta=0.0 if cfg.kl_in_reward else beta, ref_logprobs=batch.ref_logprobs, kl_kind=cfg.kl_estimator,
            aggregation=cfg.loss_aggregation, total_tokens=total_tokens, total_sequences=total_sequences,
            max_tokens=float(max_new_tokens),
        )
    if outputs.values is not None:
        old_values = batch.old_values if batch.old_values is not None else outputs.values.detach()
        v_loss = value_loss(outputs.values, old_values, batch.returns, mask, cfg.value_clip or None, total_tokens)
        total = total + cfg.value_coef * v_loss
        stats["value_loss"] = v_loss.detach()
        stats["explained_variance"] = explained_variance(outputs.values, batch.returns, mask)
    if cfg.entropy_coef:
        total = total - cfg.entropy_coef * aggregate(outputs.entropy, mask, "token", total_tokens)
    return total, stats
