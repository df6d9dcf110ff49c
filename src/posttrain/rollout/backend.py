"""The interface every generation engine implements: posttrain's HF decode loop and vLLM."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``temperature == 0`` means greedy decoding."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    stop: tuple[str, ...] = field(default_factory=tuple)


@dataclass
class Generation:
    """One sampled continuation: the exact token ids and the sampler's log-probability of each.

    ``logprobs`` are under the temperature-scaled distribution the token was drawn from
    (0 for greedy decoding). ``finish_reason`` is "stop" (EOS or a stop string) or "length".
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]


class GenerationBackend(Protocol):
    same_logprobs_as_trainer: bool
    """True when the backend's logprobs are the trainer's own computation (it runs the policy's
    model), so they can stand in for the old policy's; False for an engine with its own kernels."""

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, num_samples: int = 1
    ) -> list[Generation]:
        """Sample ``num_samples`` continuations of each prompt (token ids in, token ids out).

        Returns ``len(prompts) * num_samples`` generations, grouped by prompt: the samples of
        prompt i are at ``i * num_samples ... (i + 1) * num_samples - 1``.
        """
        ...

    def sync_weights(self) -> None:
        """Generate from the policy's current weights from now on; the trainer calls it after
        every optimiser update. A no-op for a backend that shares the policy's model."""
        ...
