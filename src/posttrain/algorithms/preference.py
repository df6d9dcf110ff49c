"""Offline preference losses: pure functions of sequence log-probabilities.

Every ``*_logps`` argument is ``[N]``: the sum of a sequence's token log-probabilities over the
tokens the agent produced (loss mask 1), under the policy being trained or under the frozen
reference. ``logratio = policy_logps - ref_logps`` is the implicit reward divided by beta.
Each function returns per-example losses; the caller averages them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def dpo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Direct Preference Optimization with the sigmoid (Bradley-Terry) loss.

    Rafailov et al. 2023, "Direct Preference Optimization: Your Language Model is Secretly a
    Reward Model" (arXiv:2305.18290), eq. 7:
        loss = -log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))

    With ``label_smoothing`` = epsilon > 0 this is conservative DPO (cDPO; Mitchell 2023, "A note
    on DPO with noisy preferences and relationship to IPO"): each label is assumed flipped with
    probability epsilon, so the target is a mix of both orderings,
        loss = -(1 - eps) log sigmoid(beta * delta) - eps log sigmoid(-beta * delta),
    whose optimum is a finite margin instead of an ever-growing one.
    """
    delta = (chosen_logps - ref_chosen_logps) - (rejected_logps - ref_rejected_logps)
    loss = -F.logsigmoid(beta * delta)
    if label_smoothing:
        loss = (1.0 - label_smoothing) * loss - label_smoothing * F.logsigmoid(-beta * delta)
    return loss


def ipo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    chosen_tokens: torch.Tensor,
    rejected_tokens: torch.Tensor,
    tau: float,
) -> torch.Tensor:
    """Identity Preference Optimisation (Azar et al. 2023, "A General Theoretical Paradigm to
    Understand Learning from Human Preferences", arXiv:2310.12036, eq. 17).

    A squared loss that regresses the log-ratio margin onto 1 / (2 tau) rather than pushing it
    to infinity, so it does not overfit deterministic preferences:
        loss = (h - 1 / (2 tau))^2,  h = (pi_c - ref_c) / |y_c| - (pi_r - ref_r) / |y_r|.
    Each log-ratio is divided by its sequence's agent-token count ``*_tokens`` so that tau means
    the same for short and long answers (the normalisation TRL uses, confirmed by the authors).
    """
    h = (chosen_logps - ref_chosen_logps) / chosen_tokens.clamp(min=1) - (
        rejected_logps - ref_rejected_logps
    ) / rejected_tokens.clamp(min=1)
    return (h - 1.0 / (2.0 * tau)) ** 2


def kto_kl_estimate(mismatched_logps: torch.Tensor, ref_mismatched_logps: torch.Tensor) -> torch.Tensor:
    """KTO's reference point z0: a batch estimate of KL(pi || ref), clamped at 0, without gradient.

    Ethayarajh et al. 2024 (arXiv:2402.01306, section 4.1) estimate it on mismatched pairs (the
    prompt of one example with the completion of another), so that it does not reward the
    policy for raising exactly the completions being judged.
    """
    return (mismatched_logps - ref_mismatched_logps).mean().detach().clamp(min=0)


def kto_loss(
    logps: torch.Tensor,
    ref_logps: torch.Tensor,
    desirable: torch.Tensor,
    kl: torch.Tensor,
    beta: float,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> torch.Tensor:
    """Kahneman-Tversky Optimisation on unpaired examples (Ethayarajh et al. 2024, eq. 7).

    A desirable (successful) example loses lambda_D (1 - sigmoid(beta (r - z0))), an undesirable
    one lambda_U (1 - sigmoid(beta (z0 - r))), with r = pi - ref its log-ratio and z0 = ``kl``
    (see :func:`kto_kl_estimate`). Needs no pairing, so every success and every failure is used.
    """
    logratio = logps - ref_logps
    good = desirable.bool()
    return torch.where(
        good,
        desirable_weight * (1.0 - torch.sigmoid(beta * (logratio - kl))),
        undesirable_weight * (1.0 - torch.sigmoid(beta * (kl - logratio))),
    )


def sft_loss(logprobs: torch.Tensor, mask: torch.Tensor, total_tokens: float | None = None) -> torch.Tensor:
    """Supervised fine-tuning: the negative log-likelihood of the target tokens, mean per token.

    ``logprobs`` and ``mask`` are ``[B, T]``; ``total_tokens`` replaces this tensor's token count
    when it is one micro-batch of a larger batch, so that micro-batch losses add up. Used on
    demonstrations, on the successful trajectories of rejection-sampling fine-tuning (RFT; Yuan
    et al. 2023, arXiv:2308.01825), as the auxiliary term mixed into online RL, and on the chosen
    answers of preference pairs as RPO's likelihood term (Pang et al. 2024, "Iterative Reasoning
    Preference Optimization", arXiv:2404.19733, eq. 3: ``loss = dpo + alpha * nll``, which keeps DPO
    from lowering the chosen answers' likelihood along with the rejected ones'; TRL's ``sft`` loss
    type beside ``sigmoid``). Sequence sums of log-probabilities work too, with a mask of ones.
    """
    denom = total_tokens if total_tokens is not None else mask.sum().clamp(min=1.0)
    return -(logprobs * mask).sum() / denom
