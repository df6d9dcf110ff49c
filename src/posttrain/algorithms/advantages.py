"""Advantage estimators: pure functions from rewards to advantages."""

from __future__ import annotations

import torch


def group_relative_advantages(
    rewards: torch.Tensor, group_size: int, scale: bool = True, eps: float = 1e-4
) -> torch.Tensor:
    """GRPO's advantage: each reward minus its group's mean, divided by the group's std.

    Shao et al. 2024, "DeepSeekMath" (arXiv:2402.03300), section 4.1.2: A_i = (r_i - mean(r)) /
    std(r) over the G samples of one prompt. ``scale=False`` keeps only the centring, as in
    Dr. GRPO (Liu et al. 2025, arXiv:2503.20783), which removes the std's difficulty bias.
    The std is the unbiased sample std and ``eps`` guards groups whose rewards are all equal
    (their advantages are 0), matching TRL's GRPOTrainer.

    Args:
        rewards: ``[N]`` with N a multiple of ``group_size``; samples of one prompt are contiguous.
    Returns:
        ``[N]`` advantages.
    """
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D with a multiple of group_size={group_size} entries")
    grouped = rewards.float().view(-1, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale:
        centred = centred / (grouped.std(dim=1, keepdim=True) + eps)
    return centred.view(-1)


def zero_variance_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[N / group_size]`` bools: groups whose samples all got the same reward (no signal)."""
    grouped = rewards.float().view(-1, group_size)
    return (grouped.max(dim=1).values - grouped.min(dim=1).values) == 0
