"""Advantage estimators and losses as pure functions, composed by one :class:`Algorithm` object.

``Algorithm`` (built once from the ``algorithm`` config section) is what the trainers use; the
pure functions below are its pieces, each with its paper in the docstring. Names resolve through
``ADVANTAGE_ESTIMATORS`` (``fn(rewards [N], group_size) -> advantages [N]``) and ``POLICY_LOSSES``
(``fn(logprobs, old_logprobs, advantages, mask, **options) -> (loss, stats)``).
"""

from posttrain.algorithms.advantages import (
    dr_grpo_advantages,
    dynamic_sampling_keep,
    group_relative_advantages,
    overlong_penalty,
    rloo_advantages,
    zero_variance_groups,
)
from posttrain.algorithms.algorithm import (
    ADVANTAGE_ESTIMATORS,
    POLICY_LOSSES,
    Algorithm,
    BatchScorer,
    LossResult,
    Normaliser,
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
from posttrain.algorithms.normalization import (
    RunningMeanStd,
    clip_advantages,
    masked_mean_std,
    normalize_rewards,
    whiten,
)
from posttrain.algorithms.off_policy import logprob_mismatch, truncated_importance_weights
from posttrain.algorithms.role_advantages import keyed_group_advantages, role_conditioned_advantages

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "Algorithm",
    "BatchScorer",
    "FixedKLController",
    "LossResult",
    "Normaliser",
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
    "logprob_mismatch",
    "masked_mean_std",
    "normalize_rewards",
    "outcome_token_rewards",
    "overlong_penalty",
    "reinforce_pp_advantages",
    "reinforce_pp_returns",
    "rloo_advantages",
    "role_conditioned_advantages",
    "truncated_importance_weights",
    "value_loss",
    "whiten",
    "zero_variance_groups",
]
