"""Policy losses: pure functions from per-token log-probabilities to a scalar loss.

All tensors are ``[B, T]`` and aligned: position t describes token t. ``mask`` is 1 on tokens
the policy sampled and 0 elsewhere (prompt, padding, environment text).
"""

from __future__ import annotations

from typing import Literal

import torch

from posttrain.algorithms.kl import KLKind, kl_estimate
from posttrain.algorithms.normalization import masked_mean_std

Aggregation = Literal["token", "sequence", "constant"]


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: Aggregation,
    total_tokens: float | None = None,
    total_sequences: float | None = None,
    max_tokens: float | None = None,
) -> torch.Tensor:
    """Reduce per-token values to a scalar.

    ``token``: sum over every sampled token / number of sampled tokens, so long and short
    sequences weigh each token equally (DAPO, Yu et al. 2025, arXiv:2503.14476, section 3.3).
    ``sequence``: mean over each sequence's tokens, then mean over sequences (the original GRPO
    objective, Shao et al. 2024, eq. 3).
    ``constant``: sum over every sampled token / (``max_tokens`` * number of sequences), with
    ``max_tokens`` the generation budget. Dr. GRPO (Liu et al. 2025, arXiv:2503.20783): a
    denominator that does not depend on the sampled lengths removes the length bias of both
    other modes.

    ``total_tokens`` / ``total_sequences`` replace the counts of this tensor when it is one
    micro-batch of a larger batch, so that micro-batch losses add up to the batch loss.
    """
    mask = mask.float()
    if mode == "token":
        denom = total_tokens if total_tokens is not None else mask.sum().clamp(min=1.0)
        return (values * mask).sum() / denom
    if mode == "sequence":
        per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        denom = total_sequences if total_sequences is not None else float(values.shape[0])
        return per_seq.sum() / denom
    if mode == "constant":
        if max_tokens is None:
            raise ValueError("loss aggregation 'constant' needs max_tokens")
        sequences = total_sequences if total_sequences is not None else float(values.shape[0])
        return (values * mask).sum() / (max_tokens * sequences)
    raise ValueError(f"unknown loss aggregation {mode!r}; expected 'token', 'sequence' or 'constant'")


