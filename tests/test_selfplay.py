"""The multi-agent trainer on the tiny model: self-play, fixed and pool opponents, per-role adapters."""

import json
import math

import pytest
import torch
from cli_inprocess import assert_one_line_error, invoke, tiny_config

from posttrain.config import ConfigError, load_config
from posttrain.train.selfplay import SelfPlayTrainer


def config(tmp_path, *overrides):
    return load_config(None, [
        "model.name=tiny-random", "env.id=tictactoe", "algorithm.group_size=2", "train.steps=1",
        "train.tasks_per_step=2", "train.microbatch_size=4", "rollout.max_new_tokens=3", "eval.max_new_tokens=3",
        "eval.num_tasks=2", "multi_agent.eval_opponents=[random]", f"output_dir={tmp_path / 'run'}",
        "train.learning_rate=1e-3", *overrides,
    ])


def records(run_dir, split):
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["split"] == split]


def test_self_play_step_trains_every_seat_and_reports_per_role_results(tmp_path):
    result = SelfPlayTrainer(config(tmp_path)).train()
    (train,) = records(result.run_dir, "train")
    assert train["trained_trajectories"] == 8  # 2 seeds x 2 games x 2 seats
    assert train["x/games"] == train["o/games"] == 4
    assert math.isfinite(train["policy_loss"]) and train["grad_norm"] > 0
    for key in ("random/x/win", "random/o/loss", "random/invalid_rate", "random/payoff"):
        assert key in result.after and key in result.before
    assert result.after["random/games"] == 4  # 2 held-out seeds x 2 roles
    assert (result.run_dir / "checkpoints" / "step-000001" / "model").is_dir()


def test_checkpoint_every_saves_the_live_policy_between_steps(tmp_path):
    """Checkpoints every 2 steps and at the end, each of the policy's own weights (a pool opponent's snapshot is
    loaded into the same model while it plays)."""
    trainer = SelfPlayTrainer(config(tmp_path, "train.steps=3", "train.checkpoint_every=2", "multi_agent.opponent=pool",
                                     "multi_agent.pool_every=1"))
    trainer.train()
    checkpoints = trainer.run_dir / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-000002", "step-000003"]
    from safetensors.torch import load_file

    saved = load_file(str(checkpoints / "step-000003" / "model" / "model.safetensors"))
    live = trainer.policy.model.state_dict()
    assert all(torch.equal(saved[name], live[name]) for name in saved)


@pytest.mark.parametrize("advantage", ["role_groups", "groups"])
def test_group_baselines_per_role_or_pooled(tmp_path, advantage):
    trainer = SelfPlayTrainer(config(tmp_path, f"multi_agent.advantage={advantage}"))
    metrics = trainer.train_step()
    assert metrics["trained_trajectories"] == 8 and math.isfinite(metrics["policy_loss"])


def test_fixed_opponent_only_trains_the_policy_seats(tmp_path):
    trainer = SelfPlayTrainer(config(tmp_path, "env.id=kuhn_poker", "multi_agent.opponent=scripted"))
    metrics = trainer.train_step()
    assert metrics["trained_trajectories"] == 4  # one policy seat per game, each role in turn
    assert metrics["player_0/games"] == metrics["player_1/games"] == 2


def test_pool_opponent_plays_a_past_policy(tmp_path):
    cfg = config(tmp_path, "multi_agent.opponent=pool", "multi_agent.pool_every=1", "train.steps=2")
    trainer = SelfPlayTrainer(cfg)
    trainer.train()
    assert trainer.pool.added == 2 and len(trainer.pool) == 2
    # The live weights are back after the pool player generated.
    snapshot = trainer.pool.snapshots[-1]
    assert all(torch.equal(p, s) for p, s in zip(trainer.params, snapshot))
    (_, second) = records(trainer.run_dir, "train")
    assert second["trained_trajectories"] == 4  # against the pool: one policy seat per game


