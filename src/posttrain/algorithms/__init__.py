"""Advantage estimators and policy losses as pure functions, selected by name."""

from posttrain.algorithms.advantages import group_relative_advantages, zero_variance_groups
from posttrain.algorithms.losses import aggregate, clipped_surrogate, grpo_loss, k3_kl

__all__ = [
    "aggregate",
    "clipped_surrogate",
    "group_relative_advantages",
    "grpo_loss",
    "k3_kl",
    "zero_variance_groups",
]
