"""Returns and advantages over sequences of steps: GAE and REINFORCE++.

A "step" is one position of a ``[B, N]`` tensor whose 0/1 ``mask`` marks the steps the policy
took. Steps are tokens (N = T, mask = the loss mask) for token-level PPO, or turns (N = K, mask =
the turns a trajectory has) for per-turn credit assignment; the same functions serve both.
Positions where the mask is 0 (padding, prompt or environment tokens between two turns) are not
steps: they are skipped, so the step after position t is the next masked position in its row.
Their rewards and values are ignored and their outputs are 0.
"""

from __future__ import annotations

import torch

from posttrain.algorithms.kl import kl_estimate
from posttrain.algorithms.normalization import whiten


@torch.no_grad()
def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
    last_values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016, arXiv:1506.02438, eq. 16).

    delta_t = r_t + gamma * V(s_{t+1}) - V(s_t);  A_t = sum_l (gamma * lam)^l delta_{t+l};
    returns R_t = A_t + V(s_t) are the value-function targets (the TD(lambda) return).

    The value after a row's last step is ``last_values`` (``[B]``): None means every row ended
    in a terminal state (value 0); a row that was truncated bootstraps from V of the state it
    stopped in. For a batch mixing both, pass ``last_values`` with 0 on the terminated rows.

    Args:
        rewards, values, mask: ``[B, N]``; the reward of a step is the one received after it.
    Returns:
        ``(advantages, returns)``, both ``[B, N]``, 0 where ``mask`` is 0; no gradient flows.
    """
    step = mask.bool()
    rewards, values = rewards.float(), values.float()
    next_value = torch.zeros_like(values[:, 0]) if last_values is None else last_values.float()
    next_advantage = torch.zeros_like(next_value)
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        # Non-steps carry the next step's value and advantage through to the step before them.
        next_value = torch.where(step[:, t], values[:, t], next_value)
        next_advantage = torch.where(step[:, t], advantage, next_advantage)
        advantages[:, t] = torch.where(step[:, t], advantage, 0.0)
    returns = (advantages + values) * step
    return advantages, returns


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Reward-to-go R_t = sum_l gamma^l r_{t+l} over the masked steps of each ``[B, N]`` row.

    This is GAE with lam = 1 and V = 0, which makes A_t the Monte-Carlo return.
    """
    return gae(rewards, torch.zeros_like(rewards, dtype=torch.float), mask, gamma, 1.0)[1]


def outcome_token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Place each row's outcome reward (``[B]``) on its last sampled token of the ``[B, T]`` mask.

    Rows without a sampled token get no reward.
    """
    positions = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    last = (mask.float() * positions).argmax(dim=1)
    out = torch.zeros(mask.shape, dtype=torch.float, device=mask.device)
    out[torch.arange(mask.shape[0], device=mask.device), last] = rewards.float()
    return out * mask.float()


@torch.no_grad()
def reinforce_pp_returns(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    *,
    beta: float = 0.0,
    gamma: float = 1.0,
) -> torch.Tensor:
    """REINFORCE++'s token returns (Hu 2025, arXiv:2501.03262, section 3).

    The per-token reward is the outcome reward (``[B]``) on the last sampled token minus
    beta * k1 KL(pi || pi_ref) on every sampled token (the KL is a reward penalty, not a loss
    term); returns are its discounted reward-to-go. ``[B, T]`` in and out.
    """
    token_rewards = outcome_token_rewards(rewards, mask)
    if beta > 0:
        if logprobs is None or ref_logprobs is None:
            raise ValueError("beta > 0 needs logprobs and ref_logprobs")
        token_rewards = token_rewards - beta * kl_estimate(logprobs, ref_logprobs, "k1") * mask.float()
    return discounted_returns(token_rewards, mask, gamma)


def reinforce_pp_advantages(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    *,
    beta: float = 0.0,
    gamma: float = 1.0,
) -> torch.Tensor:
    """REINFORCE++ advantages (Hu 2025, arXiv:2501.03262): the token returns of
    :func:`reinforce_pp_returns`, whitened over every sampled token of the batch.

    The batch mean is the baseline: no critic and no per-prompt group are needed.
    """
    returns = reinforce_pp_returns(rewards, mask, logprobs, ref_logprobs, beta=beta, gamma=gamma)
    return whiten(returns, mask)


def turn_ids(mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` index of the agent turn each sampled token belongs to, -1 elsewhere.

    A turn is a maximal run of sampled tokens (mask 1): in a multi-turn trajectory the
    environment's tokens (mask 0) separate one turn of the agent from the next.
    """
    sampled = mask.bool()
    before = torch.zeros_like(sampled)
    before[:, 1:] = sampled[:, :-1]
    ids = (sampled & ~before).long().cumsum(dim=1) - 1
    return torch.where(sampled, ids, torch.full_like(ids, -1))


@torch.no_grad()
def turn_level_gae(
    turn_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE with turns as the steps (Schulman et al. 2016), spread back over each turn's tokens.

    The value of a turn is the critic's value at its first token (the state in which the turn
    began); ``turn_rewards`` ``[B, K]`` holds the reward after each turn (step rewards, then the
    outcome on the last turn). Every token of turn k gets the turn's advantage and return, so
    credit is assigned per action of the agent rather than per token (as in multi-turn agent RL,
    e.g. ArCHer, Zhou et al. 2024, arXiv:2402.19446).

    Returns:
        ``(advantages, returns)``, ``[B, T]``, 0 outside ``mask``.
    """
    ids = turn_ids(mask)
    turns = int(ids.max().item()) + 1 if ids.numel() else 0
    b = mask.shape[0]
    turn_values = torch.zeros(b, max(turns, 1), device=mask.device)
    turn_mask = torch.zeros(b, max(turns, 1), device=mask.device)
    first = (ids >= 0) & (torch.cat([torch.full_like(ids[:, :1], -1), ids[:, :-1]], dim=1) != ids)
    rows, cols = first.nonzero(as_tuple=True)
    turn_values[rows, ids[rows, cols]] = values[rows, cols].float()
    turn_mask[rows, ids[rows, cols]] = 1.0
    advantages, returns = gae(turn_rewards[:, : turn_values.shape[1]], turn_values, turn_mask, gamma, lam)
    index = ids.clamp(min=0)
    sampled = ids >= 0
    return advantages.gather(1, index) * sampled, returns.gather(1, index) * sampled
