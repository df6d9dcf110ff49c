"""Fuzz every file the CLI reads: random bytes, random JSON and mutations of a valid file, thrown at
the config, a trajectory store part, a demonstrations file, each file of a checkpoint's model and the
files ``--resume`` reads from a checkpoint.

Whatever the input, the CLI ends with exit 0 (the input happened to be usable) or exit 2 with
exactly one ``error:`` line, never a traceback, and never changes the file it was given. The
cases are drawn from a fixed seed, so a failure reproduces; its id names the target and case.
"""

import json
import random
import shutil
import string
from pathlib import Path

import pytest
import yaml
from cli_inprocess import invoke, tiny_config, trained_run

from posttrain.config import field_reference
from posttrain.data import TrajectoryStore
from posttrain.models import resolve_model_path
from posttrain.types import Step, Task, Trajectory

pytestmark = pytest.mark.slow  # about two minutes: dozens of CLI runs, some of which train

SEED = 21
CASES_PER_TARGET = 12
# Keep whatever a fuzzed config says cheap: the tiny model, one short greedy held-out task.
CHEAP = ["--set", "model.name=tiny-random", "--set", "eval.num_tasks=1", "--set", "eval.max_new_tokens=4",
         "--set", "eval.samples_per_task=1", "--set", "eval.pass_k=1", "--set", "eval.temperature=0",
         "--set", "rollout.max_turns=1", "--set", "env.step_timeout=10", "--set", "model.lora.enabled=false"]
KEYS = sorted({part for key, _, _ in field_reference() for part in key.split(".")})


def random_json(rng: random.Random, depth: int = 0):
    kind = rng.choice(["dict", "list", "str", "int", "float", "bool", "null"] if depth < 3 else
                      ["str", "int", "float", "bool", "null"])
    if kind == "dict":
        return {rng.choice(KEYS) if rng.random() < 0.7 else random_text(rng): random_json(rng, depth + 1)
                for _ in range(rng.randint(0, 5))}
    if kind == "list":
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if kind == "str":
        return random_text(rng)
    if kind == "int":
        return rng.choice([0, -1, 1, 2**63, -(2**70), rng.randint(-1000, 1000)])
    if kind == "float":
        return rng.choice([0.5, -1e308, 1e-320, rng.uniform(-10, 10)])
    return {"bool": rng.random() < 0.5, "null": None}[kind]


def random_text(rng: random.Random) -> str:
    alphabet = string.printable + "\u00e9\u4e2d\U0001f600\x00\ud7ff"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))


def mutate(rng: random.Random, data: bytes) -> bytes:
    """A valid file, damaged: truncated, bytes flipped, a run of bytes inserted or deleted."""
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        how = rng.choice(["truncate", "flip", "insert", "delete"])
        at = rng.randrange(len(data) + 1) if data else 0
        if how == "truncate":
            del data[at:]
        elif how == "flip" and data:
            data[min(at, len(data) - 1)] ^= 1 << rng.randrange(8)
        elif how == "insert":
            data[at:at] = rng.randbytes(rng.randint(1, 64))
        else:
            del data[at : at + rng.randint(1, 64)]
    return bytes(data)


def fuzzed(rng: random.Random, valid: bytes, as_json_lines: bool = False) -> bytes:
    kind = rng.choice(["bytes", "json", "mutation", "mutation"])
    if kind == "bytes":
        return rng.randbytes(rng.randint(0, 4096))
    if kind == "json":
        value = json.dumps(random_json(rng), ensure_ascii=rng.random() < 0.5)
        return (value + "\n" if as_json_lines else value).encode("utf-8", "surrogatepass")
    return mutate(rng, valid)


def assert_ends_cleanly(ended, given: Path, content: bytes) -> None:
    assert ended.exception is None, f"traceback: {ended.exception!r:.300}"
    assert "Traceback" not in ended.stderr + ended.stdout
    assert ended.exit_code in (0, 2), (ended.exit_code, ended.stderr[-2000:])
    if ended.exit_code == 2:
        assert len(ended.error_lines) == 1, ended.stderr[-2000:]
    assert given.read_bytes() == content  # the input is never rewritten or removed


def _cases(target: str, n: int = CASES_PER_TARGET) -> list:
    return [pytest.param(i, id=f"{target}-{i}") for i in range(n)]


@pytest.mark.parametrize("case", _cases("config"))
def test_fuzzed_config(tmp_path, case):
    rng = random.Random(f"{SEED}-config-{case}")
    valid = tiny_config(tmp_path, name="valid.yaml", eval={"num_tasks": 1}).read_bytes()
    content = fuzzed(rng, valid)
    path = tmp_path / "fuzzed.yaml"
    path.write_bytes(content)
    assert_ends_cleanly(invoke("eval", path, *CHEAP, "--set", f"output_dir={tmp_path / 'run'}"), path, content)


