"""Expert demonstrations for the web envs: rollout-format conversations of solved episodes only,
whose actions solve the task again when replayed, readable by the SFT loader."""

import json

import pytest
from test_train_e2e import run_cli

from posttrain.data.demonstrations import load_demonstrations
from posttrain.envs.contract import as_messages
from posttrain.envs.web import MiniWoBEnv
from posttrain.envs.web.actions import parse_action
from posttrain.envs.web.demonstrations import write_demonstrations
from posttrain.models import load_tokenizer
from posttrain.rollout.episodes import encode_prompt

TASKS = ["click-button", "enter-text", "login-user"]  # 1, 2 and 3 actions


@pytest.fixture(scope="module")
def env():
    env = MiniWoBEnv(tasks=TASKS, max_steps=3)
    yield env
    env.close()


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_turn_of_a_solved_episode_is_a_record_that_replays(env, tmp_path):
    tasks = list(env.tasks("train"))[:6]  # two seeds of each task
    for task, actions in zip(tasks, [1, 2, 3] * 2):
        out = tmp_path / f"{task.id.replace('/', '_')}.jsonl"
        result = write_demonstrations(env, [task], out, max_turns=3)
        assert (result.episodes, result.solved, result.records, result.unsolved) == (1, 1, actions, [])
        records = [r["messages"] for r in read(out)]
        assert [len(m) for m in records] == [2 * (k + 1) for k in range(actions)]  # one record per turn
        conversation = records[-1]
        assert all(m[:-1] == conversation[: len(m) - 1] for m in records)  # each a prefix of the episode
        assert [m["role"] for m in conversation] == ["user", "assistant"] * actions  # the rollout's alternation
        # Replayed in a new episode of the same task, every observation is the one recorded, and it solves it.
        observation, _ = env.reset(options={"task": task})
        for k in range(actions):
            assert as_messages(observation) == [conversation[2 * k]]
            action = conversation[2 * k + 1]["content"]
            parse_action(action)  # every target is an action the env parses
            observation, _, _, _, info = env.step(action)
        assert info["correct"]


def test_episodes_the_expert_does_not_finish_are_left_out(env, tmp_path):
    out = tmp_path / "demos.jsonl"
    tasks = list(env.tasks("train"))[:3]
    result = write_demonstrations(env, tasks, out, max_turns=2)  # login-user needs three actions
    assert result.solved == 2 and result.unsolved == [tasks[2].id]
    assert len(read(out)) == 1 + 2


def test_the_sft_loader_reads_them_as_the_rollout_renders_them(env, tmp_path):
    out = tmp_path / "demos.jsonl"
    write_demonstrations(env, list(env.tasks("train"))[1:2], out, max_turns=3)  # enter-text: two turns
    tokenizer = load_tokenizer("tiny-random")
    records, demos = read(out), load_demonstrations(out, tokenizer)
    assert len(demos) == len(records) == 2
    for record, demo in zip(records, demos):
        *context, answer = record["messages"]
        assert demo.prompt_ids == encode_prompt(tokenizer, context)
        assert demo.completion_ids == tokenizer.encode(answer["content"], add_special_tokens=False) + [
            tokenizer.eos_token_id]


def test_cli_writes_them_and_refuses_an_env_without_an_expert(tmp_path):
    out = tmp_path / "demos.jsonl"
    done = run_cli("demonstrate", "examples/miniwob_sft.yaml", "--out", out, "--tasks", "3")
    assert done.returncode == 0, done.stderr
    assert "from 3 of 3 expert episodes" in done.stdout and len(read(out)) >= 3
    refused = run_cli("demonstrate", "examples/arithmetic_grpo.yaml", "--out", tmp_path / "x.jsonl", "--tasks", "3")
    assert refused.returncode == 2
    assert "no scripted expert for ArithmeticEnv" in refused.stderr and "Traceback" not in refused.stderr
    assert list(tmp_path.glob("x.jsonl*")) == []  # neither the file nor a half-written one
