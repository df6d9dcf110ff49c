"""PRIME's implicit process rewards: a PRM learned online from outcome labels alone.

Cui et al. 2025, "Process Reinforcement through Implicit Rewards" (PRIME, arXiv:2502.01456),
building on Yuan et al. 2024, "Free Process Rewards without Process Labels" (arXiv:2412.01981):
parameterise the reward as the log-likelihood ratio of a causal LM pi_phi against a frozen
reference pi_ref. Token t of a response y then carries the process reward

    r_t = beta * log pi_phi(y_t | y_<t) / pi_ref(y_t | y_<t),

and the response's outcome reward is the sum sum_t r_t. Training that sum as a logit against the
verifier's 0/1 outcome (binary cross-entropy, PRIME eq. 3) makes the per-token terms a process
reward without a single step label. PRIME updates pi_phi on each batch's own rollouts before scoring
them (section 3.3), so the reward model follows the policy's distribution instead of being
over-optimised offline.

Here the token rewards are summed over each step (steps as the PRM delimits them,
:func:`posttrain.rewards.prm.step_ends`) and given as dense rewards at the step ends, which
``algorithm.credit: step`` turns into GRPO process supervision and PPO (``gae_level: token``)
into per-token returns. Both pi_phi and pi_ref start as copies of ``model`` (PRIME initialises both
from the SFT policy); pi_phi's weights and optimiser state are part of the run's checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from posttrain.models.loading import load_model, load_tokenizer
from posttrain.models.logprobs import token_logprobs
from posttrain.models.packed_linear import pack_frozen_linears
from posttrain.models.policy import use_training_kernels
from posttrain.rewards.prm import step_ends
from posttrain.rewards.reward_model import padded
from posttrain.train.optimizer import adamw
from posttrain.types import Trajectory


def implicit_token_rewards(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, beta: float) -> torch.Tensor:
    """PRIME's token-level reward beta * (log pi_phi - log pi_ref), any shape."""
    return beta * (logprobs - ref_logprobs)


