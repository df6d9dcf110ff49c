"""Asynchronous rollouts (train.async_steps) and the truncated importance weights that correct them."""

import math
import time
from pathlib import Path

import pytest
import torch

from posttrain.algorithms.losses import grpo_loss
from posttrain.algorithms.off_policy import logprob_mismatch, truncated_importance_weights
from posttrain.config import ConfigError, load_config
from posttrain.train import Trainer
from posttrain.train.async_rollout import AsyncSampler

ROOT = Path(__file__).resolve().parents[1]


def test_truncated_importance_weights_are_the_capped_ratio_without_gradient():
    trainer_lp = torch.tensor([[math.log(0.5), math.log(0.9), math.log(0.1)]], requires_grad=True)
    sampler_lp = torch.log(torch.tensor([[0.5, 0.3, 0.4]]))
    w = truncated_importance_weights(trainer_lp, sampler_lp, cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.0, 2.0, 0.25]]))  # 0.9 / 0.3 = 3 is capped at 2
    assert not w.requires_grad
    assert torch.equal(truncated_importance_weights(trainer_lp, sampler_lp, cap=0.0), torch.ones(1, 3))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert float(logprob_mismatch(sampler_lp, trainer_lp.detach(), mask)) == pytest.approx(math.log(3) / 2)


def test_token_weights_scale_each_tokens_policy_gradient():
    lp = torch.zeros(1, 2, requires_grad=True)
    adv, mask = torch.ones(1, 2), torch.ones(1, 2)
    loss, _ = grpo_loss(lp, lp.detach(), adv, mask, token_weights=torch.tensor([[2.0, 0.5]]))
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-1.0, -0.25]]))  # -w_t * A_t / 2 tokens


def config(tmp_path, *overrides):
    return load_config(ROOT / "examples" / "tiny_smoke.yaml", [
        f"output_dir={tmp_path}", "env.id=user_envs:Capitals", "env.kwargs={}", "algorithm.beta=0",
        "rollout.max_new_tokens=8", "train.tasks_per_step=2", "algorithm.group_size=4", "eval.num_tasks=1",
        "eval.before_training=false", "train.learning_rate=1e-3", *overrides])


def test_async_training_logs_staleness_within_k(tmp_path):
    k = 1
    trainer = Trainer(config(tmp_path, f"train.async_steps={k}", "train.steps=5"))
    logged = []
    trainer.ctx.log = lambda split, step, metrics: logged.append((split, metrics))
    result = trainer.train()
    train = [m for split, m in logged if split == "train"]
    assert result.steps == 5 and len(train) == 5
    assert all(m["staleness_max"] <= k for m in train), [m["staleness_max"] for m in train]
    assert train[0]["staleness_max"] == 0  # the first batch is sampled before any update
    assert all(m["optimizer_steps"] == 1 and "tis_weight_mean" in m for m in train)
    assert all(0 < m["tis_weight_mean"] <= 2.0 for m in train)  # algorithm.tis_cap


def test_admission_keeps_the_sampler_at_most_k_updates_ahead(tmp_path):
    trainer = Trainer(config(tmp_path, "train.async_steps=1"))
    sampler = AsyncSampler(trainer.ctx, trainer.sample, steps=4, k=1)
    try:
        wait_for(lambda: sampler.pending() == 2)  # batches 0 and 1 may start at version 0
        time.sleep(3.0)  # a batch takes well under this: a third would have been sampled by now
        assert sampler.pending() == 2
        with sampler.updating():  # the trainer's first update: version 1 admits batch 2
            pass
        wait_for(lambda: sampler.pending() == 3)
        versions = [[t.policy_version for t in sampler.next()[0]] for _ in range(3)]
        assert [set(v) for v in versions] == [{0}, {0}, {1}]
    finally:
        sampler.close()


def wait_for(condition, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_synchronous_trajectories_carry_the_policy_version(tmp_path):
    trainer = Trainer(config(tmp_path))
    trainer.step = 1
    trainer.train_step()
    trajectories, _, _ = trainer.sample()
    assert {t.policy_version for t in trajectories} == {1}


def test_async_needs_the_samplers_own_distribution():
    with pytest.raises(ConfigError, match="rollout.temperature=1"):
        load_config(ROOT / "examples" / "tiny_smoke.yaml", ["train.async_steps=1", "rollout.temperature=0.7"])
