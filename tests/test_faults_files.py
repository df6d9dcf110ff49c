"""Bad files and bad disks: a truncated, empty or garbage file stops with one line naming it (exit 2),
or is skipped where asked; a full disk loses no trained weights and leaves no half-written file."""

import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cli_inprocess import ROOT, assert_one_line_error, invoke, tiny_config, trained_run
from safetensors.torch import load_file

from posttrain.config import ConfigError, load_config
from posttrain.data import TrajectoryStore
from posttrain.data.demonstrations import load_demonstrations
from posttrain.data.store import DataError
from posttrain.models import resolve_model_path
from posttrain.train.checkpoint import checkpoint_path, recover_checkpoints
from posttrain.types import Step, Task, Trajectory


def _garbage(size: int) -> bytes:
    """Bytes that are no file format, the same on every run: fresh random ones can begin like a pickle header,
    and then torch.load warns before our error, so the suite's warnings changed from run to run."""
    return random.Random(size).randbytes(size)


# ------------------------------------------------------------------ config


def test_a_config_that_is_not_utf8_is_one_line(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("model:\n  name: tiny-random  # caf\xe9\n".encode("latin-1"))
    line = assert_one_line_error(invoke("train", path), f"{path}: not UTF-8 text")
    assert "expected a YAML file" in line


@pytest.mark.parametrize("command", [("train",), ("eval",), ("rm", "train")])
def test_an_override_without_set_is_answered_with_the_set_that_would_set_it(tmp_path, command):
    # Hydra-based trainers take `field=value` as bare arguments; here it is refused before anything loads.
    ended = invoke(*command, tiny_config(tmp_path), "train.steps=3", "rollout.temperature=0.5")
    assert ended.exception is None and ended.exit_code == 2, (ended.exit_code, ended.stderr[-2000:])
    said = " ".join(ended.stderr.replace("│", " ").split())
    assert "unexpected arguments train.steps=3 rollout.temperature=0.5" in said, said
    assert "--set train.steps=3 --set rollout.temperature=0.5" in said, said
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("spelled", [["--train.steps=3"], ["--train.steps", "3"]])
def test_a_dotted_option_is_answered_with_the_set_that_would_set_it(tmp_path, spelled):
    ended = invoke("train", tiny_config(tmp_path), *spelled)
    assert ended.exception is None and ended.exit_code == 2, (ended.exit_code, ended.stderr[-2000:])
    said = " ".join(ended.stderr.replace("│", " ").split())
    assert "no such option --train.steps; a config field is set with --set, as in: --set train.steps=3" in said, said
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("text, says", [
    ("algorithm: {name: [grpo]}", "'algorithm.name': Input should be 'grpo'"),
    ("model: [1, 2\n", "not valid YAML"),
    ("train: {steps: " + "9" * 1000 + "x}", "'train.steps': Input should be a valid integer"),
])
def test_config_values_of_the_wrong_shape_are_one_line(tmp_path, text, says):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert says in str(e.value) and "\n" not in str(e.value) and len(str(e.value)) < 400


# ------------------------------------------------------------------ trajectory store


def _trajectory(k: int, reward: float) -> Trajectory:
    return Trajectory(task=Task(f"t{k}", "Add 1 and 1."), prompt_ids=[1, 2], completion_ids=[3, 4], loss_mask=[1, 1],
                      behaviour_logprobs=[-0.1, -0.2], steps=[Step("2", "", reward, True, False, {})], reward=reward)


def _store_with_bad_part(root: Path, damage: str) -> tuple[TrajectoryStore, Path, dict[str, bytes]]:
    store = TrajectoryStore(root)
    good = [store.append([_trajectory(k, 1.0), _trajectory(k, 0.0)], run_id="r") for k in range(2)]
    bad = root / "part-00000000000000000001-bad.parquet"  # sorts first: a reader must not stop silently
    if damage == "truncated":
        data = good[0].read_bytes()
        bad.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        bad.write_bytes(b"")
    elif damage == "garbage":
        bad.write_bytes(_garbage(4096))
    elif damage == "other-schema":
        pq.write_table(pa.table({"x": [1, 2, 3]}), bad)
    elif damage == "bad-row":
        table = pq.read_table(good[0])
        table = table.set_column(table.schema.get_field_index("steps"), "steps", pa.array(["{not json"] * 2))
        pq.write_table(table, bad)
    before = {p.name: p.read_bytes() for p in root.iterdir()}
    return store, bad, before


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage", "other-schema", "bad-row"])
def test_a_bad_store_part_is_named_and_skipped_only_when_asked(tmp_path, damage):
    store, bad, before = _store_with_bad_part(tmp_path / "store", damage)
    with pytest.raises(DataError) as e:
        store.trajectories()
    assert str(e.value).startswith(f"trajectory store part {bad}: ")
    assert "offline.skip_bad_parts=true" in str(e.value) and "\n" not in str(e.value)

    skipping = TrajectoryStore(tmp_path / "store", skip_bad_parts=True)
    assert len(skipping.trajectories()) == 4  # every row of the good parts
    assert [part for part, _ in skipping.skipped] == [str(bad)]
    assert {p.name: p.read_bytes() for p in (tmp_path / "store").iterdir()} == before  # nothing touched


def test_dpo_on_a_store_with_a_bad_part_stops_or_skips_it_through_the_cli(tmp_path):
    _, bad, _ = _store_with_bad_part(tmp_path / "store", "garbage")
    config = tiny_config(tmp_path, offline={"store": str(tmp_path / "store"), "epochs": 1, "batch_size": 2},
                         eval={"num_tasks": 1, "before_training": False})
    assert_one_line_error(invoke("dpo", config), f"trajectory store part {bad}")
    ended = invoke("dpo", config, "--set", "offline.skip_bad_parts=true", "--overwrite")
    assert ended.exception is None and ended.exit_code == 0, ended.stderr[-2000:]
    assert f"skipped store part {bad}" in ended.stderr


# ------------------------------------------------------------------ demonstrations


@pytest.mark.parametrize("content, says", [
    ("{\"prompt\": \"caf\xe9\", \"completion\": \"x\"}\n".encode("latin-1"), "not UTF-8 text"),
    (b'{"messages": [1, 2]}\n', "'messages' must be a list of"),
    (b'{"messages": [{"role": ["user"], "content": "hi"}, {"role": "assistant", "content": "x"}]}\n',
     "'messages' must be a list of"),
    (b'{"messages": [{"role": "assistant", "content": {"a": 1}}]}\n', "'messages' must be a list of"),
    (b"[1, 2]\n", "expected a JSON object"),
    (b"\n\n", "no demonstrations"),
])
def test_bad_demonstrations_are_one_line_naming_the_file(tmp_path, tokenizer, content, says):
    path = tmp_path / "demos.jsonl"
    path.write_bytes(content)
    with pytest.raises(DataError) as e:
        load_demonstrations(path, tokenizer)
    assert str(e.value).startswith(str(path)) and says in str(e.value)


# ------------------------------------------------------------------ checkpoints read back


def _copy_model(tmp_path: Path) -> Path:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(resolve_model_path("tiny-random"), ckpt / "model")
    return ckpt


@pytest.mark.parametrize("file, damage", [
    ("model.safetensors", "truncate"), ("model.safetensors", "empty"), ("model.safetensors", "garbage"),
    ("config.json", "garbage"), ("config.json", "empty"), ("config.json", "list"),
    ("tokenizer.json", "garbage"), ("tokenizer_config.json", "truncate"),
])
def test_a_damaged_checkpoint_is_one_line_naming_it(tmp_path, file, damage):
    ckpt = _copy_model(tmp_path)
    target = ckpt / "model" / file
    data = target.read_bytes()
    target.write_bytes({"truncate": data[: len(data) // 3], "empty": b"", "garbage": _garbage(2048),
                        "list": b"[1, 2, 3]"}[damage])
    config = tiny_config(tmp_path, eval={"num_tasks": 1})
    line = assert_one_line_error(invoke("eval", config, "--checkpoint", ckpt), str(ckpt / "model"))
    assert line.startswith("error: cannot load")


@pytest.mark.parametrize("loader", ["reward model", "process reward model"])
@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_a_damaged_reward_model_is_a_model_load_error_naming_it(tmp_path, loader, damage):
    from posttrain.models.loading import ModelLoadError
    from posttrain.rewards.prm import load_prm
    from posttrain.rewards.reward_model import load_reward_model

    model_dir = _copy_model(tmp_path) / "model"
    weights = model_dir / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 3] if damage == "truncate" else _garbage(4096))
    with pytest.raises(ModelLoadError) as e:
        {"reward model": load_reward_model, "process reward model": load_prm}[loader](str(model_dir))
    assert str(e.value).startswith(f"cannot load {loader} '{model_dir}'")


