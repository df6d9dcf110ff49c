"""Data parallel through torch.distributed: two gloo processes on CPU (torchrun), tiny random model."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from posttrain.config import ConfigError, load_config
from posttrain.train.distributed import Distributed

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


def _env():
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]),
            "OMP_NUM_THREADS": "1"}


def _run(cmd, timeout=300):
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def single_process_gradients(tmp_path_factory):
    out = tmp_path_factory.mktemp("single") / "grads.pt"
    _run([sys.executable, str(ROOT / "tests" / "dp_gradients.py"), str(out)])
    return torch.load(out)


@pytest.mark.slow
@pytest.mark.parametrize("fsdp", [False, True], ids=["all_reduce", "fsdp2"])
def test_two_gloo_processes_match_one_process_gradients(tmp_path, single_process_gradients, fsdp):
    out = tmp_path / "grads.pt"
    _run([*TORCHRUN, str(ROOT / "tests" / "dp_gradients.py"), str(out), f"train.fsdp={str(fsdp).lower()}"])
    two = torch.load(out)
    one = single_process_gradients
    assert len(two["grads"]) == len(one["grads"]) == 1  # one optimiser step on the global batch
    scale = one["grads"][0].abs().max()
    assert scale > 0
    torch.testing.assert_close(two["grads"][0], one["grads"][0], rtol=1e-5, atol=1e-6 * float(scale))
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-5)


@pytest.mark.slow
def test_fsdp2_with_two_gloo_processes_trains_two_steps(tmp_path):
    run = tmp_path / "run"
    _run([*TORCHRUN, "-m", "posttrain.cli", "train", str(ROOT / "examples" / "tiny_smoke.yaml"),
          "--set", "train.fsdp=true", "--set", f"output_dir={run}", "--set", "env.id=user_envs:Capitals",
          "--set", "env.kwargs={}", "--set", "algorithm.beta=0", "--set", "eval.num_tasks=2",
          "--set", "train.tasks_per_step=2", "--set", "train.learning_rate=1e-3"])
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train = [x for x in lines if x["split"] == "train"]
    assert [x["step"] for x in train] == [1, 2]  # rank 0 alone writes metrics
    assert all(x["optimizer_steps"] == 1 and x["grad_norm"] > 0 for x in train)
    assert all(x["samples"] == 8 for x in train)  # both ranks' samples (2 tasks x 4) are counted
    from posttrain.models import load_model

    trained = load_model(str(run / "checkpoints" / "step-000002" / "model"))
    torch.manual_seed(0)
    initial = load_model("tiny-random")
    moved = [not torch.equal(a, b) for a, b in zip(trained.state_dict().values(), initial.state_dict().values())]
    assert any(moved)  # the gathered, saved weights are the trained ones


def test_data_parallel_config_errors_name_the_fix(monkeypatch):
    cfg = load_config(ROOT / "examples" / "tiny_smoke.yaml", ["train.tasks_per_step=3"])
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="tasks_per_step .3. must be a multiple of the 2"):
        Distributed(cfg)
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ConfigError, match="launch with torchrun"):
        Distributed(load_config(ROOT / "examples" / "tiny_smoke.yaml", ["train.fsdp=true"]))
