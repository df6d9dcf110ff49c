"""Reward composition: weights, one metric per component, failing components contained, step scorers."""

import time

import pytest

from posttrain.config import ConfigError, RewardSection
from posttrain.rewards.composition import RewardComposer
from posttrain.types import Step, Task, Trajectory


def _traj(turns: list[tuple[str, float, dict]], error: str | None = None) -> Trajectory:
    steps = [Step(a, "", r, k == len(turns) - 1, False, info) for k, (a, r, info) in enumerate(turns)]
    n = 3 * len(turns)
    return Trajectory(Task("t", "q", 1), [1, 2], list(range(n)), [1] * n, [0.0] * n, steps,
                      reward=sum(r for _, r, _ in turns), error=error)


def _compose(components, step_scorers=(), trajectories=()):
    cfg = RewardSection.model_validate({"components": list(components), "step_scorers": list(step_scorers)})
    return RewardComposer(cfg)(list(trajectories), group_size=1)


def test_weighted_sum_and_per_component_metrics():
    trajs = [_traj([("Answer: 12", 1.0, {"correct": True})]), _traj([("I think 13", 0.0, {})])]
    out = _compose([{"name": "correctness", "weight": 2.0}, {"name": "format", "weight": 0.5},
                    {"name": "user_rewards:answer_length_bonus", "weight": 1.0, "kwargs": {"per_char": 0.1}}],
                   trajectories=trajs)
    assert out.total == pytest.approx([2.0 + 0.5 + 1.0, 0.0 + 0.0 + 1.0])
    assert out.metrics["reward/correctness"] == 0.5
    assert out.metrics["reward/format"] == 0.5
    assert out.metrics["reward/user_rewards:answer_length_bonus"] == pytest.approx(1.0)
    assert out.metrics["reward/total"] == pytest.approx(2.25)
    assert all(out.metrics[f"reward/{n}_errors"] == 0 for n in ("correctness", "format"))
    assert [sum(s) for s in out.step_rewards] == pytest.approx(out.total)


def test_raising_component_scores_zero_and_is_counted():
    trajs = [_traj([("12", 1.0, {})]), _traj([("a long answer", 0.0, {})]), _traj([("7", 0.0, {})])]
    out = _compose([{"name": "correctness"}, {"name": "user_rewards:fails_on_long_answers", "weight": 0.5},
                    {"name": "user_rewards:not_a_number"}], trajectories=trajs)
    assert out.total == pytest.approx([1.5, 0.0, 0.5])
    assert out.metrics["reward/user_rewards:fails_on_long_answers_errors"] == 1.0
    assert out.metrics["reward/user_rewards:not_a_number_errors"] == 3.0  # NaN is not a reward
    assert out.metrics["reward/correctness_errors"] == 0.0


def test_failed_episode_scores_zero():
    out = _compose([{"name": "correctness"}, {"name": "format"}],
                   trajectories=[_traj([("Answer: 3", 0.0, {})], error="step: RuntimeError: boom")])
    assert out.total == [0.0]


def test_length_and_tool_call_components():
    traj = _traj([("call", 0.0, {"tool": "calculator"}), ("bad", 0.0, {"malformed_call": True}),
                  ("Final Answer: 3", 1.0, {"correct": True})])  # 9 sampled tokens
    out = _compose([{"name": "tool_calls"}, {"name": "length", "kwargs": {"max_tokens": 13, "free_tokens": 5}}],
                   trajectories=[traj])
    assert out.metrics["reward/tool_calls"] == 0.5
    assert out.metrics["reward/length"] == pytest.approx(-0.5)
    assert out.total == pytest.approx([0.0])


def test_step_scorers_land_on_their_turns():
    """Step scorers add to each turn's step reward (what algorithm.credit=turn assigns); the outcome-only
    components go to the last turn, and every row sums to its total."""
    traj = _traj([("call", 0.0, {"tool": "calculator"}), ("bad", 0.0, {"malformed_call": True}),
                  ("Answer: 3", 1.0, {"correct": True})])
    out = _compose([{"name": "correctness"}, {"name": "format", "weight": 0.5}],
                   [{"name": "tool_call", "weight": 0.1}, {"name": "user_rewards:first_turn_bonus",
                                                          "kwargs": {"bonus": 2.0}}], [traj])
    assert out.step_rewards[0] == pytest.approx([0.1 + 2.0, -0.1, 1.0 + 0.5])
    assert out.total == pytest.approx([sum(out.step_rewards[0])])
    assert out.metrics["reward/step/tool_call"] == pytest.approx(0.0)  # +1, -1, 0 over three turns
    assert out.metrics["reward/step/user_rewards:first_turn_bonus"] == pytest.approx(2.0 / 3)


def test_bad_component_names_are_config_errors():
    with pytest.raises(ConfigError, match="no_such_module"):
        _compose([{"name": "no_such_module:f"}])
    with pytest.raises(ConfigError, match="built-in name or 'package.module:function'"):
        _compose([{"name": "corectness"}])
    with pytest.raises(ConfigError, match="twice"):
        _compose([{"name": "format"}, {"name": "format"}])


@pytest.mark.parametrize("component, says", [
    ({"name": "format", "kwargs": {"patern": "Answer"}}, "reward component 'format': got an unexpected keyword "
     "argument 'patern' (its kwargs: pattern)"),
    ({"name": "format", "kwargs": {"pattern": "(Answer"}}, "kwargs {'pattern': '(Answer'} do not work: missing )"),
    ({"name": "length", "kwargs": {"max_tokens": 5, "free_tokens": 10}}, "needs max_tokens > free_tokens"),
    ({"name": "user_rewards:answer_length_bonus", "kwargs": {"per_character": 0.1}},
     "unexpected keyword argument 'per_character' (its kwargs: per_char)"),
])
def test_component_kwargs_that_cannot_work_stop_the_run_before_it_trains_on_zeros(component, says):
    with pytest.raises(ConfigError) as e:
        _compose([{"name": "correctness"}, component])
    assert says in str(e.value)
    with pytest.raises(ConfigError, match="step scorer 'tool_call': got an unexpected keyword argument 'weight'"):
        _compose([{"name": "correctness"}], [{"name": "tool_call", "kwargs": {"weight": 0.1}}])


def test_a_format_pattern_that_backtracks_on_a_reply_costs_that_reply_not_the_run():
    """(a|aa)+$ on forty a's and a '!' tries every way to split them into ones and twos (165 million) before it
    fails: Python's `re` holds the trainer about a minute here (1.6 times longer per further a); with the time
    limit that reply scores 0 and counts as an error, and the others are scored."""
    replies = [_traj([("a" * 40 + "!", 0.0, {})]), _traj([("aaa", 0.0, {})])]
    started = time.monotonic()
    out = _compose([{"name": "format", "kwargs": {"pattern": r"(a|aa)+$"}}], trajectories=replies)
    assert time.monotonic() - started < 10
    assert out.total == [0.0, 1.0]
    assert out.metrics["reward/format_errors"] == 1.0
