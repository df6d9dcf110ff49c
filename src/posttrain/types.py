"""The data that flows between the stages of the loop.

environment -> (Task) -> rollout -> (Trajectory) -> reward -> (Batch) -> policy update

Every stage takes and returns these types; nothing crosses a stage boundary as a loose dict.
Token ids are plain Python lists here (cheap to store and serialise); the trainer turns a
group of trajectories into padded tensors in :class:`Batch`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class Task:
    """One problem an environment can pose.

    ``id`` is stable across runs (used to group samples and to keep splits disjoint);
    ``prompt`` is what the agent first sees; ``answer`` is the ground truth the reward checks,
    if the task has one; ``metadata`` carries anything else the environment needs.
    """

    id: str
    prompt: str
    answer: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class Step:
    """One agent turn: the text it produced and what the environment answered."""

    action: str
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Trajectory:
    """One episode of one task, token in / token out.

    ``completion_ids`` holds every token after the prompt: the tokens the policy sampled and,
    in multi-turn episodes, the template-rendered environment observations between them.
    ``loss_mask[i]`` is 1 exactly when ``completion_ids[i]`` was sampled by the policy, and
    ``behaviour_logprobs[i]`` is the sampler's log-probability of that token (0 where mask is 0).
    ``reward`` is the episode's return, the sum of its ``step_rewards`` (one per agent turn: the
    process signal, with the outcome in the last).
    ``error`` is set when the episode failed for a reason other than the agent's answer
    (an environment exception, a timeout); such trajectories get zero reward and still count.
    ``error_kind`` says which failure it was (see ``posttrain.envs.contract.ErrorKind``).
    ``policy_version`` is the number of updates the sampling weights had had (asynchronous
    rollouts sample with weights up to ``train.async_steps`` updates older than the trainer's).
    """

    task: Task
    prompt_ids: list[int]
    completion_ids: list[int]
    loss_mask: list[int]
    behaviour_logprobs: list[float]
    steps: list[Step] = field(default_factory=list)
    reward: float = 0.0
    error: str | None = None
    error_kind: str | None = None
    finish_reason: str = "stop"
    metadata: dict[str, Any] = field(default_factory=dict)
    policy_version: int = 0

    def __post_init__(self) -> None:
        n = len(self.completion_ids)
        if len(self.loss_mask) != n or len(self.behaviour_logprobs) != n:
            raise ValueError(
                f"trajectory of task {self.task.id!r}: completion_ids ({n}), loss_mask "
                f"({len(self.loss_mask)}) and behaviour_logprobs "
                f"({len(self.behaviour_logprobs)}) must have the same length"
            )

    @property
    def step_rewards(self) -> list[float]:
        return [s.reward for s in self.steps]

    @property
    def num_sampled_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def correct(self) -> bool:
        """True when the environment said the episode was solved (``info['correct']`` or
        ``info['is_success']``; see ``posttrain.envs.contract.StepInfo``)."""
        return any(bool(s.info.get("correct") or s.info.get("is_success")) for s in self.steps)


@dataclass
class Batch:
    """Right-padded tensors for a set of trajectories, ready for a forward pass.

    Shapes are ``[B, T]`` where T = longest prompt + completion; ``prompt_lengths`` is ``[B]``.
    ``loss_mask`` is 1 only on policy-sampled completion tokens; ``advantages`` is per token (a
    per-trajectory advantage broadcast over its tokens, or a per-token one from GAE).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    advantages: torch.Tensor
    prompt_lengths: torch.Tensor
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    importance_weights: torch.Tensor | None = None  # per-token loss weights (TIS), when another engine sampled
    # Another engine's log-probs of the sampled tokens, left for the loss to compare with its own
    # (one on-policy optimiser step: the trainer's old log-probs are its current ones, no extra pass).
    sampler_logprobs: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def select(self, index: torch.Tensor | slice) -> "Batch":
        """Rows ``index`` of every tensor, trimmed to the longest remaining sequence (an empty
        selection keeps one column: a data-parallel rank with no trainable rows still takes part)."""
        lengths = self.attention_mask[index].sum(dim=1)
        width = int(lengths.max().item()) if lengths.numel() else 1

        def take(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[index][:, :width]

        return Batch(
            input_ids=take(self.input_ids),
            attention_mask=take(self.attention_mask),
            loss_mask=take(self.loss_mask),
            advantages=take(self.advantages),
            prompt_lengths=self.prompt_lengths[index],
            old_logprobs=take(self.old_logprobs),
            ref_logprobs=take(self.ref_logprobs),
            old_values=take(self.old_values),
            returns=take(self.returns),
            importance_weights=take(self.importance_weights),
            sampler_logprobs=take(self.sampler_logprobs),
        )

    @property
    def device(self) -> torch.device:
        return self.input_ids.device

    def to(self, device: torch.device | str) -> "Batch":
        """The same batch with every tensor on ``device``."""
        return Batch(**{name: None if t is None else t.to(device) for name, t in vars(self).items()})

    @staticmethod
    def from_trajectories(trajectories: list[Trajectory], pad_id: int,
                          device: torch.device | str | None = None) -> "Batch":
        """Right-pad trajectories into tensors, with zero advantages for the caller to fill in.

        Built on the host and moved to ``device`` (the policy's) in one copy per tensor.
        Logprob tensors are aligned with ``input_ids``: position t holds log p(input_ids[t]).
        """
        rows = [t.prompt_ids + t.completion_ids for t in trajectories]
        width = max(len(r) for r in rows)
        b = len(rows)
        input_ids = torch.full((b, width), pad_id, dtype=torch.long)
        attention = torch.zeros((b, width), dtype=torch.long)
        mask = torch.zeros((b, width), dtype=torch.float32)
        for i, (traj, row) in enumerate(zip(trajectories, rows)):
            n, p = len(row), len(traj.prompt_ids)
            input_ids[i, :n] = torch.tensor(row, dtype=torch.long)
            attention[i, :n] = 1
            mask[i, p:n] = torch.tensor(traj.loss_mask, dtype=torch.float32)
        prompt_lengths = torch.tensor([len(t.prompt_ids) for t in trajectories])
        batch = Batch(input_ids=input_ids, attention_mask=attention, loss_mask=mask,
                      advantages=torch.zeros_like(mask), prompt_lengths=prompt_lengths)
        return batch if device is None else batch.to(device)


@dataclass
class Rewards:
    """What the reward stage hands to the algorithm for a batch of trajectories.

    ``total[b]`` is trajectory b's reward, the weighted sum of the configured components plus its
    step scores; ``step_rewards[b][k]`` is turn k's share of it (the environment's step reward times
    the correctness weight, plus the step scorers'; the last turn also carries the outcome-only
    components), so that each row sums to ``total[b]``. ``dense[b]`` lists ``(index, reward)``
    pairs, a reward at completion token ``index`` (the end of a step) from a dense process reward,
    kept out of ``total``. ``metrics`` has each component's mean score and error count.
    """

    total: list[float]
    step_rewards: list[list[float]]
    dense: list[list[tuple[int, float]]]
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class AgentOutcome:
    """How one seat of a multi-agent episode ended.

    ``player`` names who played the seat ("policy", an adapter, "random", "scripted", a pool
    checkpoint); ``outcome`` is "win", "draw" or "loss" for games with a winner and None for
    cooperative ones; ``payoff`` is the game's score for the seat (chips, deal value, tests
    passed), ``reward`` its return (the payoff minus invalid-move penalties).
    """

    role: str
    player: str
    reward: float
    payoff: float
    outcome: str | None
    invalid_moves: int
    turns: int


@dataclass
class GameResult:
    """One multi-agent episode: every seat's outcome, and a trajectory per language-model seat."""

    task: Task
    outcomes: dict[str, AgentOutcome]
    trajectories: dict[str, Trajectory]
    error: str | None = None
