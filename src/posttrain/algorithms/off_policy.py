"""When the sampler is not the trained policy: measuring and correcting the gap between their logprobs.

Two sources of the gap: asynchronous rollouts (``train.async_steps``), where the batch was sampled by
weights up to K updates old, and inference engines that sample with their own kernels. Yao et al.
2025 ("Your Efficient RL Framework Secretly Brings You Off-Policy RL Training") correct it with
truncated importance sampling (TIS): every token's policy-gradient term is weighted by
min(pi_train(a) / pi_behaviour(a), C), with pi_train the trainer's probability under the weights
before this update (the "old", or proximal, policy of the PPO ratio; AReaL's decoupled objective,
Fu et al. 2025) and the cap C bounding the variance.
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

    ``trainer_logprobs`` are the trainer's logprobs of the sampled tokens under the weights before
    the update, ``sampler_logprobs`` the behaviour policy's. ``cap`` <= 0 turns the correction off
    (all weights 1). Positions outside the sampled tokens get whatever their inputs give; the loss
    masks them.
    """
    if cap <= 0:
        return torch.ones_like(trainer_logprobs)
    with torch.no_grad():
        return torch.exp(trainer_logprobs - sampler_logprobs).clamp(max=cap)