def _trajectory(k: int, reward: float) -> Trajectory:
    return Trajectory(task=Task(f"t{k}", "Add 1 and 1."), prompt_ids=[1, 2], completion_ids=[3, 4], loss_mask=[1, 1],
                      behaviour_logprobs=[-0.1, -0.2], steps=[Step("2", "", reward, True, False, {})], reward=reward)


@pytest.mark.parametrize("case", _cases("store-part", 6))
def test_fuzzed_store_part(tmp_path, case):
    rng = random.Random(f"{SEED}-store-{case}")
    store = TrajectoryStore(tmp_path / "store")
    good = store.append([_trajectory(0, 1.0), _trajectory(0, 0.0)], run_id="r")
    victim = store.append([_trajectory(1, 1.0), _trajectory(1, 0.0)], run_id="r")
    content = fuzzed(rng, victim.read_bytes())
    victim.write_bytes(content)
    kept = good.read_bytes()
    config = tiny_config(tmp_path, offline={"store": str(tmp_path / "store"), "epochs": 1, "batch_size": 2},
                         eval={"before_training": False})
    for skip in ("false", "true"):
        ended = invoke("dpo", config, *CHEAP, "--set", f"offline.skip_bad_parts={skip}", "--overwrite")
        assert_ends_cleanly(ended, victim, content)
        assert good.read_bytes() == kept
    assert ended.exit_code == 0, ended.stderr[-2000:]  # skipping, the good part is enough to train on


@pytest.mark.parametrize("case", _cases("demonstrations"))
def test_fuzzed_demonstrations(tmp_path, case):
    rng = random.Random(f"{SEED}-demos-{case}")
    valid = b"".join(json.dumps(d).encode() + b"\n" for d in [
        {"prompt": "What is 2 + 2?", "completion": "4"},
        {"messages": [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris"}]},
    ])
    content = fuzzed(rng, valid, as_json_lines=True)
    path = tmp_path / "demos.jsonl"
    path.write_bytes(content)
    config = tiny_config(tmp_path, offline={"method": "sft", "epochs": 1, "batch_size": 2},
                         sft={"demonstrations": str(path)}, eval={"before_training": False})
    assert_ends_cleanly(invoke("sft", config, *CHEAP), path, content)


CHECKPOINT_FILES = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                    "generation_config.json", "chat_template.jinja"]


@pytest.mark.parametrize("case", [pytest.param(i, id=f"checkpoint-{CHECKPOINT_FILES[i % 6]}-{i}")
                                  for i in range(2 * len(CHECKPOINT_FILES))])
def test_fuzzed_checkpoint_file(tmp_path, case):
    rng = random.Random(f"{SEED}-checkpoint-{case}")
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(resolve_model_path("tiny-random"), checkpoint / "model")
    target = checkpoint / "model" / CHECKPOINT_FILES[case % len(CHECKPOINT_FILES)]
    content = fuzzed(rng, target.read_bytes(), as_json_lines=False)
    target.write_bytes(content)
    config = tiny_config(tmp_path)
    assert_ends_cleanly(invoke("eval", config, *CHEAP, "--checkpoint", checkpoint), target, content)


RESUMED_FILES = ["trainer_state.pt", "config.json", "model/model.safetensors"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    return trained_run(tmp_path_factory.mktemp("finished"))


@pytest.mark.parametrize("case", [pytest.param(i, id=f"resume-{RESUMED_FILES[i % 3]}-{i}")
                                  for i in range(3 * len(RESUMED_FILES))])
def test_fuzzed_file_of_the_checkpoint_resumed_from(tmp_path, finished_run, case):
    rng = random.Random(f"{SEED}-resume-{case}")
    config, finished = finished_run
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    target = run / "checkpoints" / "step-000001" / RESUMED_FILES[case % len(RESUMED_FILES)]
    content = fuzzed(rng, target.read_bytes())
    target.write_bytes(content)
    assert_ends_cleanly(invoke("train", config, "--resume", run, "--set", "train.steps=2"), target, content)


def test_the_fuzzed_inputs_are_mostly_rejected_not_all_accepted(tmp_path):
    """The fuzzer is worth something only if it reaches the error paths: most cases must be bad."""
    rng = random.Random(f"{SEED}-check")
    valid = yaml.safe_dump({"model": {"name": "tiny-random"}}).encode()
    from posttrain.config import ConfigError, load_config

    rejected = 0
    for i in range(50):
        path = tmp_path / f"c{i}.yaml"
        path.write_bytes(fuzzed(rng, valid))
        try:
            load_config(path)
        except ConfigError:
            rejected += 1
    assert rejected >= 25

