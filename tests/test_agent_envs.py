"""The shipped agent environments: gymnasium's checker, episodes turn by turn, and the agent loop."""

import json

import pytest
from gymnasium.utils.env_checker import check_env

from posttrain.envs import make_env, registered
from posttrain.envs.sql_qa import answers_match
from posttrain.envs.wordle import feedback, parse_guess
from posttrain.rollout import EnvPool, SamplingParams, run_episodes
from posttrain.rollout.backend import Generation


@pytest.mark.parametrize("spec", [s for s in registered() if not s.multi_agent], ids=lambda s: s.id)
def test_every_registered_env_passes_gymnasium_check_env(spec):
    env = make_env(spec.id, spec.example_kwargs)
    check_env(env, skip_render_check=True)
    assert env.tasks("train") and env.tasks("eval")
    assert not {t.id for t in env.tasks("train")} & {t.id for t in env.tasks("eval")}


def test_tool_math_episode_calls_the_calculator_then_answers():
    env = make_env("tool_math", {"malformed_penalty": 0.1})
    task = env.tasks("eval")[0]
    a, b = task.metadata["expression"].split(" * ")
    obs, info = env.reset(options={"task": task})
    assert obs[-1] == {"role": "user", "content": task.prompt}
    assert obs[1]["content"].startswith("Action: calculator")  # a worked example precedes the question
    obs, reward, terminated, truncated, info = env.step("I am not sure.")
    assert obs[0]["content"].startswith("Observation: Error: no action found")
    assert (reward, terminated, truncated, info["malformed_call"]) == (-0.1, False, False, True)
    obs, reward, terminated, _, info = env.step(f"Thought: multiply\nAction: calculator\nAction Input: {a} * {b}")
    assert obs == ({"role": "user", "content": f"Observation: {task.answer}"},)
    assert (reward, terminated, info["tool"]) == (0.0, False, "calculator")
    obs, reward, terminated, _, info = env.step(f"Final Answer: {task.answer}")
    assert (obs, reward, terminated, info["correct"], info["tool_calls"]) == ((), 1.0, True, True, 2)


def test_tool_env_ends_the_episode_when_calls_run_out():
    env = make_env("tool_math", {"max_tool_calls": 2})
    env.reset(options={"task": env.tasks("eval")[0]})
    assert env.step("Action: calculator\nAction Input: 1 + 1")[3] is False
    *_, truncated, info = env.step("Action: calculator\nAction Input: 1 / 0")
    assert truncated and info["tool_error"]


def test_json_format_passes_tools_to_the_template_and_answers_as_tool_messages():
    env = make_env("tool_math", {"call_format": "json"})
    obs, info = env.reset(options={"task": env.tasks("eval")[0]})
    assert info["tools"][0]["function"]["name"] == "calculator"
    example_call = json.loads(obs[1]["content"])
    assert example_call == {"name": "calculator", "arguments": {"expression": "10 * 73"}}
    assert obs[2] == {"role": "tool", "content": "730"}
    obs, *_ = env.step('{"name": "calculator", "arguments": {"expression": "6 * 7"}}')
    assert obs == ({"role": "tool", "content": "42"},)


def test_sql_qa_reference_queries_answer_every_question():
    env = make_env("sql_qa", {"examples": 0})
    for task in env.tasks("eval")[:20]:
        env.reset(options={"task": task})
        obs, *_ = env.step(f"Action: sql\nAction Input: {task.metadata['sql']}")
        result = obs[0]["content"].removeprefix("Observation: ")
        assert env.step(f"Final Answer: {result}")[1] == 1.0, task
    assert answers_match("There are 12.", 12) and answers_match("'Oslo'.", "Oslo") and not answers_match("Lima", "Oslo")