def test_per_role_adapters_train_only_their_role(tmp_path):
    cfg = config(tmp_path, "model.lora.enabled=true", "multi_agent.policies=per_role", "multi_agent.train_roles=[x]")
    trainer = SelfPlayTrainer(cfg)
    model = trainer.policy.model
    assert set(model.peft_config) == {"role_x", "role_o"}
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_B" in n}
    trainer.train_step()
    changed = {n for n, p in model.named_parameters() if n in before and not torch.equal(p, before[n])}
    assert changed and all(".role_x." in n for n in changed)


def test_coder_tester_trains_on_the_shared_hidden_test_reward(tmp_path):
    cfg = config(tmp_path, "env.id=coder_tester", "multi_agent.eval_opponents=[self]", "rollout.max_new_tokens=12",
                 "eval.max_new_tokens=12")
    result = SelfPlayTrainer(cfg).train()
    (train,) = records(result.run_dir, "train")
    assert train["trained_trajectories"] == 8 and train["errors"] == 0
    assert train["tester/payoff"] == train["coder/payoff"]  # the reward is shared
    assert "self/coder/payoff" in result.after


@pytest.mark.parametrize("overrides,message", [
    (["multi_agent.policies=per_role"], "model.lora.enabled"),
    (["env.id=coder_tester"], "no random or scripted player"),
    (["multi_agent.train_roles=[z]"], "not roles of tictactoe"),
    (["env.id=arithmetic"], "single-agent"),
])
def test_bad_multi_agent_configs_say_what_is_wrong(tmp_path, overrides, message):
    with pytest.raises((ConfigError, ValueError), match=message):
        SelfPlayTrainer(config(tmp_path, *overrides))


@pytest.mark.slow
def test_posttrain_train_runs_the_example_self_play_config(tmp_path):
    """`posttrain train examples/tictactoe_selfplay.yaml` dispatches to the multi-agent trainer, and `--resume`
    continues it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    proc = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "train", "examples/tictactoe_selfplay.yaml", "--set",
         "model.name=tiny-random", "--set", "train.steps=1", "--set", "eval.num_tasks=2", "--set",
         f"output_dir={tmp_path / 'run'}"], capture_output=True, text=True, cwd=root, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "opponent" in proc.stdout and "random" in proc.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 1 and "random/win" in summary["after"]
    resumed = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "train", "examples/tictactoe_selfplay.yaml", "--set",
         "model.name=tiny-random", "--set", "train.steps=2", "--set", "eval.num_tasks=2", "--resume",
         str(tmp_path / "run")], capture_output=True, text=True, cwd=root, env=env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["before"] is None  # continued from step 1, not evaluated again
    bad = subprocess.run([sys.executable, "-m", "posttrain.cli", "train", "examples/tictactoe_selfplay.yaml", "--set",
                          "multi_agent.policies=per_role"], capture_output=True, text=True, cwd=root, env=env)
    assert bad.returncode == 2 and "model.lora.enabled" in bad.stderr and "Traceback" not in bad.stderr


def _train_records(run_dir):
    timing = ("seconds", "tokens_per_second")
    return [{k: v for k, v in r.items() if not k.endswith(timing) and k != "time"} for r in records(run_dir, "train")]


@pytest.mark.parametrize("extra", [[], ["model.lora.enabled=true", "multi_agent.policies=per_role"]],
                         ids=["full-fine-tuning", "per-role-adapters"])
def test_a_resumed_self_play_run_equals_an_uninterrupted_one(tmp_path, extra):
    """Two steps, then --resume to four, against four at once: every train metric and the final weights equal,
    with sampled moves, SPIRAL's role baselines and a pool of past policies as opponents carried across."""
    common = ["env.id=kuhn_poker", "train.checkpoint_every=2", "multi_agent.opponent=pool",  # cards dealt by seed
              "multi_agent.pool_every=1", "rollout.temperature=1.0", *extra]
    whole = SelfPlayTrainer(config(tmp_path / "whole", "train.steps=4", *common))
    whole.train()
    SelfPlayTrainer(config(tmp_path / "cut", "train.steps=2", *common)).train()
    resumed = SelfPlayTrainer(config(tmp_path / "cut", "train.steps=4", *common), resume=tmp_path / "cut" / "run")
    assert resumed.step == 2 and len(resumed.pool) == 2 and resumed.baselines  # restored, not started afresh
    resumed.train()
    assert _train_records(resumed.run_dir) == _train_records(whole.run_dir)
    assert len(_train_records(whole.run_dir)) == 4
    live, again = whole.policy.model.state_dict(), resumed.policy.model.state_dict()
    assert all(torch.equal(live[name], again[name]) for name in live)


