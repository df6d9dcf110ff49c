"""Held-out evaluation: success rate, pass@k, mean reward, turns and tokens of the policy on the
eval split, overall, per task and per difficulty level.

The same function serves ``posttrain eval`` and the evaluations during training, so the numbers
of both are comparable. A task's difficulty is ``task.metadata["difficulty"]`` where the
environment sets it (arithmetic, tool_math); other tasks count under one level, ``"all"``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from posttrain.config import EvalSection, RolloutSection
from posttrain.eval.pass_at_k import mean_pass_at_k
from posttrain.rollout.backend import GenerationBackend, SamplingParams
from posttrain.rollout.episodes import EnvPool, EpisodesFailed, run_episodes
from posttrain.types import Task, Trajectory


def task_difficulty(task: Task) -> str:
    """The difficulty level a task reports, as text ("all" when it reports none)."""
    level = task.metadata.get("difficulty")
    return "all" if level is None else str(level)


@dataclass(frozen=True)
class Score:
    """Outcome of a set of episodes: one task's samples, one difficulty level, or all of them."""

    num_tasks: int
    episodes: int
    accuracy: float  # share of episodes that succeeded (pass@1 when every task has n samples)
    reward_mean: float
    turns_mean: float
    tokens_mean: float  # tokens the policy sampled per episode
    errors: int
    pass_at: dict[int, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {**self.metrics(), "num_tasks": self.num_tasks, "episodes": self.episodes, "errors": self.errors}

    def metrics(self) -> dict[str, float]:
        return {"accuracy": self.accuracy, "reward_mean": self.reward_mean, "num_tasks": float(self.num_tasks),
                "errors": float(self.errors), "turns_mean": self.turns_mean, "tokens_mean": self.tokens_mean,
                **{f"pass@{k}": v for k, v in self.pass_at.items()}}


def score(groups: Sequence[Sequence[Trajectory]], ks: Sequence[int]) -> Score:
    """The :class:`Score` of ``groups``, each the samples of one task."""
    episodes = [t for g in groups for t in g]
    n = max(len(episodes), 1)
    counts = [(len(g), sum(t.correct for t in g)) for g in groups]
    return Score(
        num_tasks=len(groups), episodes=len(episodes),
        accuracy=sum(t.correct for t in episodes) / n,
        reward_mean=sum(t.reward for t in episodes) / n,
        turns_mean=sum(len(t.steps) for t in episodes) / n,
        tokens_mean=sum(t.num_sampled_tokens for t in episodes) / n,
        errors=sum(t.error is not None for t in episodes),
        pass_at={k: mean_pass_at_k(counts, k) for k in ks if all(size >= k for size, _ in counts)},
    )


@dataclass(frozen=True)
class TaskScore:
    task_id: str
    difficulty: str
    samples: int
    successes: int
    reward_mean: float
    turns_mean: float
    tokens_mean: float


@dataclass
class EvalResult:
    """Everything one evaluation measured; ``trajectories`` are grouped by task."""

    overall: Score
    per_difficulty: dict[str, Score]
    per_task: list[TaskScore]
    trajectories: list[Trajectory] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)  # eval_samples/*.jsonl rows

    @property
    def accuracy(self) -> float:
        return self.overall.accuracy

    @property
    def reward_mean(self) -> float:
        return self.overall.reward_mean

    @property
    def num_tasks(self) -> int:
        return self.overall.num_tasks

    @property
    def errors(self) -> int:
        return self.overall.errors

    @property
    def pass_at(self) -> dict[int, float]:
        return self.overall.pass_at

    def raise_if_all_failed(self, when: str) -> None:
        """:class:`EpisodesFailed` when every held-out episode failed: nothing was measured."""
        if self.samples and self.errors == len(self.samples):
            first = next(s["error"] for s in self.samples if s["error"])
            raise EpisodesFailed(f"every held-out episode {when} failed ({self.errors} of {len(self.samples)}): no "
                                 f"accuracy was measured; the first: {' '.join(first.split())[:300]}")

    def metrics(self) -> dict[str, float]:
        """Flat metrics for metrics.jsonl and TensorBoard; levels as ``difficulty_<level>/<name>``."""
        out = self.overall.metrics()
        if len(self.per_difficulty) > 1:
            for level, s in self.per_difficulty.items():
                out.update({f"difficulty_{level}/{k}": v for k, v in s.metrics().items() if k != "errors"})
        return out

    def to_json(self) -> dict[str, Any]:
        """The whole result (without the trajectories) for ``posttrain eval --json``."""
        return {**self.overall.to_json(),
                "per_difficulty": {level: s.to_json() for level, s in self.per_difficulty.items()},
                "per_task": [asdict(t) for t in self.per_task]}


