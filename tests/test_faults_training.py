"""Training runs that stop early lose nothing and say so in one line: signals, a full disk, a used
or locked output_dir, a step in which every episode failed."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_inprocess import ROOT, assert_one_line_error, invoke, tiny_config

from posttrain.train.run_dir import RunDirError, open_run_dir

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])}


def _capitals(tmp_path, **sections):
    return tiny_config(tmp_path, env={"id": "user_envs:Capitals", "kwargs": {}},
                       eval={"num_tasks": 1, "before_training": False}, algorithm={"beta": 0.0}, **sections)


# ------------------------------------------------------------------ signals


def _stop_with_a_signal(tmp_path, config: Path, signum: int) -> None:
    """Start ``posttrain train config``, send ``signum`` once a step is logged, and check that the step in flight
    finished, was saved and that the stop was said in one line with exit code 128 + signum."""
    proc = subprocess.Popen([sys.executable, "-m", "posttrain.cli", "train", str(config)], env=ENV, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.is_file() and metrics.read_text().count("\n") >= 1) and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 128 + signum, err[-3000:]
    assert "Traceback" not in err
    (line,) = [x for x in err.splitlines() if x.startswith("stopped:")]
    name = signal.Signals(signum).name
    assert line.startswith(f"stopped: stopped by {name} after step ")
    step = int(line.split("after step ")[1].split(":")[0])
    checkpoint = tmp_path / "run" / "checkpoints" / f"step-{step:06d}"
    assert line.endswith(f"checkpoint saved to {checkpoint}")
    assert (checkpoint / "model" / "model.safetensors").is_file() and (checkpoint / "trainer_state.pt").is_file()
    logged = [json.loads(x)["step"] for x in metrics.read_text().splitlines()]
    assert logged[-1] == step  # the step in flight finished and was logged before the save


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_training_saves_a_checkpoint_says_where_and_exits(tmp_path, signum):
    _stop_with_a_signal(tmp_path, _capitals(tmp_path, train={"steps": 500}), signum)


@pytest.mark.slow
def test_a_signal_during_self_play_saves_a_checkpoint_says_where_and_exits(tmp_path):
    config = tiny_config(tmp_path, env={"id": "tictactoe", "kwargs": {}}, algorithm={"group_size": 2},
                         train={"steps": 500, "tasks_per_step": 2}, rollout={"max_new_tokens": 3},
                         eval={"num_tasks": 2, "max_new_tokens": 3, "before_training": False},
                         multi_agent={"eval_opponents": ["random"]})
    _stop_with_a_signal(tmp_path, config, signal.SIGTERM)


@pytest.mark.slow
def test_a_signal_during_reward_model_training_saves_a_checkpoint_says_where_and_exits(tmp_path):
    from test_reward_model import _store

    _store(tmp_path / "store")
    config = tiny_config(tmp_path, reward_model={"store": str(tmp_path / "store"), "epochs": 1000})
    proc = subprocess.Popen([sys.executable, "-m", "posttrain.cli", "rm", "train", str(config)], env=ENV, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "run" / "reward_model-logs" / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.is_file() and metrics.read_text().count("\n") >= 1) and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "Traceback" not in err
    (line,) = [x for x in err.splitlines() if x.startswith("stopped:")]
    step = int(line.split("after step ")[1].split(":")[0])
    checkpoint = tmp_path / "run" / "reward_model-logs" / "checkpoints" / f"step-{step:06d}"
    assert line.endswith(f"checkpoint saved to {checkpoint}")
    assert (checkpoint / "model" / "model.safetensors").is_file()  # a reward model `reward.components` can load
    assert json.loads(metrics.read_text().splitlines()[-1])["step"] == step  # the step in flight finished

    # Resumed with fewer epochs the run is another run: refused, naming the field.
    assert_one_line_error(invoke("rm", "train", config, "--resume", tmp_path / "run",
                                 "--set", "reward_model.epochs=1"), "--resume: reward_model.epochs is 1 here")


# ------------------------------------------------------------------ every episode failed


def test_training_where_every_episode_failed_stops_with_one_line(tmp_path):
    config = tiny_config(tmp_path, env={"id": "user_envs:AlwaysFailing", "kwargs": {}},
                         eval={"num_tasks": 1, "before_training": False})
    line = assert_one_line_error(invoke("train", config), "every episode of training step 1 failed (8 of 8: step)",
                                 "the environment's backend is down")
    assert "0.0%" not in line
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing was trained: nothing to save


def test_every_held_out_episode_failing_before_training_stops_at_once(tmp_path):
    config = tiny_config(tmp_path, env={"id": "user_envs:AlwaysFailing", "kwargs": {}}, eval={"num_tasks": 1})
    assert_one_line_error(invoke("train", config), "every held-out episode before training failed (1 of 1)")


# ------------------------------------------------------------------ the run directory


def test_a_used_output_dir_is_refused_unless_overwritten(tmp_path):
    config = _capitals(tmp_path, train={"steps": 1})
    first = invoke("train", config)
    assert first.exit_code == 0, first.stderr[-2000:]
    run = tmp_path / "run"
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}
    line = assert_one_line_error(invoke("train", config), f"output_dir {run} holds a previous run", "--overwrite",
                                 "--resume")
    assert "metrics.jsonl" in line
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"} == before  # untouched

    again = invoke("train", config, "--overwrite")
    assert again.exit_code == 0, again.stderr[-2000:]
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "train"] == [1]  # one run's metrics, not two mixed
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000001"]


def test_a_locked_output_dir_is_refused_at_once(tmp_path):
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from posttrain.train.run_dir import "
                               "open_run_dir; d = open_run_dir(sys.argv[1]); print('locked', flush=True); "
                               "time.sleep(60)", str(run)], env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        config = _capitals(tmp_path)
        assert_one_line_error(invoke("train", config), f"output_dir {run} is in use by another run (pid {holder.pid})")
    finally:
        holder.kill()
        holder.wait()
    open_run_dir(run).close()  # the lock died with its process: no stale lock


def test_an_output_dir_that_is_a_file_is_one_line(tmp_path):
    (tmp_path / "run").write_text("not a directory")
    config = _capitals(tmp_path)
    assert_one_line_error(invoke("train", config), f"output_dir {tmp_path / 'run'} is a file")
    assert (tmp_path / "run").read_text() == "not a directory"


def _bwrap() -> str:
    from posttrain.sandbox import SandboxUnavailable
    from posttrain.sandbox.backends import find_bwrap

    try:
        return find_bwrap()
    except SandboxUnavailable as e:
        pytest.skip(f"needs bubblewrap for read-only and size-limited mounts: {e}")


def _cli_in_bwrap(mount: list[str], config: Path, *args: str, rescue: Path | None = None):
    env = {**ENV, **({"POSTTRAIN_RESCUE_DIR": str(rescue)} if rescue else {})}
    return subprocess.run([_bwrap(), "--dev-bind", "/", "/", *mount, "--", sys.executable, "-m", "posttrain.cli",
                           "train", str(config), *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=600)


def test_a_read_only_output_dir_is_one_line(tmp_path):
    (tmp_path / "ro").mkdir()
    config = _capitals(tmp_path, output_dir=str(tmp_path / "ro" / "run"))
    proc = _cli_in_bwrap(["--ro-bind", str(tmp_path / "ro"), str(tmp_path / "ro")], config)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert f"output_dir {tmp_path / 'ro' / 'run'} cannot be written: Read-only file system" in line


@pytest.mark.slow
def test_training_onto_a_full_disk_rescues_the_weights_in_one_line(tmp_path):
    # A 2 MB tmpfs holds the config, metrics and events but not the 13 MB checkpoint.
    config = _capitals(tmp_path, output_dir="/mnt/small/run", train={"steps": 1})
    proc = _cli_in_bwrap(["--size", str(2 << 20), "--tmpfs", "/mnt/small"], config, rescue=tmp_path / "rescue")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    rescued = tmp_path / "rescue" / "posttrain-rescue" / "run-step-000001" / "model"
    assert "cannot write the checkpoint of step 1" in line and "No space left on device" in line
    assert f"the trained weights were saved to {rescued} instead" in line
    assert (rescued / "model.safetensors").is_file() and (rescued / "config.json").is_file()


def test_open_run_dir_puts_back_a_checkpoint_a_crash_left_aside(tmp_path):
    aside = tmp_path / "run" / "checkpoints" / ".step-000002.old"
    (aside / "model").mkdir(parents=True)
    with open_run_dir(tmp_path / "run", overwrite=True):
        assert (tmp_path / "run" / "checkpoints" / "step-000002" / "model").is_dir() and not aside.exists()
    with pytest.raises(RunDirError, match="holds a previous run"):
        open_run_dir(tmp_path / "run")
