"""Policy losses: pure functions from per-token log-probabilities to a scalar loss.

All tensors are ``[B, T]`` and aligned: position t describes token t. ``mask`` is 1 on tokens
the policy sampled and 0 elsewhere (prompt, padding, environment text).
"""

from __future__ import annotations

from typing import Literal

import torch

Aggregation = Literal["token", "sequence"]


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: Aggregation,
    total_tokens: float | None = None,
    total_sequences: float | None = None,
) -> torch.Tensor:
    """Reduce per-token values to a scalar.

    ``token``: sum over every sampled token / number of sampled tokens, so long and short
    sequences weigh each token equally (DAPO, Yu et al. 2025, arXiv:2503.14476, section 3.3).
    ``sequence``: mean over each sequence's tokens, then mean over sequences (the original GRPO
    objective, Shao et al. 2024, eq. 3).

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
    raise ValueError(f"unknown loss aggregation {mode!r}; expected 'token' or 'sequence'")


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate k3 = exp(r) - r - 1, r = log pi_ref - log pi.

    Unbiased and always >= 0 (Schulman 2020, "Approximating KL divergence"); used by GRPO.
    """
    r = ref_logprobs - logprobs
    return torch.exp(r) - r - 1.0


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
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The GRPO objective (Shao et al. 2024, eq. 3): clipped surrogate + beta * k3 KL.

    Returns the scalar loss and detached per-batch statistics: mean KL, clip fractions below
    and above the range (counted only where clipping changes the gradient), ratio min/max.
    """
    per_token, ratio = clipped_surrogate(logprobs, old_logprobs, advantages, epsilon_low, epsilon_high)
    stats: dict[str, torch.Tensor] = {}
    if beta > 0:
        if ref_logprobs is None:
            raise ValueError("beta > 0 needs ref_logprobs")
        kl = k3_kl(logprobs, ref_logprobs)
        per_token = per_token + beta * kl
        stats["kl"] = aggregate(kl.detach(), mask, "token")
    loss = aggregate(per_token, mask, aggregation, total_tokens, total_sequences)
    with torch.no_grad():
        m = mask.bool()
        low = (ratio < 1.0 - epsilon_low) & (advantages < 0) & m
        high = (ratio > 1.0 + epsilon_high) & (advantages > 0) & m
        n = m.sum().clamp(min=1)
        stats["clip_low"] = low.sum() / n
        stats["clip_high"] = high.sum() / n
        sampled = ratio[m]
        stats["ratio_min"] = sampled.min() if sampled.numel() else ratio.new_tensor(1.0)
        stats["ratio_max"] = sampled.max() if sampled.numel() else ratio.new_tensor(1.0)
    return loss, stats
