"""Exact resume: a run killed with SIGKILL between checkpoints and resumed equals an uninterrupted one."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from test_train_e2e import ROOT, run_cli, tiny_config

from posttrain.config import load_config
from posttrain.data.store import TrajectoryStore
from posttrain.rollout.episodes import load_rng_state, rng_state, seeded
from posttrain.train.resume import changed_field


# Wall-clock measurements differ between any two runs; everything else must be equal.
def is_timing(key: str) -> bool:
    return key in ("time", "tokens_per_second") or key.endswith("seconds")


def records(run_dir):
    out = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not is_timing(k)} for r in out]


def config_for(tmp_path, name):
    """Everything a step draws on is in play: KL to a reference with an adaptive controller, running
    reward statistics, old log-probs over two passes, the curriculum sampler, an env that draws from
    its np_random, sampled evaluations between checkpoints, and the trajectory store."""
    (tmp_path / name).mkdir()
    path = tiny_config(
        tmp_path / name, env={"id": "user_envs:NoisyCapitals", "kwargs": {}},
        algorithm={"beta": 0.04, "kl_target": 0.05, "reward_normalization": "running", "num_iterations": 2},
        train={"steps": 4, "checkpoint_every": 2, "learning_rate": 1e-3},
        eval={"num_tasks": 1, "every": 1, "temperature": 1.0, "samples_per_task": 2},
        curriculum={"enabled": True, "retire_min_samples": 0}, store={"write": True},
    )
    return path, tmp_path / name / "run"


def kill_after_step(config, run_dir, step):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])}
    proc = subprocess.Popen([sys.executable, "-m", "posttrain.cli", "train", str(config)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    metrics = run_dir / "metrics.jsonl"
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and any(json.loads(line).get("split") == "train" and json.loads(line)["step"] == step
                                    for line in metrics.read_text().splitlines() if line.endswith("}")):
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"


@pytest.mark.slow
def test_sigkill_between_checkpoints_then_resume_equals_uninterrupted(tmp_path):
    config_a, run_a = config_for(tmp_path, "a")
    proc = run_cli("train", config_a)
    assert proc.returncode == 0, proc.stderr[-3000:]

    config_b, run_b = config_for(tmp_path, "b")
    kill_after_step(config_b, run_b, step=3)
    assert (run_b / "checkpoints" / "step-000002").is_dir() and not (run_b / "checkpoints" / "step-000004").exists()
    proc = run_cli("train", config_b, "--resume", run_b)
    assert proc.returncode == 0, proc.stderr[-3000:]

    a, b = records(run_a), records(run_b)
    assert [(r["split"], r["step"]) for r in b] == [(r["split"], r["step"]) for r in a]  # nothing counted twice
    assert b == a
    assert any(r.get("kl", 0) > 0 for r in a) and len({r["kl_coef"] for r in a if r["split"] == "train"}) > 1
    stored_a, stored_b = TrajectoryStore(run_a / "trajectories"), TrajectoryStore(run_b / "trajectories")
    assert [(t.metadata["step"], t.task.id, t.reward, t.completion_ids) for t in stored_b] == \
        [(t.metadata["step"], t.task.id, t.reward, t.completion_ids) for t in stored_a]
    final = "checkpoints/step-000004/model/model.safetensors"
    assert (run_a / final).read_bytes() == (run_b / final).read_bytes()
    assert sorted(p.name for p in (run_b / "eval_samples").iterdir()) == \
        sorted(p.name for p in (run_a / "eval_samples").iterdir())

    # A config that would change the run is refused, naming the field.
    proc = run_cli("train", config_b, "--resume", run_b, "--set", "algorithm.beta=0.1")
    assert proc.returncode == 2 and "algorithm.beta" in proc.stderr and "Traceback" not in proc.stderr


def test_which_fields_may_change_on_resume(tmp_path):
    base = load_config(None, [])
    saved = base.model_dump(mode="json")
    assert changed_field(saved, load_config(None, ["train.steps=500", "eval.every=5", "output_dir=x"])) is None
    assert changed_field(saved, load_config(None, ["train.learning_rate=0.5"]))[0] == "train.learning_rate"
    assert changed_field(saved, load_config(None, ["env.kwargs={difficulty: 2}"]))[0] == "env.kwargs"
    assert changed_field(saved, load_config(None, ["curriculum.enabled=true"]))[0] == "curriculum.enabled"


def test_resume_without_a_checkpoint_is_a_clear_error(tmp_path):
    (tmp_path / "run").mkdir()
    proc = run_cli("train", ROOT / "examples" / "tiny_smoke.yaml", "--resume", tmp_path / "run")
    assert proc.returncode == 2 and "no complete checkpoint" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_cli("train", ROOT / "examples" / "tiny_smoke.yaml", "--resume", tmp_path / "missing")
    assert proc.returncode == 2 and "no such run directory" in proc.stderr


@pytest.mark.parametrize("bit_generator", [np.random.PCG64, np.random.MT19937, np.random.Philox, np.random.SFC64])
def test_an_env_generator_of_any_kind_is_saved_as_data_and_restored(tmp_path, bit_generator):
    """An env may make itself a generator of any kind; its state (arrays, for all but PCG64) round-trips through a
    checkpoint that torch.load reads with weights_only=True, into a fresh env with the pool's PCG64, which then
    draws what the saved one would."""
    from user_envs import NoisyCapitals

    saved, restored = NoisyCapitals(), seeded(NoisyCapitals(), 0, 0)
    saved.np_random = np.random.Generator(bit_generator(7))
    saved.np_random.random(5)
    torch.save({"rng": rng_state(saved)}, tmp_path / "state.pt")
    load_rng_state(restored, torch.load(tmp_path / "state.pt", weights_only=True)["rng"])
    assert restored.np_random.random(3).tolist() == saved.np_random.random(3).tolist()
