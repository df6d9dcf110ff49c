"""The curriculum sampler: harder levels as success rises, dropped tasks, near-50% preference, resume."""

import math
import random

import pytest

from posttrain.config import CurriculumSection
from posttrain.envs.arithmetic import ArithmeticEnv
from posttrain.train.curriculum import CurriculumSampler, ShuffledTasks, scheduled_max_turns, task_weight
from posttrain.types import Step, Task, Trajectory


def episode(task: Task, correct: bool) -> Trajectory:
    return Trajectory(task=task, prompt_ids=[1], completion_ids=[2], loss_mask=[1], behaviour_logprobs=[0.0],
                      steps=[Step("x", "", float(correct), True, False, {"correct": correct})], reward=float(correct))


class Learner:
    """A stand-in for a policy whose skill grows with practice: P(solve level L) = sigmoid(2 (skill - L))."""

    def __init__(self, seed: int = 0, rate: float = 0.004, ceiling: float = math.inf):
        self.skill, self.rate, self.ceiling = 1.0, rate, ceiling
        self.rng = random.Random(seed)

    def attempt(self, task: Task) -> bool:
        solved = self.rng.random() < 1 / (1 + math.exp(-2 * (self.skill - task.metadata["difficulty"])))
        self.skill = min(self.ceiling, self.skill + self.rate)
        return solved


def run(sampler: CurriculumSampler, learner: Learner, steps: int, group: int = 8, promotions: list | None = None):
    """Train-loop shape: 2 tasks per step, ``group`` episodes each; returns (level, success) per step.
    ``promotions`` collects, at each move up, the success over the last ``window`` episodes drawn at
    the level left."""
    history, at_level = [], []
    for _ in range(steps):
        level = sampler.metrics()["curriculum/level"]
        tasks = sampler.sample(2)
        assert all(t.metadata["difficulty"] == level for t in tasks)  # review_fraction 0: the current level only
        outcomes = [episode(t, learner.attempt(t)) for t in tasks for _ in range(group)]
        sampler.observe(outcomes)
        at_level += [t.correct for t in outcomes]
        new_level = sampler.metrics()["curriculum/level"]
        if new_level != level:
            if promotions is not None and new_level > level:
                recent = at_level[-sampler.cfg.window:]
                promotions.append(sum(recent) / len(recent))
            at_level = []
        history.append((new_level, sum(t.correct for t in outcomes) / len(outcomes)))
    return history


def mixed_tasks():
    return list(ArithmeticEnv(difficulty=[1, 2, 3, 4, 5], num_train=60, num_eval=5).tasks("train"))


def test_moves_to_harder_levels_as_success_rises():
    sampler = CurriculumSampler(mixed_tasks(), CurriculumSection(enabled=True, window=32, promote_at=0.75), seed=0)
    promotions: list[float] = []
    history = run(sampler, Learner(), steps=150, promotions=promotions)
    levels = [level for level, _ in history]
    assert levels[0] == 1 and levels[-1] == 5
    assert levels == sorted(levels)  # a learner that keeps improving is never sent back
    assert len(promotions) == 4 and min(promotions) >= 0.75  # each move up followed measured success


def test_stays_or_steps_back_where_success_stalls():
    cfg = CurriculumSection(enabled=True, window=32, promote_at=0.75, demote_at=0.2)
    sampler = CurriculumSampler(mixed_tasks(), cfg, seed=0)
    history = run(sampler, Learner(ceiling=2.6), steps=150)  # learns levels 1 and 2, never 4 or 5
    assert max(level for level, _ in history) <= 3
    assert history[-1][0] in (2, 3)


def test_always_and_never_solved_tasks_are_retired_and_not_drawn_again():
    tasks = [Task(f"t{i}", "?", 1, {"difficulty": 1}) for i in range(6)]
    sampler = CurriculumSampler(tasks, CurriculumSection(enabled=True, retire_min_samples=8, window=1000), seed=0)
    outcome = {"t0": [True] * 8, "t1": [False] * 8, "t2": [True, False] * 4}
    for task_id, results in outcome.items():
        sampler.observe([episode(sampler.tasks[task_id], r) for r in results])
    assert sampler.retired == {"t0": "solved", "t1": "unsolved"}
    drawn = {t.id for _ in range(200) for t in sampler.sample(2)}
    assert drawn == {"t2", "t3", "t4", "t5"}
    m = sampler.metrics()
    assert (m["curriculum/retired_solved"], m["curriculum/retired_unsolved"], m["curriculum/active_tasks"]) == (1, 1, 4)


def test_tasks_near_half_success_are_preferred():
    assert task_weight(4, 8) > task_weight(6, 8) > task_weight(8, 8)
    assert task_weight(0, 0) == pytest.approx(0.25)  # an unseen task has the highest weight
    tasks = [Task("half", "?", 1, {"difficulty": 1}), Task("mostly", "?", 1, {"difficulty": 1})]
    sampler = CurriculumSampler(tasks, CurriculumSection(enabled=True, retire_min_samples=0), seed=0)
    sampler.observe([episode(tasks[0], r) for r in [True, False] * 4])
    sampler.observe([episode(tasks[1], r) for r in [True] * 7 + [False]])
    draws = [sampler.sample(1)[0].id for _ in range(2000)]
    assert draws.count("half") / len(draws) == pytest.approx(task_weight(4, 8) / (task_weight(4, 8) + task_weight(7, 8)),
                                                             abs=0.04)


def test_state_dict_resumes_the_same_draws():
    cfg = CurriculumSection(enabled=True, window=16)
    a = CurriculumSampler(mixed_tasks(), cfg, seed=3)
    learner = Learner(seed=1, rate=0.01)
    run(a, learner, steps=40)
    b = CurriculumSampler(mixed_tasks(), cfg, seed=99)
    b.load_state_dict(a.state_dict())
    learner_b = Learner(seed=1, rate=0.01)
    learner_b.rng.setstate(learner.rng.getstate())
    learner_b.skill = learner.skill
    assert run(a, learner, steps=30) == run(b, learner_b, steps=30)
    assert a.metrics() == b.metrics()

    shuffled = ShuffledTasks(mixed_tasks(), seed=0)
    shuffled.sample(7)
    again = ShuffledTasks(mixed_tasks(), seed=5)
    again.load_state_dict(shuffled.state_dict())
    assert [t.id for t in shuffled.sample(400)] == [t.id for t in again.sample(400)]


def test_turn_limit_schedule():
    assert [scheduled_max_turns(s, 6, start=2, increase=2, every=10) for s in (1, 10, 11, 21, 31, 99)] == [2, 2, 4, 6, 6, 6]
    assert scheduled_max_turns(50, 4, start=0, increase=1, every=1) == 4  # off


def test_review_fraction_draws_from_easier_levels():
    cfg = CurriculumSection(enabled=True, start_level=2, review_fraction=0.3, retire_min_samples=0)
    sampler = CurriculumSampler(mixed_tasks(), cfg, seed=0)
    levels = [t.metadata["difficulty"] for _ in range(1000) for t in sampler.sample(1)]
    assert set(levels) == {1, 2, 3}
    assert sum(level < 3 for level in levels) / len(levels) == pytest.approx(0.3, abs=0.04)


def test_config_thresholds_are_checked():
    with pytest.raises(ValueError, match="demote_at"):
        CurriculumSection(promote_at=0.3, demote_at=0.5)
