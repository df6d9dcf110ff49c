"""The trajectory store: round trip, Hugging Face datasets, and a writer killed with SIGKILL mid-write."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from posttrain.data import TrajectoryStore
from posttrain.types import Step, Task, Trajectory

ROOT = Path(__file__).resolve().parents[1]


def multi_turn_trajectory(k: int = 0) -> Trajectory:
    return Trajectory(
        task=Task(f"t{k}", "Guess the number", answer=7, metadata={"level": 2}),
        prompt_ids=[1, 2, 3],
        completion_ids=[10, 11, 2, 20, 21, 12],
        loss_mask=[1, 1, 0, 0, 0, 1],
        behaviour_logprobs=[-0.5, -1.25, 0.0, 0.0, 0.0, -0.125],
        steps=[Step("5", "higher", 0.1, False, False, {"correct": False}),
               Step("7", "Correct!", 1.0, True, False, {"correct": True, "obj": object()})],
        reward=1.0,
        finish_reason="stop",
        metadata={"note": "x"},
    )


def test_round_trip_keeps_every_field(tmp_path):
    store = TrajectoryStore(tmp_path / "store")
    assert store.files() == [] and len(store) == 0 and store.read_table().num_rows == 0
    failed = Trajectory(task=Task("t9", "p"), prompt_ids=[1], completion_ids=[], loss_mask=[], behaviour_logprobs=[],
                        error="reset: RuntimeError: boom", finish_reason="error")
    store.append([multi_turn_trajectory(0), failed], run_id="run-a", policy_version=3)
    store.append([multi_turn_trajectory(1)], run_id="run-b", policy_version=4)
    assert store.append([], run_id="run-c") is None  # nothing to write, no empty part

    back = store.trajectories()
    assert len(back) == len(store) == 3
    original, got = multi_turn_trajectory(0), back[0]
    for name in ("prompt_ids", "completion_ids", "loss_mask", "behaviour_logprobs", "reward", "finish_reason",
                 "error"):
        assert getattr(got, name) == getattr(original, name), name
    assert got.task.id == "t0" and got.task.answer == 7 and got.task.metadata == {"level": 2}
    assert got.step_rewards == [0.1, 1.0] and got.correct
    assert got.steps[1].info["obj"].startswith("<object")  # not JSON: kept as its repr
    assert got.metadata == {"note": "x", "run_id": "run-a", "policy_version": 3}
    assert back[1].error == "reset: RuntimeError: boom"
    assert [t.metadata["run_id"] for t in back] == ["run-a", "run-a", "run-b"]
    assert back[2].metadata["policy_version"] == 4


def test_readable_with_hugging_face_datasets(tmp_path):
    datasets = pytest.importorskip("datasets")
    store = TrajectoryStore(tmp_path / "store")
    store.append([multi_turn_trajectory(0), multi_turn_trajectory(1)], run_id="r", policy_version=1)
    store.append([multi_turn_trajectory(2)], run_id="r", policy_version=2)
    ds = datasets.load_dataset("parquet", data_files=store.files(), split="train",
                               cache_dir=str(tmp_path / "hf-cache"))
    assert ds.num_rows == 3
    assert ds["task_id"] == ["t0", "t1", "t2"]
    assert ds["policy_version"] == [1, 1, 2]
    assert ds[0]["loss_mask"] == [1, 1, 0, 0, 0, 1]
    assert ds[0]["completion_ids"] == [10, 11, 2, 20, 21, 12]


WRITER = textwrap.dedent("""
    import sys
    from posttrain.data import TrajectoryStore
    from posttrain.types import Task, Trajectory

    store = TrajectoryStore(sys.argv[1])
    n = 0
    while True:
        # Large parts, so that the writer spends most of its time inside append().
        batch = [Trajectory(task=Task(f"b{n}-{i}", "p"), prompt_ids=list(range(100)),
                            completion_ids=list(range(400)), loss_mask=[1] * 400,
                            behaviour_logprobs=[-float(j) for j in range(400)], reward=float(i % 2))
                 for i in range(300)]
        store.append(batch, run_id="writer", policy_version=n)
        print(f"ack {n}", flush=True)  # printed only once append() has returned
        n += 1
""")


def test_sigkill_mid_write_loses_nothing_acknowledged(tmp_path):
    path = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True, env=env)
    acked: list[int] = []
    try:
        while len(acked) < 3:
            line = proc.stdout.readline()
            assert line, "writer exited early"
            acked.append(int(line.split()[1]))
        # Wait until the next part is being written (its temporary file exists), then kill.
        deadline = time.monotonic() + 60
        while not list(path.glob(".part-*.tmp")):
            assert time.monotonic() < deadline, "the writer never started another part"
            time.sleep(0.001)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        acked += [int(line.split()[1]) for line in proc.stdout.read().splitlines()]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL

    store = TrajectoryStore(path)
    table = store.read_table()  # reads: no half-written part is listed
    versions = set(table.column("policy_version").to_pylist())
    assert set(acked) <= versions, f"acknowledged batches lost: {set(acked) - versions}"
    assert table.num_rows == 300 * len(versions)  # every listed part is complete
    assert len(store.trajectories()) == table.num_rows
    # The store stays appendable after the crash.
    store.append([multi_turn_trajectory()], run_id="after", policy_version=99)
    assert len(store) == table.num_rows + 1