@pytest.mark.parametrize("command", [["collect", "--out", "store", "--n", "1"], ["sft"]])
def test_single_agent_commands_refuse_a_multi_agent_env_in_one_line(tmp_path, command):
    config = tiny_config(tmp_path, env={"id": "tictactoe", "kwargs": {}}, offline={"method": "sft"})
    ended = invoke(command[0], config, *[str(tmp_path / a) if a == "store" else a for a in command[1:]])
    assert_one_line_error(ended, f"`posttrain {command[0]}` plays single-agent", "'tictactoe' is a multi-agent env")
    assert not (tmp_path / "store").exists() and not (tmp_path / "run").exists()  # refused before anything is written


def _games_json(ended) -> dict:
    assert ended.exit_code == 0 and ended.exception is None, ended.stderr[-2000:]
    return {k: v for k, v in json.loads(ended.stdout.splitlines()[-1]).items() if "/" in k}


@pytest.mark.parametrize("lora, policies", [(False, "shared"), (True, "shared"), (True, "per_role")],
                         ids=["full-fine-tuning", "shared-adapter", "per-role-adapters"])
def test_eval_plays_a_checkpoints_held_out_games_as_the_run_did(tmp_path, lora, policies):
    """`posttrain eval` of a multi-agent config gives the games the run's own evaluations logged: with
    --checkpoint step-2 its step-2 evaluation (every role's adapter loaded), without one its evaluation before
    training. The tiny model's moves are all invalid, but how long it talks depends on its weights: replies are
    sampled and stop at common letters, so the games' completion_tokens tell the policies apart."""
    config = tiny_config(tmp_path, env={"id": "kuhn_poker", "kwargs": {}},
                         model={"lora": {"enabled": lora, "r": 4}},
                         multi_agent={"policies": policies, "eval_opponents": ["random", "self"]},
                         train={"steps": 2, "tasks_per_step": 2, "learning_rate": 0.05},
                         algorithm={"group_size": 2},
                         rollout={"temperature": 1.0, "max_new_tokens": 12, "stop": ["a", "e", "o"]},
                         eval={"num_tasks": 6, "temperature": 1.0, "max_new_tokens": 12})
    ended = invoke("train", config)
    assert ended.exit_code == 0 and ended.exception is None, ended.stderr[-2000:]
    run = tmp_path / "run"
    logged = {r["step"]: {k: v for k, v in r.items() if "/" in k} for r in records(run, "eval")}
    assert sorted(logged) == [0, 2] and logged[0] != logged[2]

    assert _games_json(invoke("eval", config, "--checkpoint", run / "checkpoints" / "step-000002", "--json")) \
        == logged[2]
    assert _games_json(invoke("eval", config, "--json")) == logged[0]
    table = invoke("eval", config, "--checkpoint", run / "checkpoints" / "step-000002" / "model")
    assert table.exit_code == 0 and "random" in table.stdout and "invalid moves" in table.stdout

    if lora:  # a checkpoint of the other kind of run
        other = "shared" if policies == "per_role" else "per_role"
        ended = invoke("eval", config, "--set", f"multi_agent.policies={other}", "--checkpoint",
                       run / "checkpoints" / "step-000002")
        assert_one_line_error(ended, "--checkpoint", "step-000002")