def outcome_loss(token_rewards: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of each row's summed implicit reward (the logit) against its 0/1 outcome."""
    return F.binary_cross_entropy_with_logits((token_rewards * mask).sum(dim=1), labels)


def step_sums(token_rewards: list[float], ends: list[int]) -> list[float]:
    """Per step, the sum of the token rewards since the previous step end (through this end)."""
    out, start = [], 0
    for end in ends:
        out.append(sum(token_rewards[start : end + 1]))
        start = end + 1
    return out


@dataclass
class _Chunk:
    """A piece of the batch, padded: its trajectories, ids, attention and loss masks, and the
    reference's log-probs of its tokens."""

    trajectories: list[Trajectory]
    ids: torch.Tensor
    attention: torch.Tensor
    mask: torch.Tensor
    reference: torch.Tensor


class ImplicitPRMScorer:
    """``reward.components: [{name: implicit_prm, kwargs: {model: ..., beta: 0.05, learning_rate: 1e-6}}]``.

    Each call first takes ``updates`` optimiser steps on the batch's outcomes, then scores the batch
    with the updated model. An outcome is 1 when the environment said the episode was solved
    (``Trajectory.correct``) or its return reached ``threshold``. ``model`` defaults to the policy's
    (the config fills it in).
    """

    is_dense = True

    def __init__(self, model: str, beta: float = 0.05, learning_rate: float = 1e-6, updates: int = 1,
                 batch_size: int = 16, threshold: float = 1.0, delimiter: str = "\n"):
        if beta <= 0 or learning_rate <= 0 or updates < 0 or batch_size < 1:
            raise ValueError(f"implicit_prm needs beta > 0, learning_rate > 0, updates >= 0 and batch_size >= 1; "
                             f"got beta={beta}, learning_rate={learning_rate}, updates={updates}, "
                             f"batch_size={batch_size}")
        self.model = load_model(model)
        self.reference = load_model(model).eval().requires_grad_(False)
        for m in (self.model, self.reference):  # packed passes, without padding, fused layers (as the policy's)
            use_training_kernels(m)
        pack_frozen_linears(self.reference)  # the frozen copy only ever runs forward
        self.tokenizer = load_tokenizer(model)
        self.beta, self.updates, self.batch_size, self.delimiter = beta, updates, batch_size, delimiter
        self.threshold = threshold
        self.optimizer = adamw([{"params": list(self.model.parameters())}], learning_rate, 0.0)
        self.last_metrics: dict[str, float] = {}

    def solved(self, t: Trajectory) -> bool:
        return t.correct or t.reward >= self.threshold

    @torch.no_grad()
    def _chunks(self, trajectories: list[Trajectory]) -> list[_Chunk]:
        """The batch in ``batch_size`` pieces, padded, with the frozen reference's log-probs computed
        once (the update and the scoring both need them)."""
        out = []
        for s in range(0, len(trajectories), self.batch_size):
            part = trajectories[s : s + self.batch_size]
            ids, attention = padded([t.prompt_ids + t.completion_ids for t in part],
                                    int(self.tokenizer.pad_token_id or 0))
            mask = torch.zeros_like(ids, dtype=torch.float32)
            for b, t in enumerate(part):
                mask[b, len(t.prompt_ids) : len(t.prompt_ids) + len(t.loss_mask)] = torch.tensor(
                    t.loss_mask, dtype=torch.float32)
            reference, _ = token_logprobs(self.reference, ids, attention, positions=mask)
            out.append(_Chunk(part, ids, attention, mask, reference))
        return out

    def _token_rewards(self, chunk: _Chunk) -> torch.Tensor:
        logprobs, _ = token_logprobs(self.model, chunk.ids, chunk.attention, positions=chunk.mask)
        return implicit_token_rewards(logprobs, chunk.reference, self.beta) * chunk.mask

    def update(self, chunks: list[_Chunk]) -> float:
        """``updates`` optimiser steps of the outcome loss over the batch; the mean loss."""
        total = sum(len(c.trajectories) for c in chunks)
        self.model.train()
        losses = []
        for _ in range(self.updates):
            self.optimizer.zero_grad(set_to_none=True)
            for chunk in chunks:
                labels = torch.tensor([float(self.solved(t)) for t in chunk.trajectories])
                loss = outcome_loss(self._token_rewards(chunk), chunk.mask, labels)
                (loss * len(chunk.trajectories) / total).backward()
                losses.append(float(loss.detach()))
            self.optimizer.step()
        self.model.eval()
        return sum(losses) / len(losses) if losses else 0.0

    @torch.no_grad()
    def _score(self, trajectories: list[Trajectory],
               chunks: list[_Chunk] | None = None) -> list[list[tuple[int, float]]]:
        """Per trajectory, ``(step end, summed implicit reward)`` pairs (``chunks``: the batch already prepared)."""
        out: list[list[tuple[int, float]]] = []
        for chunk in chunks if chunks is not None else self._chunks(trajectories):
            rewards = self._token_rewards(chunk)
            for b, t in enumerate(chunk.trajectories):
                if not t.completion_ids:
                    out.append([])
                    continue
                tokens = rewards[b, len(t.prompt_ids) : len(t.prompt_ids) + len(t.completion_ids)].tolist()
                ends = step_ends(self.tokenizer, t.completion_ids, t.loss_mask, self.delimiter) or \
                    [len(t.completion_ids) - 1]
                out.append(list(zip(ends, step_sums(tokens, ends))))
        return out

    def dense(self, trajectories: list[Trajectory]) -> list[list[tuple[int, float]]]:
        # Failed episodes get no reward (the composer drops them), so they are neither trained on nor scored.
        scorable = [t for t in trajectories if t.error is None and t.completion_ids]
        chunks = self._chunks(scorable)
        loss = self.update(chunks) if chunks and self.updates else 0.0
        scored = dict(zip(map(id, scorable), self._score(scorable, chunks)))
        out = [scored.get(id(t), []) for t in trajectories]
        solved = [sum(r for _, r in steps) for steps, t in zip(out, trajectories) if self.solved(t)]
        failed = [sum(r for _, r in steps) for steps, t in zip(out, trajectories) if not self.solved(t)]
        self.last_metrics = {"loss": loss,
                             "outcome_gap": (sum(solved) / len(solved) - sum(failed) / len(failed))
                             if solved and failed else 0.0}
        return out

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
