"""Advantage estimators and policy losses as pure functions, selected by name.

The registries hold only interchangeable functions:

- ``ADVANTAGE_ESTIMATORS``: ``fn(rewards [N], group_size) -> advantages [N]``, one outcome
  reward per sample. Token- and turn-level estimators (``gae``, ``reinforce_pp_advantages``)
  need values or masks and are called directly.
- ``POLICY_LOSSES``: ``fn(logprobs, old_logprobs, advantages, mask, **options) -> (loss, stats)``
  over ``[B, T]`` tensors. The keyword options differ (only grpo_loss has a KL term and a choice
  of aggregation; gspo_loss always aggregates per sequence).
"""

from collections.abc import Callable

import torch

from posttrain.algorithms.advantages import (
    dr_grpo_advantages,
    dynamic_sampling_keep,
    group_relative_advantages,
    overlong_penalty,
    rloo_advantages,
    zero_variance_groups,
)
from posttrain.algorithms.gae import (
    discounted_returns,
    gae,
    outcome_token_rewards,
    reinforce_pp_advantages,
    reinforce_pp_returns,
)
from posttrain.algorithms.kl import AdaptiveKLController, FixedKLController, k3_kl, kl_estimate
from posttrain.algorithms.losses import (
    aggregate,
    clipped_surrogate,
    explained_variance,
    grpo_loss,
    gspo_loss,
    value_loss,
)
from posttrain.algorithms.role_advantages import keyed_group_advantages, role_conditioned_advantages
from posttrain.algorithms.normalization import (
    RunningMeanStd,
    clip_advantages,
    masked_mean_std,
    normalize_rewards,
    whiten,
)

ADVANTAGE_ESTIMATORS: dict[str, Callable[[torch.Tensor, int], torch.Tensor]] = {
    "grpo": group_relative_advantages,
    "dr_grpo": dr_grpo_advantages,
    "rloo": rloo_advantages,
}

POLICY_LOSSES: dict[str, Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]] = {
    "grpo": grpo_loss,
    "gspo": gspo_loss,
}

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "FixedKLController",
    "RunningMeanStd",
    "aggregate",
    "clip_advantages",
    "clipped_surrogate",
    "discounted_returns",
    "dr_grpo_advantages",
    "dynamic_sampling_keep",
    "explained_variance",
    "gae",
    "group_relative_advantages",
    "grpo_loss",
    "gspo_loss",
    "k3_kl",
    "keyed_group_advantages",
    "kl_estimate",
    "masked_mean_std",
    "normalize_rewards",
    "outcome_token_rewards",
    "overlong_penalty",
    "reinforce_pp_advantages",
    "reinforce_pp_returns",
    "rloo_advantages",
    "role_conditioned_advantages",
    "value_loss",
    "whiten",
    "zero_variance_groups",
]