def clipped_surrogate(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped objective as a per-token loss (Schulman et al. 2017, arXiv:1707.06347).

    loss_t = -min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t), rho_t = pi / pi_old.
    Separate low/high ranges are DAPO's clip-higher (Yu et al. 2025). Returns the loss and
    the ratio.
    """
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high) * advantages
    return -torch.minimum(unclipped, clipped), ratio


def _clip_stats(
    ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, epsilon_low: float, epsilon_high: float
) -> dict[str, torch.Tensor]:
    """Clip fractions below and above the range over sampled tokens (counted only where clipping
    changes the gradient), and the ratio's min/max over sampled tokens."""
    with torch.no_grad():
        m = mask.bool()
        low = (ratio < 1.0 - epsilon_low) & (advantages < 0) & m
        high = (ratio > 1.0 + epsilon_high) & (advantages > 0) & m
        n = m.sum().clamp(min=1)
        sampled = ratio[m]
        return {
            "clip_low": low.sum() / n,
            "clip_high": high.sum() / n,
            "ratio_min": sampled.min() if sampled.numel() else ratio.new_tensor(1.0),
            "ratio_max": sampled.max() if sampled.numel() else ratio.new_tensor(1.0),
        }


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    beta: float = 0.0,
    ref_logprobs: torch.Tensor | None = None,
    aggregation: Aggregation = "token",
    total_tokens: float | None = None,
    total_sequences: float | None = None,
    max_tokens: float | None = None,
    kl_kind: KLKind = "k3",
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The GRPO objective (Shao et al. 2024, eq. 3): clipped surrogate + beta * KL (k3 by default).

    Returns the scalar loss and detached per-batch statistics: mean KL, clip fractions below
    and above the range (counted only where clipping changes the gradient), ratio min/max.
    ``max_tokens`` is only read by the ``constant`` (Dr. GRPO) aggregation. ``token_weights``
    (no gradient) scale each token's surrogate term, not its KL: the truncated importance
    weights of :mod:`posttrain.algorithms.off_policy` when another engine sampled.
    """
    per_token, ratio = clipped_surrogate(logprobs, old_logprobs, advantages, epsilon_low, epsilon_high)
    if token_weights is not None:
        per_token = per_token * token_weights
    stats: dict[str, torch.Tensor] = {}
    if beta > 0:
        if ref_logprobs is None:
            raise ValueError("beta > 0 needs ref_logprobs")
        kl = kl_estimate(logprobs, ref_logprobs, kl_kind)
        per_token = per_token + beta * kl
        stats["kl"] = aggregate(kl.detach(), mask, "token")
    loss = aggregate(per_token, mask, aggregation, total_tokens, total_sequences, max_tokens)
    stats.update(_clip_stats(ratio, advantages, mask, epsilon_low, epsilon_high))
    return loss, stats


def gspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon_low: float = 3e-4,
    epsilon_high: float = 4e-4,
    total_sequences: float | None = None,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Group Sequence Policy Optimization (Zheng et al. 2025, arXiv:2507.18071).

    The importance ratio is per sequence, the geometric mean of its token ratios:
    s_i = exp(mean over sampled tokens of (log pi - log pi_old)); it is clipped to
    [1 - eps_low, 1 + eps_high] (the paper's defaults, 3e-4 and 4e-4: s_i is a mean, so it
    moves far less than token ratios) and the loss is averaged per sequence, then over sequences.

    This is the paper's GSPO-token form: every token's ratio has the value s_i and
    the gradient s_i * grad log pi(token), so ``advantages`` are ``[B, T]`` like grpo_loss's. With
    one advantage per sequence it equals sequence-level GSPO in value and gradient.
    Returns the scalar loss and the statistics of grpo_loss (their ratio is s_i).
    ``token_weights`` scale each token's term, as in :func:`grpo_loss`.
    """
    mask_f = mask.float()
    lengths = mask_f.sum(-1).clamp(min=1.0)
    log_seq_ratio = ((logprobs - old_logprobs) * mask_f).sum(-1) / lengths
    log_ratio = log_seq_ratio.detach().unsqueeze(-1) + logprobs - logprobs.detach()
    per_token, ratio = clipped_surrogate(log_ratio, torch.zeros_like(log_ratio), advantages, epsilon_low, epsilon_high)
    if token_weights is not None:
        per_token = per_token * token_weights
    loss = aggregate(per_token, mask, "sequence", total_sequences=total_sequences)
    return loss, _clip_stats(ratio, advantages, mask, epsilon_low, epsilon_high)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_range: float | None,
    total_tokens: float | None = None,
) -> torch.Tensor:
    """PPO's clipped value loss: not in the PPO paper (Schulman et al. 2017, arXiv:1707.06347) but
    in OpenAI baselines' PPO2, studied by Engstrom et al. 2020 (arXiv:2005.12729).

    0.5 * max((V - R)^2, (V_clip - R)^2), V_clip = V_old + clip(V - V_old, -c, c), averaged over
    the masked steps. Taking the max makes the clip pessimistic: it never lets the value move
    further than ``clip_range`` from its rollout-time estimate to reduce the loss. None disables
    the clip. ``total_tokens`` plays the same role as in :func:`aggregate`.
    """
    error = (values - returns) ** 2
    if clip_range is not None:
        clipped = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
        error = torch.maximum(error, (clipped - returns) ** 2)
    return 0.5 * aggregate(error, mask, "token", total_tokens)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 - Var[R - V] / Var[R] over the masked steps: how much of the returns the critic predicts.

    1 is a perfect critic, 0 no better than a constant, negative worse; NaN when the returns do
    not vary (the ratio is undefined). A diagnostic, computed without gradient.
    """
    with torch.no_grad():
        _, std_returns = masked_mean_std(returns, mask)
        _, std_residual = masked_mean_std(returns - values, mask)
        if std_returns == 0:
            return std_returns.new_tensor(float("nan"))
        return 1.0 - std_residual**2 / std_returns**2
