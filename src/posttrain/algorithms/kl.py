"""KL divergence to a reference policy: per-token estimators and coefficient controllers.

The estimators take log-probabilities of tokens sampled from the policy pi and estimate
KL(pi || pi_ref) per token (Schulman 2020, "Approximating KL divergence",
http://joschu.net/blog/kl-approx.html). With r = pi_ref / pi:

- k1 = -log r: unbiased, high variance, negative on some tokens;
- k2 = (log r)^2 / 2: biased, low variance, always >= 0;
- k3 = (r - 1) - log r: unbiased, low variance, always >= 0.
"""

from __future__ import annotations

from typing import Literal

import torch

KLKind = Literal["k1", "k2", "k3"]


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate k3 = exp(r) - r - 1, r = log pi_ref - log pi.

    Unbiased and always >= 0 (Schulman 2020, "Approximating KL divergence"); used by GRPO.
    """
    r = ref_logprobs - logprobs
    return torch.exp(r) - r - 1.0


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: KLKind = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) of the given ``kind`` (Schulman 2020; see module doc).

    ``logprobs`` are the policy's log-probabilities of its own sampled tokens, ``ref_logprobs``
    the reference model's of the same tokens; any shape, elementwise.
    """
    if kind == "k1":
        return logprobs - ref_logprobs
    if kind == "k2":
        return 0.5 * (logprobs - ref_logprobs) ** 2
    if kind == "k3":
        return k3_kl(logprobs, ref_logprobs)
    raise ValueError(f"unknown KL estimator {kind!r}; expected 'k1', 'k2' or 'k3'")


class FixedKLController:
    """A constant KL coefficient, with the same interface as :class:`AdaptiveKLController`."""

    def __init__(self, coef: float) -> None:
        self.value = coef

    def update(self, current_kl: float, n_steps: int) -> float:
        return self.value


class AdaptiveKLController:
    """Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences" (arXiv:1909.08593),
    section 2.2: a proportional controller that steers the observed KL toward ``target``.

    e = clip(KL / target - 1, -0.2, 0.2);  beta <- beta * (1 + e * n_steps / horizon).
    The clip bounds how fast beta moves on one noisy KL measurement; ``horizon`` (in samples, as
    ``n_steps``) sets how many samples it takes to correct a given relative error.
    """

    def __init__(self, init_coef: float, target: float, horizon: float) -> None:
        if target <= 0 or horizon <= 0:
            raise ValueError("target and horizon must be positive")
        self.value = init_coef
        self.target = target
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> float:
        """Move the coefficient after a batch of ``n_steps`` samples whose mean KL was ``current_kl``."""
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon
        return self.value
