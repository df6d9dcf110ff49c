"""Advantage estimators: pure functions from rewards to advantages.

The estimators here work on one outcome reward per sample (``[N]``, the G samples of a prompt
contiguous); token- and turn-level estimators (GAE, REINFORCE++) are in ``gae.py``. DAPO's
reward shaping and group filtering sit here too, since they act on the same rewards.
"""

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


def dr_grpo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Dr. GRPO's advantage (Liu et al. 2025, "Understanding R1-Zero-Like Training",
    arXiv:2503.20783): r_i - mean(r) within the group, without GRPO's division by the std.
    """
    return group_relative_advantages(rewards, group_size, scale=False)


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """REINFORCE leave-one-out (Ahmadian et al. 2024, "Back to Basics", arXiv:2402.14740).

    A_i = r_i - mean of the other G - 1 rewards of the group: the baseline does not depend on
    the sample it is subtracted from, so the estimate stays unbiased. Equals
    G / (G - 1) * (r_i - mean(r)).

    Args:
        rewards: ``[N]`` with N a multiple of ``group_size`` >= 2; samples of one prompt contiguous.
    Returns:
        ``[N]`` advantages.
    """
    if group_size < 2 or rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D with a multiple of group_size={group_size} >= 2 entries")
    grouped = rewards.float().view(-1, group_size)
    others_mean = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)
    return (grouped - others_mean).view(-1)


def dynamic_sampling_keep(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """DAPO's dynamic sampling filter (Yu et al. 2025, arXiv:2503.14476, section 3.2).

    ``[N / group_size]`` bools, True for the groups to train on: those whose rewards are not all
    equal. A group with one reward for every sample has zero group-relative advantage, so it
    only shrinks the effective batch; DAPO drops it and samples more prompts instead.
    """
    return ~zero_variance_groups(rewards, group_size)


def overlong_penalty(lengths: torch.Tensor, max_length: int, cache_length: int) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, section 3.4), added to the reward.

    0 while length <= max_length - cache_length, then falls linearly to -1 at ``max_length``,
    and is -1 beyond: a length-aware penalty instead of one that treats every truncated answer
    as wrong, which the paper found adds reward noise.
    """
    if not 0 < cache_length <= max_length:
        raise ValueError(f"need 0 < cache_length <= max_length, got {cache_length} and {max_length}")
    penalty = (max_length - cache_length - lengths.float()) / cache_length
    return penalty.clamp(min=-1.0, max=0.0)


def turn_returns(turn_rewards: torch.Tensor, num_turns: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """``[B, K]`` discounted return from each turn on: G_k = r_k + gamma * G_{k+1}; 0 past a row's last turn.

    ``turn_rewards[b, k]`` is the reward after turn k of row b (step rewards, the outcome in the
    last); ``num_turns[b]`` how many turns row b has.
    """
    k = turn_rewards.shape[1]
    valid = torch.arange(k, device=num_turns.device).unsqueeze(0) < num_turns.unsqueeze(1)
    rewards = turn_rewards.float() * valid
    returns = torch.zeros_like(rewards)
    following = torch.zeros(rewards.shape[0], device=rewards.device)
    for t in reversed(range(k)):
        following = rewards[:, t] + gamma * following
        returns[:, t] = following
    return returns * valid


def group_relative_turn_advantages(
    returns: torch.Tensor, num_turns: torch.Tensor, group_size: int, scale: bool = True, eps: float = 1e-4
) -> torch.Tensor:
    """Per-turn GRPO advantages: each turn's return against the returns of every turn in its group.

    The multi-turn generalisation of :func:`group_relative_advantages`: turn k of a trajectory is
    credited with what followed it (its return from :func:`turn_returns`) rather than with the
    whole episode's outcome, and the baseline is the mean (and, with ``scale``, the std) of the
    returns of all turns of the G samples of the same task. A single-turn group reduces exactly
    to GRPO's advantage. Turn-level credit for LLM agents in this spirit: Zeng et al. 2025,
    "Reinforcing Multi-Turn Reasoning in LLM Agents via Turn-Level Credit Assignment"
    (arXiv:2505.11821).

    Args:
        returns: ``[B, K]`` with the G samples of a task contiguous.
        num_turns: ``[B]`` turns per row.
    Returns:
        ``[B, K]`` advantages, 0 past each row's last turn.
    """
    b, k = returns.shape
    if b % group_size:
        raise ValueError(f"returns must have a multiple of group_size={group_size} rows")
    valid = (torch.arange(k, device=num_turns.device).unsqueeze(0) < num_turns.unsqueeze(1)).float()
    grouped, weights = returns.float().view(-1, group_size * k), valid.view(-1, group_size * k)
    count = weights.sum(dim=1, keepdim=True).clamp(min=1)
    mean = (grouped * weights).sum(dim=1, keepdim=True) / count
    centred = (grouped - mean) * weights
    if scale:
        # Unbiased std over the group's turns, as GRPO's std over its samples.
        std = ((centred**2).sum(dim=1, keepdim=True) / (count - 1).clamp(min=1)).sqrt()
        centred = centred / (std + eps)
    return centred.view(b, k)
