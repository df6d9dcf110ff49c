"""The trainer reuses the sampler's log-probabilities instead of a forward pass when they are the policy's."""

from pathlib import Path

import torch

from posttrain.config import load_config
from posttrain.train import Trainer
from posttrain.types import Batch

ROOT = Path(__file__).resolve().parents[1]


def sampled_batch(tmp_path, temperature: float):
    cfg = load_config(ROOT / "examples" / "tiny_smoke.yaml", [
        f"output_dir={tmp_path}", "algorithm.num_iterations=2", f"rollout.temperature={temperature}",
        "rollout.max_new_tokens=12", "train.tasks_per_step=2", "algorithm.group_size=4",
    ])
    trainer = Trainer(cfg)
    trajectories, _, _ = trainer.sample()
    return trainer, trajectories, Batch.from_trajectories(trajectories, trainer.policy.pad_id)


def test_behaviour_logprobs_equal_a_fresh_forward_at_temperature_1(tmp_path):
    trainer, trajectories, batch = sampled_batch(tmp_path, 1.0)
    reused = trainer.behaviour_logprobs(batch, trajectories)
    fresh = trainer.logprobs(batch)
    assert batch.loss_mask.sum() > 0
    torch.testing.assert_close(reused, fresh * batch.loss_mask, atol=1e-4, rtol=0)


def test_behaviour_logprobs_of_another_temperature_are_not_reused(tmp_path):
    trainer, trajectories, batch = sampled_batch(tmp_path, 0.7)
    assert trainer.behaviour_logprobs(batch, trajectories) is None