@pytest.mark.parametrize("guess, target, marks", [
    ("crane", "cider", "GY--Y"), ("speed", "abide", "--Y-Y"), ("eerie", "there", "Y-Y-G"), ("tight", "tight", "GGGGG"),
])
def test_wordle_feedback_counts_repeated_letters(guess, target, marks):
    assert feedback(guess, target) == marks


def test_wordle_episode_rewards_progress_and_the_solution():
    env = make_env("wordle", {"max_guesses": 3, "progress_reward": 0.5})
    task = next(t for t in env.tasks("eval") if t.answer != "crane")
    env.reset(options={"task": task})
    assert parse_guess("I think... Guess: CRANE") == "crane"
    obs, reward, terminated, truncated, info = env.step("no idea")
    assert info["invalid_guess"] and "2 tries left" in obs and not truncated
    filler = next(c for c in "qxjzv" if c not in task.answer)
    guess = task.answer[:2] + filler * 3
    obs, reward, *_ = env.step(f"Guess: {guess}")
    assert reward == pytest.approx(0.5 * 2 / 5) and obs.startswith(f"{guess.upper()}: G G")
    obs, reward, terminated, truncated, info = env.step(f"Guess: {task.answer}")
    assert (reward, terminated, info["correct"]) == (1.0, True, True)


def test_reflexion_keeps_the_reflection_and_retries_the_same_task():
    env = make_env("reflexion", {"env": "tool_math", "max_attempts": 2})
    task = env.tasks("eval")[0]
    env.reset(options={"task": task})
    obs, reward, terminated, _, info = env.step("Final Answer: 1")
    assert "reflect" in obs[0]["content"] and (reward, terminated, info["attempt_reward"]) == (0.0, False, 0.0)
    obs, reward, terminated, _, info = env.step("I guessed; I should use the calculator.")
    assert obs[0]["content"].endswith(task.prompt) and info["reflection"].startswith("I guessed")
    obs, reward, terminated, _, info = env.step(f"Final Answer: {task.answer}")
    assert (reward, terminated, info["correct"], info["attempt"]) == (1.0, True, True, 2)
    # The last attempt's failure ends the episode.
    env.reset(options={"task": task})
    env.step("Final Answer: 1")
    env.step("reflection")
    assert env.step("Final Answer: 2")[2] is True


class ScriptedAgent:
    """A GenerationBackend that types fixed replies (a scripted policy), turn after turn."""

    def __init__(self, tokenizer, replies):
        self.tokenizer, self.replies, self.turn = tokenizer, replies, 0

    def generate(self, prompts, params, num_samples=1):
        text = self.replies[self.turn]
        self.turn += 1
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return [Generation(list(ids), [-0.5] * len(ids), "stop") for _ in range(len(prompts) * num_samples)]


def test_agent_loop_runs_tool_calls_with_environment_tokens_masked(tokenizer):
    envs = EnvPool(lambda: make_env("tool_math", {"malformed_penalty": 0.25}))
    task = envs.tasks("eval")[0]
    a, b = task.metadata["expression"].split(" * ")
    replies = ["hmm", f"Action: calculator\nAction Input: {a} * {b}", f"Final Answer: {task.answer}"]
    (traj,) = run_episodes(envs, ScriptedAgent(tokenizer, replies), tokenizer, [task], SamplingParams(), max_turns=4)
    assert traj.error is None and traj.correct
    assert traj.step_rewards == [-0.25, 0.0, 1.0] and traj.reward == 0.75  # the return sums the steps
    sampled = [i for i, m in zip(traj.completion_ids, traj.loss_mask) if m]
    expected = sum((tokenizer.encode(r, add_special_tokens=False) + [tokenizer.eos_token_id] for r in replies), [])
    assert sampled == expected
    environment_text = tokenizer.decode([i for i, m in zip(traj.completion_ids, traj.loss_mask) if not m])
    assert f"Observation: {task.answer}" in environment_text and "Observation: Error: no action found" in environment_text
    assert f"Action Input: {a} * {b}" not in environment_text  # what the agent wrote is never environment text
