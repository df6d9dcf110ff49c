"""When the sampler is not the trainer: measuring and correcting the gap between their logprobs.

An inference engine (vLLM) samples with its own kernels, often in another precision, so the
probability it gives a sampled token differs from the trainer's for the same weights. The policy
gradient then uses tokens drawn from pi_sampler as if drawn from pi_trainer: a silent off-policy
error. Yao et al. 2025 ("Your Efficient RL Framework Secretly Brings You Off-Policy RL Training",
Aug 2025) correct it with truncated importance sampling (TIS): every token's policy-gradient term is
weighted by min(pi_trainer(a) / pi_sampler(a), C), with pi_trainer the trainer's probability under
the weights that sampled (the "old" policy) and the cap C bounding the variance. Asynchronous
rollouts (``train.async_steps``) use the same weights against a sampler whose weights are up to K
updates old, pi_trainer then being the weights before this update.
"""

from __future__ import annotations

import torch


def logprob_mismatch(sampler_logprobs: torch.Tensor, trainer_logprobs: torch.Tensor,
                     mask: torch.Tensor) -> torch.Tensor:
    """Mean |log pi_sampler - log pi_trainer| over the sampled tokens (``mask`` = 1); 0 when none."""
    mask = mask.float()
    return ((sampler_logprobs - trainer_logprobs).abs() * mask).sum() / mask.sum().clamp(min=1.0)


def truncated_importance_weights(trainer_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor,
                                 cap: float) -> torch.Tensor:
    """TIS weights min(pi_trainer / pi_sampler, cap) per token, without gradient (Yao et al. 2025).

    ``trainer_logprobs`` are the trainer's logprobs of the sampled tokens under the sampling
    weights (the old policy), ``sampler_logprobs`` the engine's. ``cap`` <= 0 turns the correction
    off (all weights 1). Positions outside the sampled tokens get whatever their inputs give; the
    loss masks them.
    """
    if cap <= 0:
        return torch.ones_like(trainer_logprobs)
    with torch.no_grad():
        return torch.exp(trainer_logprobs - sampler_logprobs).clamp(max=cap)
