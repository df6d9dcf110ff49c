"""LLM-as-judge rewards: robust parsing of untrusted replies, and the judges run on a local model."""

import pytest

from posttrain.config import RewardSection
from posttrain.rewards.composition import RewardComposer
from posttrain.rewards.judge import GroupJudge, Judge, parse_group_scores, parse_score
from posttrain.types import Step, Task, Trajectory


@pytest.mark.parametrize("reply, score", [
    ("Score: 7", 0.7), ("score = 10", 1.0), ("**Score:** 8", 0.8), ("I'd give it 6/10.", 0.6),
    ("6 out of 10", 0.6), ('{"score": 9}', 0.9), ('```json\n{"score": 3}\n```', 0.3), ("The grade: **4**", 0.4),
    ("Score: 15", 1.0), ("Score: -2", 0.0), ("5", 0.5), ("Score: 2.5", 0.25),
    ("It has 3 steps and 2 errors", None), ("no idea", None), ("", None),
])
def test_parse_score(reply, score):
    assert parse_score(reply) == (None if score is None else pytest.approx(score))


def test_parse_group_scores():
    reply = "Answer 1: 8\nAnswer 3: 2\n**Answer 2**: 5\nanswer #4 - score: 10\nAnswer 9: 7"
    assert parse_group_scores(reply, 4) == [0.8, 0.5, 0.2, 1.0]
    assert parse_group_scores("Answer 1: 8\nAnswer 1: 6", 2) == [0.6, None]
    assert parse_group_scores("nothing useful", 2) == [None, None]


def _traj(task, answer):
    return Trajectory(task, [1], [5, 6], [1, 1], [0.0, 0.0], [Step(answer, "", 0.0, True, False, {})])


def test_judges_run_on_a_local_model_and_count_unreadable_replies():
    """tiny-random replies with noise: every score is 0 or a parsed one, unreadable replies are counted,
    and the group judge asks once per group."""
    tasks = [Task("a", "What is 2 + 2?"), Task("b", "What is 3 + 3?")]
    trajs = [_traj(t, a) for t in tasks for a in ("4", "5", "6")]
    cfg = RewardSection.model_validate({"components": [
        {"name": "judge", "kwargs": {"model": "tiny-random", "max_new_tokens": 8}},
        {"name": "group_judge", "kwargs": {"model": "tiny-random", "max_new_tokens": 8}}]})
    out = RewardComposer(cfg)(trajs, group_size=3)
    assert len(out.total) == 6 and all(0.0 <= r <= 2.0 for r in out.total)
    assert 0 <= out.metrics["reward/judge/unparsed"] <= 6
    assert out.metrics["reward/group_judge/calls"] == 2.0
    assert out.metrics["reward/judge_errors"] == out.metrics["reward/group_judge_errors"] == 0.0


def test_prompts_hold_rubric_question_and_answers():
    judge = Judge.__new__(Judge)
    judge.rubric, judge.scale, judge.max_answer_chars = "Be right.", 10.0, 100
    task = Task("a", "What is 2 + 2?")
    assert all(s in judge.prompt(_traj(task, "4")) for s in ("Be right.", "What is 2 + 2?", "Answer: 4", "Score: N"))
    group = GroupJudge.__new__(GroupJudge)
    group.rubric, group.scale, group.max_answer_chars = "Be right.", 10.0, 100
    text = group.prompt([_traj(task, "4"), _traj(task, "5")])
    assert "Answer 1: 4" in text and "Answer 2: 5" in text and "Answer K: N" in text
