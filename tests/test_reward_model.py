"""Reward-model training on a store and scoring inside reward composition, with the tiny-random backbone."""

import json

import pytest
import torch

from posttrain.config import ConfigError, RewardSection, load_config
from posttrain.data.store import DataError, TrajectoryStore
from posttrain.rewards.composition import RewardComposer
from posttrain.rewards.rm_train import train_reward_model
from posttrain.types import Step, Task, Trajectory


def _traj(task_id, prompt, completion, reward):
    n = len(completion)
    return Trajectory(Task(task_id, "q"), prompt, completion, [1] * n, [0.0] * n,
                      [Step("a", "", reward, True, False, {"correct": reward == 1.0})], reward=reward)


def _store(path, tasks=20):
    """Every task: two successes whose answers hold token 300, two failures with token 700 instead."""
    g = torch.Generator().manual_seed(0)
    trajs = []
    for k in range(tasks):
        prompt = torch.randint(10, 1000, (4,), generator=g).tolist()
        for good in (True, True, False, False):
            noise = torch.randint(10, 1000, (3,), generator=g).tolist()
            trajs.append(_traj(f"task-{k}", prompt, noise + [300 if good else 700, 2], float(good)))
    TrajectoryStore(path).append(trajs, "run")
    return trajs


def test_reward_model_learns_held_out_preferences_and_scores_trajectories(tmp_path):
    trajs = _store(tmp_path / "store")
    cfg = load_config(None, [f"reward_model.store={tmp_path / 'store'}", "model.name=tiny-random",
                             "reward_model.learning_rate=3e-3", "reward_model.epochs=3",
                             "reward_model.eval_fraction=0.25",
                             f"output_dir={tmp_path / 'run'}"])
    result = train_reward_model(cfg)
    assert result.eval_pairs == 5 * 4 and result.train_pairs == 15 * 4  # 5 of 20 tasks held out, 4 pairs each
    assert result.accuracy_after >= 0.95 > result.accuracy_before - 0.2
    assert json.loads((tmp_path / "run" / "reward_model" / "training.json").read_text())["accuracy_after"] == \
        result.accuracy_after
    reward = RewardComposer(RewardSection.model_validate(
        {"components": [{"name": "reward_model", "kwargs": {"path": result.output}}]}))
    out = reward(trajs[:4], group_size=4)
    assert min(out.total[:2]) > max(out.total[2:])  # the successes score above the failures
    assert out.metrics["reward/reward_model_errors"] == 0


def test_reward_model_needs_a_store(tmp_path):
    with pytest.raises(ConfigError, match="reward_model.store"):
        train_reward_model(load_config(None, ["model.name=tiny-random"]))
    with pytest.raises(DataError, match="holds no trajectories"):
        train_reward_model(load_config(None, ["model.name=tiny-random", f"reward_model.store={tmp_path}"]))
