"""Advantages for self-play, where one policy plays every role of a game.

In a two-player game the roles' returns are not comparable (the first mover of tic-tac-toe wins
far more often), so one baseline for both roles credits an agent for the seat it drew rather than
for how it played. Two role-aware baselines, and the role-blind one for comparison:

- :func:`role_conditioned_advantages`: SPIRAL's moving-average baseline per (game, role).
- :func:`keyed_group_advantages` with keys (task, role): GRPO groups per seed and role.
- :func:`keyed_group_advantages` with keys task: GRPO groups that pool the roles of a seed.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch


def role_conditioned_advantages(
    rewards: torch.Tensor, keys: Sequence[Hashable], baselines: dict[Hashable, float], decay: float = 0.95
) -> tuple[torch.Tensor, dict[Hashable, float]]:
    """Role-conditioned advantage estimation (RAE) of SPIRAL.

    Liu et al. 2025, "SPIRAL: Self-Play on Zero-Sum Games Incentivizes Reasoning via Multi-Agent
    Multi-Turn Reinforcement Learning" (arXiv:2506.24119), section 3.3: a baseline per game G and
    role p, an exponential moving average of that role's returns, updated for each trajectory,
    ``b[G,p] <- decay * b[G,p] + (1 - decay) * R`` and then ``A = R - b[G,p]``. The paper reports
    that without it self-play training collapses (responses shrink, reasoning stops).

    Args:
        rewards: ``[N]`` returns, in the order the trajectories are credited.
        keys: ``N`` keys, one per trajectory, e.g. ``(game, role)``.
        baselines: the running baselines so far (a key not in it starts at 0); not modified.
    Returns:
        ``([N] advantages, updated baselines)``.
    """
    if rewards.ndim != 1 or rewards.numel() != len(keys):
        raise ValueError(f"rewards must be 1-D with one entry per key, got {tuple(rewards.shape)} for {len(keys)} keys")
    if not 0.0 <= decay < 1.0:
        raise ValueError(f"decay must be in [0, 1), got {decay}")
    updated = dict(baselines)
    advantages = torch.empty(rewards.numel(), dtype=torch.float32)
    for i, (reward, key) in enumerate(zip(rewards.tolist(), keys)):
        updated[key] = decay * updated.get(key, 0.0) + (1.0 - decay) * reward
        advantages[i] = reward - updated[key]
    return advantages, updated


def keyed_group_advantages(
    rewards: torch.Tensor, keys: Sequence[Hashable], scale: bool = True, eps: float = 1e-4
) -> torch.Tensor:
    """GRPO's advantage (Shao et al. 2024, arXiv:2402.03300) over groups named by ``keys``.

    Samples with equal keys form a group: A_i = (r_i - mean) / (std + eps), the unbiased std of
    the group, or only the centring with ``scale=False`` (Dr. GRPO). A group of one sample gets 0.
    Keys (task, role) give per-role groups; keys task alone pool the roles of a seed.
    """
    if rewards.ndim != 1 or rewards.numel() != len(keys):
        raise ValueError(f"rewards must be 1-D with one entry per key, got {tuple(rewards.shape)} for {len(keys)} keys")
    rewards = rewards.float()
    advantages = torch.zeros_like(rewards)
    groups: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    for members in groups.values():
        index = torch.tensor(members)
        group = rewards[index]
        if group.numel() < 2:
            continue
        centred = group - group.mean()
        advantages[index] = centred / (group.std() + eps) if scale else centred
    return advantages