def test_a_checkpoint_of_the_same_step_is_replaced_without_a_gap(tmp_path):
    """The old step directory is renamed aside, the new one renamed in, then the old one deleted;
    a crash between the two renames leaves the aside copy, which the next run puts back."""
    import torch

    from posttrain.config import ModelSection
    from posttrain.models import Policy
    from posttrain.train.checkpoint import save_checkpoint
    from posttrain.train.optimizer import adamw

    policy = Policy.load(ModelSection(name="tiny-random"))
    optimizer = adamw(policy.trainable_parameters(), 1e-3, 0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    run = tmp_path / "run"
    first = save_checkpoint(run, 3, policy, optimizer, scheduler, {"mark": "first"})
    second = save_checkpoint(run, 3, policy, optimizer, scheduler, {"mark": "second"})
    assert first == second == checkpoint_path(run, 3)
    assert torch.load(second / "trainer_state.pt", weights_only=False)["mark"] == "second"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000003"]  # no .old, no .tmp

    # The state a kill between the renames leaves: the old step aside, the new one not yet in.
    second.rename(second.with_name(".step-000003.old"))
    (run / "checkpoints" / ".step-000004.tmp").mkdir()  # and a half-written later one
    recover_checkpoints(run)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000003"]
    assert torch.load(second / "trainer_state.pt", weights_only=False)["mark"] == "second"


# ------------------------------------------------------------------ resuming from a damaged checkpoint


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    return trained_run(tmp_path_factory.mktemp("finished"))


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _torch_save(value) -> bytes:
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _damaged(target: Path, damage: str) -> bytes:
    import torch

    data = target.read_bytes()
    if damage == "wrong optimiser":  # every key there, the optimiser's state of another model
        state = torch.load(target, weights_only=True)
        return _torch_save({**state, "optimizer": {"state": {}, "param_groups": []}})
    return {"truncate": data[: len(data) // 3], "empty": b"", "garbage": _garbage(4096), "list": b"[1, 2, 3]",
            "pickled list": _torch_save([1, 2, 3]), "keys missing": _torch_save({"step": 1})}[damage]


@pytest.mark.parametrize("file, damage, says", [
    ("trainer_state.pt", "truncate", "is not a trainer state posttrain wrote"),
    ("trainer_state.pt", "empty", "empty or cut short"),
    ("trainer_state.pt", "garbage", "is not a trainer state posttrain wrote"),
    ("trainer_state.pt", "pickled list", "holds a list, not a trainer state"),
    ("trainer_state.pt", "keys missing", "has no optimizer, scheduler"),
    ("trainer_state.pt", "wrong optimiser", "does not fit this run: ValueError"),
    ("config.json", "garbage", "is not the run config a checkpoint holds"),
    ("config.json", "list", "holds [1, 2, 3], not the run config"),
    ("model/model.safetensors", "truncate", "is not a readable safetensors file"),
    ("model/model.safetensors", "garbage", "is not a readable safetensors file"),
    ("store part", "garbage", "does not read as this store's Parquet"),
])
def test_resuming_from_a_damaged_checkpoint_is_one_line_and_changes_nothing(tmp_path, finished_run, file, damage,
                                                                           says):
    config, finished = finished_run
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    checkpoint = checkpoint_path(run, 1)
    target = (sorted((run / "trajectories").glob("part-*.parquet"))[0] if file == "store part" else
              checkpoint / file)
    target.write_bytes(_damaged(target, damage))
    before = _files(run)
    ended = invoke("train", config, "--resume", run, "--set", "train.steps=2")
    assert_one_line_error(ended, str(target), says)
    assert _files(run) == before  # metrics, held-out samples, store and checkpoint as they were


def test_a_trainer_state_that_would_run_code_is_refused_unread(tmp_path, finished_run):
    """A checkpoint is data: a pickle that calls os.system on loading is refused, and the call never happens."""
    config, finished = finished_run
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    marker = tmp_path / "the pickle ran"

    class RunsCode:
        def __reduce__(self):
            return os.system, (f"touch '{marker}'",)

    state = checkpoint_path(run, 1) / "trainer_state.pt"
    state.write_bytes(_torch_save({"step": RunsCode()}))
    ended = invoke("train", config, "--resume", run, "--set", "train.steps=2")
    assert_one_line_error(ended, str(state), "asks to import posix.system", "never run as code")
    assert not marker.exists()


# ------------------------------------------------------------------ a full disk


def _bwrap() -> str:
    from posttrain.sandbox import SandboxUnavailable
    from posttrain.sandbox.backends import find_bwrap

    try:
        return find_bwrap()
    except SandboxUnavailable as e:
        pytest.skip(f"needs bubblewrap for a size-limited tmpfs: {e}")


SAVE_ON_A_SMALL_DISK = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    import torch
    from posttrain.config import ModelSection
    from posttrain.models import Policy
    from posttrain.train.checkpoint import CheckpointError, save_checkpoint
    from posttrain.train.optimizer import adamw
    policy = Policy.load(ModelSection(name="tiny-random"))
    optimizer = adamw(policy.trainable_parameters(), 1e-3, 0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    try:
        save_checkpoint(Path("/mnt/small/run"), 2, policy, optimizer, scheduler, {})
        print("saved")
    except CheckpointError as e:
        print("error:", e)
    print("left:", sorted(str(p) for p in Path("/mnt/small").rglob("*") if p.is_file()))
""")


def test_a_full_disk_keeps_the_weights_and_leaves_no_half_written_file(tmp_path):
    # A real full disk: a 2 MB tmpfs (the tiny model alone is 13 MB) mounted by bubblewrap.
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "POSTTRAIN_RESCUE_DIR": str(tmp_path / "rescue")}
    proc = subprocess.run([_bwrap(), "--dev-bind", "/", "/", "--size", str(2 << 20), "--tmpfs", "/mnt/small",
                           "--", sys.executable, "-c", SAVE_ON_A_SMALL_DISK], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    error = next(line for line in proc.stdout.splitlines() if line.startswith("error:"))
    rescued = tmp_path / "rescue" / "posttrain-rescue" / "run-step-000002" / "model"
    assert "cannot write the checkpoint of step 2 to /mnt/small/run/checkpoints/step-000002" in error
    assert "No space left on device" in error and f"the trained weights were saved to {rescued} instead" in error
    assert "left: []" in proc.stdout  # the half-written temporary was removed
    original = load_file(Path(resolve_model_path("tiny-random")) / "model.safetensors")
    back = load_file(rescued / "model.safetensors")
    assert back.keys() == original.keys() and all((back[k] == original[k]).all() for k in original)
    assert json.loads((rescued / "config.json").read_text())["num_hidden_layers"] == 2
