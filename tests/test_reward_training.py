"""The reward hook in online training: composed rewards and their metrics, a reward model in PPO,
and a dense process reward model with GRPO's process supervision (credit=step), on the tiny model."""

import json

import pytest
import torch

from posttrain.config import ConfigError, load_config
from posttrain.rewards.prm import load_prm
from posttrain.rewards.reward_model import load_reward_model
from posttrain.train import Trainer

TINY = ["model.name=tiny-random", "env.id=user_envs:Capitals", "algorithm.group_size=4", "train.tasks_per_step=1",
        "train.steps=1", "rollout.max_new_tokens=8", "eval.num_tasks=1", "eval.max_new_tokens=8",
        "eval.before_training=false"]


def _train(tmp_path, *overrides):
    cfg = load_config(None, [*TINY, f"output_dir={tmp_path / 'run'}", *overrides])
    trainer = Trainer(cfg)
    trainer.train()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    return trainer, [r for r in records if r["split"] == "train"][0]


def test_composed_reward_is_what_grpo_trains_on(tmp_path):
    trainer, metrics = _train(tmp_path, "reward.components=[{name: correctness}, {name: length, weight: 2.0, "
                              "kwargs: {max_tokens: 8}}, {name: 'user_rewards:fails_on_long_answers'}]")
    for key in ("reward/correctness", "reward/length", "reward/user_rewards:fails_on_long_answers_errors",
                "reward/total"):
        assert key in metrics
    scored = trainer.scored
    assert len(scored.total) == 4 and metrics["reward/length"] < 0  # every answer used some of its 8 tokens
    assert metrics["reward/total"] == pytest.approx(sum(scored.total) / 4, abs=1e-6)


def test_ppo_with_a_reward_model(tmp_path):
    model, tok = load_reward_model("tiny-random")
    torch.nn.init.normal_(model.score.weight, std=1.0)
    model.save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    _, metrics = _train(tmp_path, "algorithm.name=ppo",
                        f"reward.components=[{{name: reward_model, kwargs: {{path: '{tmp_path / 'rm'}'}}}}]")
    assert metrics["reward/reward_model_errors"] == 0 and metrics["reward/reward_model"] != 0
    assert metrics["optimizer_steps"] == 1 and "value_loss" in metrics


def test_grpo_with_dense_process_rewards(tmp_path):
    model, tok = load_prm("tiny-random")
    torch.nn.init.normal_(model.score.weight, std=1.0)
    model.save_pretrained(tmp_path / "prm")
    tok.save_pretrained(tmp_path / "prm")
    prm = f"{{name: prm, kwargs: {{path: '{tmp_path / 'prm'}'}}}}"
    trainer, metrics = _train(tmp_path, "algorithm.credit=step", "algorithm.beta=0",
                              f"reward.components=[{{name: correctness}}, {prm}]")
    assert all(trainer.scored.dense) and 0 < metrics["reward/prm"] < 1
    assert metrics["optimizer_steps"] == 1  # the step rewards differ, so rows train even if outcomes tie


def test_dense_rewards_need_an_algorithm_that_takes_them():
    with pytest.raises(ConfigError, match="credit=step"):
        load_config(None, [*TINY, "reward.components=[{name: prm, kwargs: {path: x}}]"])
    with pytest.raises(ConfigError, match="add {name: prm"):
        load_config(None, [*TINY, "algorithm.credit=step"])
