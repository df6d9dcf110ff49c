"""Normalisation of rewards and advantages: masked whitening, running statistics, clipping."""

from __future__ import annotations

import math
from typing import Literal

import torch

from posttrain.algorithms.advantages import group_relative_advantages

RewardNormalization = Literal["none", "group", "batch", "running"]


def masked_mean_std(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and unbiased (Bessel-corrected) std of the entries where ``mask`` is 1.

    The unbiased std matches group_relative_advantages (and TRL's masked_whiten); with fewer
    than two entries the std is 0.
    """
    mask = mask.float()
    n = mask.sum()
    mean = (values * mask).sum() / n.clamp(min=1.0)
    var = (((values - mean) * mask) ** 2).sum() / (n - 1.0).clamp(min=1.0)
    return mean, var.sqrt()


def whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std with mean and std over the masked entries of the whole tensor.

    Used for REINFORCE++'s global advantage normalisation (Hu 2025, arXiv:2501.03262) and PPO's
    advantage whitening. ``shift_mean=False`` only divides by the std, so the sign of each entry
    is kept. Entries outside the mask come out as 0.
    """
    mean, std = masked_mean_std(values, mask)
    centred = values - mean if shift_mean else values
    return centred / (std + eps) * mask.float()


class RunningMeanStd:
    """Mean and unbiased std of every value seen so far, for normalising rewards across steps.

    Batches are merged with Chan et al.'s parallel update ("Updating formulae and a pairwise
    algorithm for computing sample variances", 1979), so the result does not depend on how the
    values were split into batches. State is plain floats so it is device-independent.
    """

    def __init__(self, eps: float = 1e-8) -> None:
        self.count = 0
        self.mean = 0.0
        self.m2 = 0.0  # sum of squared deviations from the mean
        self.eps = eps

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / (self.count - 1)) if self.count > 1 else 0.0

    def update(self, batch: torch.Tensor) -> None:
        values = batch.detach().double().flatten()
        n = values.numel()
        if n == 0:
            return
        batch_mean = values.mean().item()
        batch_m2 = ((values - batch_mean) ** 2).sum().item()
        total = self.count + n
        delta = batch_mean - self.mean
        self.mean += delta * n / total
        self.m2 += batch_m2 + delta**2 * self.count * n / total
        self.count = total

    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / (self.std + self.eps)


def normalize_rewards(
    rewards: torch.Tensor,
    mode: RewardNormalization,
    group_size: int | None = None,
    running: RunningMeanStd | None = None,
) -> torch.Tensor:
    """Normalise the ``[N]`` rewards of one batch.

    ``none``: unchanged. ``group``: centred and scaled within each group of ``group_size``
    contiguous samples (as group_relative_advantages). ``batch``: centred and scaled over the
    whole batch. ``running``: folds the batch into ``running`` first, then centres and scales
    with the statistics of every reward seen so far.
    """
    rewards = rewards.float()
    if mode == "none":
        return rewards.clone()
    if mode == "group":
        if group_size is None:
            raise ValueError("reward normalisation 'group' needs group_size")
        return group_relative_advantages(rewards, group_size)
    if mode == "batch":
        return whiten(rewards, torch.ones_like(rewards))
    if mode == "running":
        if running is None:
            raise ValueError("reward normalisation 'running' needs a RunningMeanStd")
        running.update(rewards)
        return running.normalise(rewards)
    raise ValueError(f"unknown reward normalisation {mode!r}; expected 'none', 'group', 'batch' or 'running'")


def clip_advantages(advantages: torch.Tensor, limit: float) -> torch.Tensor:
    """Clamp advantages to [-limit, limit], so one outlier reward cannot dominate a batch's update."""
    if limit <= 0:
        raise ValueError(f"advantage clip limit must be positive, got {limit}")
    return advantages.clamp(-limit, limit)
