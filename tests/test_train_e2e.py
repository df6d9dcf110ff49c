"""End to end through the CLI: `posttrain train` then `posttrain eval` on the tiny model."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

pytestmark = pytest.mark.slow  # end to end through CLI subprocesses: `make test`, not `make test-fast`

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args):
    # tests/ on the path so that configs can name the user environments in tests/user_envs.py;
    # src/ first so that the checkout under test is the one imported, whatever is installed.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])}
    return subprocess.run([sys.executable, "-m", "posttrain.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, env=env)


def tiny_config(tmp_path, **sections):
    cfg = yaml.safe_load((ROOT / "examples" / "tiny_smoke.yaml").read_text())
    for key, value in sections.items():
        cfg.setdefault(key, {}).update(value)
    cfg["output_dir"] = str(tmp_path / "run")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize(
    "extra",
    [
        {"algorithm": {"beta": 0.04, "num_iterations": 2, "loss_aggregation": "sequence"}},
        # No KL: only rows with non-zero advantage train, so use an env whose rewards vary.
        {"algorithm": {"beta": 0.0}, "model": {"lora": {"enabled": True, "r": 4}},
         "env": {"id": "user_envs:Capitals", "kwargs": {}}, "eval": {"num_tasks": 1}},
        {"model": {"autocast": "bfloat16"}},
    ],
    ids=["full-kl-2iters", "lora-nokl", "bf16-autocast"],
)
def test_train_two_steps_writes_checkpoint_metrics_and_events(tmp_path, extra):
    config = tiny_config(tmp_path, **extra)
    proc = run_cli("train", config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "run"
    assert "before" in proc.stdout and "after" in proc.stdout
    name = yaml.safe_load(config.read_text())["model"]["name"]
    assert re.search(rf"posttrain: {name} on \S+, 2 steps in [\d.]+ min\n", proc.stdout), proc.stdout  # one line

    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    evals = [r for r in records if r["split"] == "eval"]
    assert [r["step"] for r in train] == [1, 2]
    assert [r["step"] for r in evals] == [0, 2]
    for r in train:
        for key in ("loss", "reward_mean", "reward_std", "accuracy", "grad_norm", "entropy", "clip_low", "clip_high",
                    "tokens_per_second", "step_seconds"):
            assert math.isfinite(r[key]), (key, r)
        assert r["optimizer_steps"] >= 1
    algorithm = yaml.safe_load(config.read_text())["algorithm"]
    if algorithm["beta"] > 0:
        assert all(math.isfinite(r["kl"]) for r in train)
    if algorithm.get("num_iterations") == 2:
        assert all(r["optimizer_steps"] == 2 for r in train)  # num_iterations passes over one minibatch

    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    ckpt = run / "checkpoints" / "step-000002"
    weights = "adapter_model.safetensors" if extra.get("model", {}).get("lora") else "model.safetensors"
    assert (ckpt / "model" / weights).is_file() and (ckpt / "trainer_state.pt").is_file()

    proc = run_cli("eval", config, "--checkpoint", ckpt, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    summary = json.loads((run / "summary.json").read_text())
    assert result["accuracy"] == summary["after"]["accuracy"]  # greedy eval is reproducible
    assert result["num_tasks"] == len([json.loads(x) for x in (run / "eval_samples" / "step-000002.jsonl").open()])


def test_training_changes_the_weights(tmp_path):
    """Rewards that vary within a group give non-zero advantages, so two steps move the weights."""
    from safetensors.torch import load_file

    from posttrain.models import resolve_model_path

    config = tiny_config(tmp_path, algorithm={"beta": 0.0}, train={"learning_rate": 1e-3},
                         env={"id": "user_envs:Capitals", "kwargs": {}}, eval={"num_tasks": 1})
    assert run_cli("train", config).returncode == 0
    before = load_file(Path(resolve_model_path("tiny-random")) / "model.safetensors")
    after = load_file(tmp_path / "run" / "checkpoints" / "step-000002" / "model" / "model.safetensors")
    assert any(not (before[k] == after[k]).all() for k in before)


@pytest.mark.parametrize("env_class", ["Capitals", "Exploding"])
def test_user_env_named_in_config_trains(tmp_path, env_class):
    # Two sampled held-out episodes, so that Exploding fails one of them, not every one (a run whose
    # every held-out episode fails stops with exit 2, tested in test_faults_training.py).
    config = tiny_config(tmp_path, env={"id": f"user_envs:{env_class}", "kwargs": {}},
                         eval={"num_tasks": 1, "samples_per_task": 2, "temperature": 0.7})
    proc = run_cli("train", config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    train = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["split"] == "train"]
    assert len(train) == 2
    assert all(math.isfinite(r["loss"]) and r["optimizer_steps"] >= 1 for r in train)
    errors = sum(r["errors"] for r in train)
    assert errors == (8 if env_class == "Exploding" else 0)


@pytest.mark.parametrize(
    "algorithm",
    [
        {"name": "grpo"},
        {"name": "dr_grpo"},
        {"name": "dapo", "overlong_buffer": 8},
        {"name": "rloo"},
        {"name": "reinforce_pp", "beta": 0.04},
        {"name": "gspo", "num_iterations": 2},
        {"name": "ppo", "beta": 0.05, "entropy_coef": 0.01},
        {"name": "ppo", "gae_level": "turn", "kl_in_reward": False, "beta": 0.05},
        {"name": "ppo", "value_model": "separate", "kl_in_reward": False, "beta": 0.05, "kl_estimator": "k3", "kl_target": 0.1},
    ],
    ids=lambda a: "-".join(str(v) for k, v in a.items() if k in ("name", "value_model", "gae_level")),
)
def test_each_algorithm_trains_end_to_end(tmp_path, algorithm):
    config = tiny_config(tmp_path, algorithm={"beta": 0.0, **algorithm}, env={"id": "user_envs:Capitals", "kwargs": {}},
                         eval={"num_tasks": 1})
    proc = run_cli("train", config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    assert len(train) == 2
    for r in train:
        assert r["optimizer_steps"] >= 1, r
        assert all(math.isfinite(r[k]) for k in ("loss", "grad_norm", "entropy", "clip_low", "clip_high", "ratio_max"))
    if algorithm["name"] == "dapo":
        assert all(r["sampling_rounds"] >= 1 for r in train)
    if algorithm["name"] == "ppo":
        assert all(math.isfinite(r["value_loss"]) and math.isfinite(r["kl"]) for r in train)
        state = torch.load(tmp_path / "run" / "checkpoints" / "step-000002" / "trainer_state.pt", weights_only=False)
        assert "head.weight" in state["critic"]


def test_multi_turn_env_trains_with_turn_level_ppo(tmp_path):
    config = tiny_config(
        tmp_path, env={"id": "user_envs:GuessNumber", "kwargs": {"max_guesses": 3}}, rollout={"max_turns": 3},
        algorithm={"name": "ppo", "gae_level": "turn", "kl_in_reward": False, "beta": 0.0}, eval={"num_tasks": 2},
    )
    proc = run_cli("train", config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    train = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["split"] == "train"]
    assert all(r["optimizer_steps"] >= 1 and math.isfinite(r["value_loss"]) for r in train)
    # Several turns per episode: more sampled tokens than one turn of rollout.max_new_tokens can hold.
    assert max(r["completion_tokens_mean"] for r in train) > 16


def test_hanging_env_times_out_and_training_goes_on(tmp_path):
    # Two held-out episodes: at most one of two consecutive steps hangs, so not every one fails.
    config = tiny_config(tmp_path, env={"id": "user_envs:Hanging", "kwargs": {}, "step_timeout": 1.0},
                         eval={"num_tasks": 1, "samples_per_task": 2, "temperature": 0.7}, algorithm={"beta": 0.0})
    proc = run_cli("train", config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    train = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["split"] == "train"]
    assert len(train) == 2
    assert sum(r["env_timeouts"] for r in train) >= 2
    assert all(r["errors"] >= r["env_timeouts"] for r in train)


def _train_records(run_dir):
    return [r for r in (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
            if r["split"] == "train"]


def test_malformed_tool_calls_are_counted_and_training_completes(tmp_path):
    # The random model never writes a well-formed call: every turn is malformed and penalised.
    config = tiny_config(tmp_path, env={"id": "tool_math", "kwargs": {"malformed_penalty": 0.1, "max_tool_calls": 2}},
                         rollout={"max_turns": 3}, eval={"num_tasks": 2}, algorithm={"beta": 0.0})
    proc = run_cli("train", config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    train = _train_records(tmp_path / "run")
    assert len(train) == 2
    for r in train:
        assert r["malformed_tool_calls"] >= r["samples"]  # at least one per episode
        assert r["malformed_tool_calls"] <= r["tool_calls"] and r["errors"] == 0
        assert -0.2 - 1e-6 <= r["reward_mean"] < 0


@pytest.mark.parametrize("env, min_turns", [
    ({"id": "sql_qa", "kwargs": {"num_eval": 2}}, 2),
    ({"id": "wordle", "kwargs": {"max_guesses": 2, "progress_reward": 0.2}}, 2),
    ({"id": "reflexion", "kwargs": {"env": "arithmetic", "max_attempts": 2}}, 2),
    # Random text is no JSON call: a final answer, one turn.
    ({"id": "tool_math", "kwargs": {"call_format": "json"}}, 1),
], ids=["sql_qa", "wordle", "reflexion", "tool_math-json"])
def test_agent_envs_train_with_per_turn_credit(tmp_path, env, min_turns):
    config = tiny_config(tmp_path, env=env, rollout={"max_turns": 3, "max_new_tokens": 8}, eval={"num_tasks": 2},
                         algorithm={"beta": 0.0, "credit": "turn"}, train={"steps": 1})
    proc = run_cli("train", config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (record,) = _train_records(tmp_path / "run")
    assert record["turns_mean"] >= min_turns and record["errors"] == 0 and math.isfinite(record["loss"])


def test_envs_lists_every_env_with_a_description():
    proc = run_cli("envs")
    assert proc.returncode == 0
    lines = dict(line.split(None, 1) for line in proc.stdout.splitlines())
    assert set(lines) >= {"arithmetic", "tool_math", "sql_qa", "wordle", "reflexion"}
    assert all(len(description) > 20 for description in lines.values())
