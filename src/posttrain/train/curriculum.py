"""Which training tasks to draw next: a plain shuffle, or a curriculum driven by measured success.

A task sampler hands the trainer ``n`` tasks per step (:meth:`sample`), hears how their episodes
went (:meth:`observe`), reports what it is doing (:meth:`metrics`) and saves and restores its
whole state, random generator included (:meth:`state_dict`), so a resumed run draws the same
tasks as an uninterrupted one.

The curriculum combines three published ideas:

- Difficulty levels with promotion by measured success (as in curriculum RL for reasoning,
  e.g. Team Kimi 2025; Bae et al. 2025, "Online Difficulty Filtering"): tasks are grouped by
  ``metadata["difficulty"]``; draws come from the current level; when the success rate over the
  last ``window`` episodes there reaches ``promote_at`` the sampler moves a level up, at or below
  ``demote_at`` a level down.
- Dropping tasks that teach nothing: with group-relative advantages a task whose samples all
  succeed or all fail has zero advantage everywhere (the zero-variance groups DAPO, Yu et al.
  2025, resamples away). After ``retire_min_samples`` episodes a task always or never solved is
  retired.
- Preferring tasks near 50% success, where a group's rewards vary most: a task is drawn with
  weight p (1 - p), p its success rate smoothed by a Beta(1, 1) prior, so unseen tasks (p = 0.5)
  come first.

Separately, :func:`scheduled_max_turns` is AgentGym-RL's ScalingInter-RL horizon schedule (Xi et
al. 2025): few interaction turns early, more as training goes on.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
from typing import Any

from posttrain.config import CurriculumSection
from posttrain.types import Task, Trajectory


def scheduled_max_turns(step: int, max_turns: int, start: int, increase: int, every: int) -> int:
    """Turn limit at train ``step`` (1-based): ``start``, plus ``increase`` every ``every`` steps,
    never above ``max_turns``; ``start`` 0 means no schedule (always ``max_turns``)."""
    if start <= 0:
        return max_turns
    return min(max_turns, start + increase * ((step - 1) // every))


def task_weight(successes: int, attempts: int) -> float:
    """p (1 - p) with p = (successes + 1) / (attempts + 2): highest for tasks near 50% success."""
    p = (successes + 1) / (attempts + 2)
    return p * (1.0 - p)


class ShuffledTasks:
    """No curriculum: every training task once per epoch, in a fresh random order each epoch."""

    def __init__(self, tasks: Sequence[Task], seed: int):
        self.tasks = list(tasks)
        self.rng = random.Random(seed)
        self.order: list[int] = []

    def sample(self, n: int) -> list[Task]:
        picked = []
        for _ in range(n):
            if not self.order:
                self.order = list(range(len(self.tasks)))
                self.rng.shuffle(self.order)
            picked.append(self.tasks[self.order.pop()])
        return picked

    def observe(self, trajectories: Sequence[Trajectory]) -> None:
        """Nothing to learn: the order does not depend on outcomes."""

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.getstate(), "order": list(self.order)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.setstate(state["rng"])
        self.order = list(state["order"])


def _level_key(level: Any) -> tuple[int, Any]:
    # Numbers in numeric order, then anything else by its text.
    return (0, level) if isinstance(level, (int, float)) else (1, str(level))


class CurriculumSampler:
    """Success-driven draws over difficulty levels; see the module docstring."""

    def __init__(self, tasks: Sequence[Task], cfg: CurriculumSection, seed: int):
        self.cfg = cfg
        self.tasks = {t.id: t for t in tasks}
        by_level: dict[Any, list[str]] = {}
        for t in tasks:
            by_level.setdefault(t.metadata.get("difficulty", 0), []).append(t.id)
        self.levels = sorted(by_level, key=_level_key)
        self.level_tasks = [by_level[level] for level in self.levels]
        self.level = min(cfg.start_level, len(self.levels) - 1)
        self.rng = random.Random(seed)
        self.attempts: dict[str, int] = {}
        self.successes: dict[str, int] = {}
        self.retired: dict[str, str] = {}  # task id -> "solved" or "unsolved"
        self.window: deque[bool] = deque(maxlen=cfg.window)
        self.moves = 0

    # ------------------------------------------------------------ drawing

    def _active(self, level: int) -> list[str]:
        return [i for i in self.level_tasks[level] if i not in self.retired]

    def _draw(self, pool: list[str], taken: set[str]) -> str | None:
        pool = [i for i in pool if i not in taken]
        if not pool:
            return None
        weights = [task_weight(self.successes.get(i, 0), self.attempts.get(i, 0)) for i in pool]
        return self.rng.choices(pool, weights=weights)[0]

    def sample(self, n: int) -> list[Task]:
        """``n`` distinct tasks where possible: from the current level, or with probability
        ``review_fraction`` each from an easier one."""
        self._skip_exhausted_levels()
        taken: set[str] = set()
        picked: list[Task] = []
        for _ in range(n):
            pool = self._active(self.level)
            if self.level > 0 and self.rng.random() < self.cfg.review_fraction:
                pool = [i for lvl in range(self.level) for i in self._active(lvl)] or pool
            if not pool:  # every task of the level retired: draw among them all rather than stop
                pool = list(self.level_tasks[self.level])
            choice = self._draw(pool, taken) or self.rng.choice(pool)
            taken.add(choice)
            picked.append(self.tasks[choice])
        return picked

    def _skip_exhausted_levels(self) -> None:
        """Move off a level none of whose tasks is left, upwards first."""
        if self._active(self.level):
            return
        for candidate in [*range(self.level + 1, len(self.levels)), *range(self.level - 1, -1, -1)]:
            if self._active(candidate):
                self._move_to(candidate)
                return

    # ------------------------------------------------------------ learning from outcomes

    def observe(self, trajectories: Sequence[Trajectory]) -> None:
        """Count each episode's success for its task and level; retire tasks, change levels."""
        touched = set()
        for traj in trajectories:
            task_id = traj.task.id
            if task_id not in self.tasks or traj.error is not None:
                continue  # a failed environment says nothing about the task's difficulty
            self.attempts[task_id] = self.attempts.get(task_id, 0) + 1
            self.successes[task_id] = self.successes.get(task_id, 0) + int(traj.correct)
            touched.add(task_id)
            if task_id in self.level_tasks[self.level]:
                self.window.append(traj.correct)
        if self.cfg.retire_min_samples:
            for task_id in touched:
                n, s = self.attempts[task_id], self.successes[task_id]
                if n >= self.cfg.retire_min_samples and s in (0, n):
                    self.retired[task_id] = "solved" if s == n else "unsolved"
        if len(self.window) == self.window.maxlen:
            rate = sum(self.window) / len(self.window)
            if rate >= self.cfg.promote_at and self.level + 1 < len(self.levels):
                self._move_to(self.level + 1)
            elif rate <= self.cfg.demote_at and self.level > 0:
                self._move_to(self.level - 1)

    def _move_to(self, level: int) -> None:
        self.level = level
        self.window.clear()  # the new level is judged on its own episodes
        self.moves += 1

    def metrics(self) -> dict[str, float]:
        level = self.levels[self.level]
        return {
            "curriculum/level": float(level) if isinstance(level, (int, float)) else float(self.level),
            "curriculum/level_index": float(self.level),
            "curriculum/window_success": sum(self.window) / len(self.window) if self.window else 0.0,
            "curriculum/active_tasks": float(len(self._active(self.level))),
            "curriculum/retired_solved": float(sum(v == "solved" for v in self.retired.values())),
            "curriculum/retired_unsolved": float(sum(v == "unsolved" for v in self.retired.values())),
            "curriculum/level_changes": float(self.moves),
        }

    # ------------------------------------------------------------ resume

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.getstate(), "level": self.level, "attempts": dict(self.attempts),
                "successes": dict(self.successes), "retired": dict(self.retired), "window": list(self.window),
                "moves": self.moves}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.setstate(state["rng"])
        self.level = state["level"]
        self.attempts, self.successes = dict(state["attempts"]), dict(state["successes"])
        self.retired = dict(state["retired"])
        self.window = deque(state["window"], maxlen=self.cfg.window)
        self.moves = state["moves"]


def task_sampler(tasks: Sequence[Task], cfg: CurriculumSection, seed: int) -> ShuffledTasks | CurriculumSampler:
    """The curriculum when ``cfg.enabled``, else the epoch-wise shuffle."""
    return CurriculumSampler(tasks, cfg, seed) if cfg.enabled else ShuffledTasks(tasks, seed)
