"""Advantages from dense process rewards: rewards at step ends inside a completion.

A process reward model scores each step of a solution; these functions turn those step rewards,
given as ``(completion token index, reward)`` pairs per row, into per-token advantages.
"""

from __future__ import annotations

import torch

from posttrain.algorithms.advantages import group_relative_advantages


def dense_token_rewards(dense: list[list[tuple[int, float]]], prompt_lengths: torch.Tensor,
                        shape: torch.Size, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, T]`` step rewards at their tokens (batch coordinates: prompt length + completion index),
    and the ``[B, T]`` bool mask of those step-end tokens."""
    rewards, ends = torch.zeros(shape, device=device), torch.zeros(shape, dtype=torch.bool, device=device)
    for b, pairs in enumerate(dense):
        for index, reward in pairs:
            col = int(prompt_lengths[b]) + index
            if col < shape[1]:
                rewards[b, col] += reward
                ends[b, col] = True
    return rewards, ends


def process_supervised_advantages(outcome: torch.Tensor, step_rewards: torch.Tensor, step_ends: torch.Tensor,
                                  mask: torch.Tensor, group_size: int, scale: bool = True,
                                  eps: float = 1e-4) -> torch.Tensor:
    """GRPO with process supervision (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300, 4.1.3), plus the outcome.

    The step rewards of a group's G solutions are normalised together, r~ = (r - mean) / std over
    every step of the group; a token's process advantage is the sum of the normalised rewards of
    the steps ending at or after it (what is still to come). The outcome's group-relative
    advantage (section 4.1.2) is added on every sampled token, so a solution is credited both for
    its result and, step by step, for where it went right or wrong.

    Args:
        outcome: ``[B]`` outcome rewards, the G samples of a task contiguous.
        step_rewards: ``[B, T]`` each step's reward at its last token (:func:`dense_token_rewards`).
        step_ends: ``[B, T]`` True at the steps' last tokens.
        mask: ``[B, T]`` loss mask (1 on sampled tokens).
    Returns:
        ``[B, T]`` advantages, 0 where ``mask`` is 0.
    """
    b, t = mask.shape
    grouped_r, grouped_s = step_rewards.reshape(-1, group_size * t), step_ends.reshape(-1, group_size * t).float()
    count = grouped_s.sum(dim=1, keepdim=True)
    mean = (grouped_r * grouped_s).sum(dim=1, keepdim=True) / count.clamp(min=1)
    normalised = (grouped_r - mean) * grouped_s
    if scale:
        std = ((normalised**2).sum(dim=1, keepdim=True) / (count - 1).clamp(min=1)).sqrt()
        normalised = normalised / (std + eps)
    # Sum over the steps at or after each token: a reversed cumulative sum along the row.
    to_come = normalised.view(b, t).flip(1).cumsum(1).flip(1)
    outcome_adv = group_relative_advantages(outcome, group_size, scale=scale).unsqueeze(-1)
    return (to_come + outcome_adv) * mask.float()
