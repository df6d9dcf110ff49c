"""Reward-model training on a store and scoring inside reward composition, with the tiny-random backbone."""

import json
import shutil

import pytest
import torch
from cli_inprocess import assert_one_line_error, invoke, tiny_config

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


def _metrics(logs):
    return [{k: v for k, v in json.loads(line).items() if k != "time"}
            for line in (logs / "metrics.jsonl").read_text().splitlines()]


def test_a_reward_model_run_resumed_from_its_checkpoint_equals_an_uninterrupted_one(tmp_path):
    """Run b, a copy of the finished run a, is cut back to how a kill after step 5 leaves it: metrics past its
    newest checkpoint (step 3) and no model. Resumed, it logs what a logged and ends on a's weights."""
    _store(tmp_path / "store")
    config = tiny_config(tmp_path, reward_model={"store": str(tmp_path / "store"), "epochs": 1,
                                                 "learning_rate": 3e-3}, train={"checkpoint_every": 3})
    ended = invoke("rm", "train", config)
    assert ended.exit_code == 0 and ended.exception is None, ended.stderr[-3000:]
    run_a, run_b = tmp_path / "run", tmp_path / "b"
    logs_a, logs_b = run_a / "reward_model-logs", run_b / "reward_model-logs"
    assert sorted(p.name for p in (logs_a / "checkpoints").iterdir()) == ["step-000003", "step-000006"]  # of 8 steps
    shutil.copytree(run_a, run_b)
    shutil.rmtree(logs_b / "checkpoints" / "step-000006")
    shutil.rmtree(run_b / "reward_model")
    (logs_b / "metrics.jsonl").write_text("".join(line + "\n" for line in
                                                  (logs_a / "metrics.jsonl").read_text().splitlines()[:5]))

    ended = invoke("rm", "train", config, "--resume", run_b)
    assert ended.exit_code == 0 and ended.exception is None, ended.stderr[-3000:]
    a, b = _metrics(logs_a), _metrics(logs_b)
    assert [(r["split"], r["step"]) for r in b] == [(r["split"], r["step"]) for r in a]  # nothing counted twice
    assert b == a
    assert (run_b / "reward_model" / "model.safetensors").read_bytes() == \
        (run_a / "reward_model" / "model.safetensors").read_bytes()
    result_a, result_b = (json.loads((run / "reward_model" / "training.json").read_text()) for run in (run_a, run_b))
    assert {**result_b, "seconds": 0, "output": ""} == {**result_a, "seconds": 0, "output": ""}  # accuracy before too

    # A used logs directory is refused without --overwrite; a finished run, another store or another reward_model
    # field, on resume.
    assert_one_line_error(invoke("rm", "train", config), f"{logs_a} holds a previous run", "--overwrite")
    assert_one_line_error(invoke("rm", "train", config, "--resume", run_a), "--resume: the run finished",
                          "nothing to continue")
    (run_b / "reward_model" / "training.json").unlink()  # b as stopped after its last checkpoint
    _store(tmp_path / "store", tasks=21)
    assert_one_line_error(invoke("rm", "train", config, "--resume", run_b),
                          "the training examples are not the ones", f"reward_model.store ({tmp_path / 'store'}) "
                          "changed since the run began")
    assert_one_line_error(invoke("rm", "train", config, "--resume", run_b, "--set", "reward_model.batch_size=4"),
                          "--resume: reward_model.batch_size is 4 here but 8 in")
    assert_one_line_error(invoke("rm", "train", config, "--resume", tmp_path),
                          f"--resume: no run to continue in {tmp_path / 'reward_model-logs'}")