def summarise(trajectories: list[Trajectory], samples_per_task: int, pass_k: int = 1) -> EvalResult:
    """Score trajectories that come ``samples_per_task`` per task, in task order."""
    groups = [trajectories[i : i + samples_per_task] for i in range(0, len(trajectories), samples_per_task)]
    ks = sorted({1, pass_k})
    by_level: dict[str, list[list[Trajectory]]] = {}
    for g in groups:
        by_level.setdefault(task_difficulty(g[0].task), []).append(g)
    per_task = [_task_score(g) for g in groups]
    return EvalResult(overall=score(groups, ks), per_difficulty={lvl: score(gs, ks) for lvl, gs in by_level.items()},
                      per_task=per_task, trajectories=trajectories)


def _task_score(group: Sequence[Trajectory]) -> TaskScore:
    s = score([group], ks=())
    return TaskScore(group[0].task.id, task_difficulty(group[0].task), s.episodes, sum(t.correct for t in group),
                     s.reward_mean, s.turns_mean, s.tokens_mean)


def sample_row(traj: Trajectory, tokenizer) -> dict[str, Any]:
    """One eval_samples line: the outcome, the text, every turn and the tokens with their loss mask."""
    return {
        "task_id": traj.task.id, "difficulty": task_difficulty(traj.task), "prompt": traj.task.prompt,
        "answer": str(traj.task.answer),
        "completion": tokenizer.decode(traj.completion_ids, skip_special_tokens=True),
        "reward": traj.reward, "correct": traj.correct, "error": traj.error, "finish_reason": traj.finish_reason,
        "steps": [{"action": s.action, "observation": s.observation, "reward": s.reward, "info": s.info}
                  for s in traj.steps],
        "prompt_ids": traj.prompt_ids, "completion_ids": traj.completion_ids, "loss_mask": traj.loss_mask,
    }


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
    with the training rollout's stop strings and turn and context limits."""
    params = SamplingParams(temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens, stop=tuple(rollout.stop))
    trajectories: list[Trajectory] = []
    for start in range(0, len(tasks), cfg.batch_size):
        chunk = tasks[start : start + cfg.batch_size]
        trajectories += run_episodes(envs, backend, tokenizer, chunk, params, cfg.samples_per_task,
                                     rollout.max_turns, rollout.max_context_tokens, step_timeout, success_reward)
        if on_progress:
            on_progress(len(chunk))
    result = summarise(trajectories, cfg.samples_per_task, cfg.pass_k)
    result.samples = [sample_row(t, tokenizer) for t in trajectories]
    return result


def merge_results(results: list[EvalResult]) -> EvalResult:
    """One result from disjoint shares of the held-out tasks (data-parallel ranks): their episodes
    scored together, so every figure is as if one process had run them all."""
    trajectories = [t for r in results for t in r.trajectories]
    first = next((r for r in results if r.overall.num_tasks), results[0])
    samples_per_task = max(1, first.overall.episodes // max(first.overall.num_tasks, 1))
    merged = summarise(trajectories, samples_per_task, max(first.pass_at, default=1))
    merged.samples = [s for r in results for s in r.samples]
    return merged
