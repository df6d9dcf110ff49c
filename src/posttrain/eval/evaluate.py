"""Held-out evaluation: success rate, pass@k and mean reward of the policy on the eval split."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from posttrain.config import EvalSection, RolloutSection
from posttrain.eval.pass_at_k import mean_pass_at_k
from posttrain.rollout.backend import GenerationBackend, SamplingParams
from posttrain.rollout.episodes import EnvPool, EpisodesFailed, run_episodes
from posttrain.types import Task, Trajectory


@dataclass
class EvalResult:
    accuracy: float
    reward_mean: float
    num_tasks: int
    errors: int
    samples: list[dict[str, Any]] = field(default_factory=list)
    pass_at: dict[int, float] = field(default_factory=dict)  # k -> pass@k

    def raise_if_all_failed(self, when: str) -> None:
        """:class:`EpisodesFailed` when every held-out episode failed: nothing was measured."""
        if self.samples and self.errors == len(self.samples):
            first = next(s["error"] for s in self.samples if s["error"])
            raise EpisodesFailed(f"every held-out episode {when} failed ({self.errors} of {len(self.samples)}): no "
                                 f"accuracy was measured; the first: {' '.join(first.split())[:300]}")

    def metrics(self) -> dict[str, float]:
        return {"accuracy": self.accuracy, "reward_mean": self.reward_mean,
                "num_tasks": float(self.num_tasks), "errors": float(self.errors),
                **{f"pass@{k}": v for k, v in self.pass_at.items()}}


def evaluate(
    envs: EnvPool,
    backend: GenerationBackend,
    tokenizer,
    tasks: list[Task],
    cfg: EvalSection,
    rollout: RolloutSection,
    step_timeout: float = 60.0,
    on_progress: Callable[[int], None] | None = None,
    success_reward: float = 1.0,
) -> EvalResult:
    """``cfg.samples_per_task`` episodes per held-out task (greedy unless ``cfg.temperature`` > 0),
    with the training rollout's stop strings and turn and context limits; ``num_tasks`` counts tasks."""
    params = SamplingParams(temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens, stop=tuple(rollout.stop))
    trajectories: list[Trajectory] = []
    for start in range(0, len(tasks), cfg.batch_size):
        chunk = tasks[start : start + cfg.batch_size]
        trajectories += run_episodes(envs, backend, tokenizer, chunk, params, cfg.samples_per_task,
                                     rollout.max_turns, rollout.max_context_tokens, step_timeout, success_reward)
        if on_progress:
            on_progress(len(chunk))
    n = max(len(trajectories), 1)
    samples = [
        {"task_id": t.task.id, "prompt": t.task.prompt, "answer": str(t.task.answer),
         "completion": tokenizer.decode(t.completion_ids, skip_special_tokens=True),
         "reward": t.reward, "correct": t.correct, "error": t.error}
        for t in trajectories
    ]
    # run_episodes groups the samples of a task together.
    per_task = [trajectories[i : i + cfg.samples_per_task] for i in range(0, len(trajectories), cfg.samples_per_task)]
    counts = [(len(group), sum(t.correct for t in group)) for group in per_task]
    return EvalResult(
        accuracy=sum(t.correct for t in trajectories) / n,
        reward_mean=sum(t.reward for t in trajectories) / n,
        num_tasks=len(per_task),
        pass_at={k: mean_pass_at_k(counts, k) for k in sorted({1, cfg.pass_k})},
        errors=sum(t.error is not None for t in trajectories),
        samples=samples,
    )


def merge_results(results: list[EvalResult]) -> EvalResult:
    """One result from disjoint shares of the held-out tasks (data-parallel ranks), task-weighted."""
    n = max(sum(r.num_tasks for r in results), 1)

    def mean(values):
        return sum(v * r.num_tasks for v, r in zip(values, results)) / n

    return EvalResult(
        accuracy=mean(r.accuracy for r in results),
        reward_mean=mean(r.reward_mean for r in results),
        num_tasks=sum(r.num_tasks for r in results),
        errors=sum(r.errors for r in results),
        samples=[s for r in results for s in r.samples],
        pass_at={k: mean(r.pass_at[k] for r in results) for k in results[0].pass_at},
    )
