"""Environments that fail after their first constructor, or answer out of contract: each failure
is one episode's error (counted, with a reason), never a traceback, a hang or a spinning thread."""

import math
import threading
import time

import pytest
import user_envs

from posttrain.envs import EnvError, make_env
from posttrain.rollout import EnvPool, HFBackend, SamplingParams, run_episodes
from posttrain.types import Task

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=4)


@pytest.fixture(scope="module")
def backend(tiny_model, tokenizer):
    return HFBackend(tiny_model, tokenizer, batch_size=8, seed=0)


def _episodes(env_name, backend, tokenizer, n=4, kwargs=None, **loop):
    envs = EnvPool(lambda: make_env(f"user_envs:{env_name}", kwargs or {}))
    tasks = envs.tasks("train")[:1]
    return envs, run_episodes(envs, backend, tokenizer, tasks, PARAMS, num_samples=n, **loop)


def test_a_replacement_whose_constructor_raises_fails_its_episodes_only(backend, tokenizer):
    user_envs.FailingReplacement.built = 0
    _, trajectories = _episodes("FailingReplacement", backend, tokenizer, n=3)
    # The first instance plays its episode; the two that could not be built fail theirs.
    assert trajectories[0].error is None and trajectories[0].steps
    for t in trajectories[1:]:
        assert t.error == "make_env: EnvError: env 'user_envs:FailingReplacement' with kwargs {}: its constructor " \
                          "raised RuntimeError: no more licences for the simulator"
        assert t.reward == 0.0 and t.finish_reason == "error" and t.error_kind == "make_env"


@pytest.mark.parametrize("observation", ["dict", "ints"])
def test_an_observation_that_is_not_text_or_messages_is_an_episode_error(backend, tokenizer, observation):
    _, trajectories = _episodes("BadObservation", backend, tokenizer, n=2, kwargs={"observation": observation},
                                max_turns=3)
    for t in trajectories:
        assert t.error.startswith("step: EnvError: observation ") and "is neither text nor chat messages" in t.error
        assert t.error_kind == "bad_observation"


@pytest.mark.parametrize("kind, says", [
    ("strings", "holds a str ('fr'); expected posttrain.types.Task items"),
    ("none", "returned a NoneType; expected a list of posttrain.types.Task"),
    ("text", "returned a str; expected a list of posttrain.types.Task"),
    ("ids", "holds a Task whose id (1) or prompt ('Capital?') is not a str"),
    ("raises", "raised KeyError: 'train'"),
])
def test_tasks_of_the_wrong_type_stop_with_a_message_naming_them(kind, says):
    envs = EnvPool(lambda: make_env("user_envs:BadTasks", {"kind": kind}))
    with pytest.raises(EnvError) as e:
        envs.tasks("train")
    assert str(e.value) == f"tasks('train') {says}"


def test_a_busy_looping_env_times_out_and_leaves_no_thread_spinning(backend, tokenizer):
    before = set(threading.enumerate())
    envs, trajectories = _episodes("BusyLoop", backend, tokenizer, n=2, step_timeout=0.5)
    assert all("TimeoutError: no answer within 0.5 s" in t.error for t in trajectories)

    def left():
        return [t for t in set(threading.enumerate()) - before if t.is_alive()]

    deadline = time.monotonic() + 10
    while left() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left() == []  # stopped, not just abandoned: later steps get the whole CPU


def test_a_prompt_longer_than_the_context_is_an_episode_error_at_once(backend, tokenizer):
    # 1 MB: refused from its length alone, before any tokenizing or generation.
    _, huge = _episodes("HugePrompt", backend, tokenizer, n=2)
    assert all("the observation is 999996 characters" in t.error and t.error.startswith("reset:") for t in huge)
    assert all(t.completion_ids == [] and t.error_kind == "too_long" for t in huge)
    # Just over the context: tokenized, found too long, refused.
    _, over = _episodes("HugePrompt", backend, tokenizer, n=1, kwargs={"chars": 600}, max_context=64)
    assert "tokens, more than the 64 the context holds" in over[0].error


def test_the_models_positions_bound_the_context(backend, tokenizer):
    # tiny-random has 2048 positions: a context of 10**6 tokens is cut to 2048 - max_new_tokens.
    _, trajectories = _episodes("HugePrompt", backend, tokenizer, n=1, kwargs={"chars": 12_000}, max_context=10**6)
    assert "more than the 2044 the context holds" in trajectories[0].error


def test_non_finite_rewards_are_episode_errors_with_the_reason(backend, tokenizer):
    user_envs.NonFiniteReward.calls = 0
    _, trajectories = _episodes("NonFiniteReward", backend, tokenizer, n=4)
    errors = sorted(t.error for t in trajectories if t.error)
    assert errors == [f"bad_return: ValueError: step() returned reward {r}, expected a finite number"
                      for r in ("-inf", "inf", "nan")]
    assert all(math.isfinite(t.reward) for t in trajectories)
    assert [t.reward for t in trajectories if not t.error] == [1.0]


def test_a_step_result_of_the_wrong_shape_is_an_episode_error(backend, tokenizer):
    class Lying:
        def __bool__(self):
            raise RuntimeError("no truth value")

    envs = EnvPool(lambda: make_env("user_envs:Capitals", {}))
    env = envs.take(1)[0]
    env.step = lambda action: ("", 1.0, Lying(), False, {})
    (t,) = run_episodes(envs, backend, tokenizer, [Task("fr", "Capital of France?", "Paris")], PARAMS)
    assert t.error == ("bad_return: ValueError: step() must return (observation, reward, terminated, truncated, "
                       "info): RuntimeError: no truth value")
