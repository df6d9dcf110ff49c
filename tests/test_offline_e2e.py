"""End to end through the CLI on the tiny model: `posttrain collect`, then `posttrain dpo` and `posttrain sft` on
the store; the online trainer writing to a store; an SFT loss mixed into online RL."""

import json
import math
import shutil
import statistics
from pathlib import Path

import pytest
import yaml
from cli_inprocess import assert_one_line_error, invoke
from safetensors.torch import load_file
from test_train_e2e import run_cli, tiny_config

from posttrain.data import TrajectoryStore
from posttrain.models import resolve_model_path

pytestmark = pytest.mark.slow  # end to end through CLI subprocesses: `make test`, not `make test-fast`

# Capitals (tests/user_envs.py) rewards 1/(1 + answer length) for a wrong answer: graded rewards that differ
# between the samples of a task, so the random model's samples still make preference pairs.
OFFLINE = {"env": {"id": "user_envs:Capitals", "kwargs": {}}, "eval": {"num_tasks": 1},
           "rollout": {"max_new_tokens": 8, "batch_size": 8},
           "offline": {"epochs": 1, "batch_size": 2, "microbatch_size": 1, "max_pairs_per_task": 2,
                       "learning_rate": 1e-3}}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("collect")
    config = tiny_config(tmp, **OFFLINE)
    out = tmp / "store"
    proc = run_cli("collect", config, "--out", out, "--n", 4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    acks = [line for line in proc.stdout.splitlines() if line.startswith("appended")]
    assert acks and acks[-1].startswith("appended 8/8")  # 2 training tasks x 4 samples, one line per part
    return out


def _weights_moved(run: Path, step: int) -> bool:
    before = load_file(str(Path(resolve_model_path("tiny-random")) / "model.safetensors"))
    after = load_file(str(run / "checkpoints" / f"step-{step:06d}" / "model" / "model.safetensors"))
    return any(not (before[k] == after[k]).all() for k in before)


def test_collect_writes_a_store_with_run_and_policy_version(store):
    trajectories = TrajectoryStore(store).trajectories()
    assert len(trajectories) == 8
    assert {t.task.id for t in trajectories} == {"fr", "de"}
    assert len({t.metadata["run_id"] for t in trajectories}) == 1
    assert all(t.metadata["policy_version"] == 0 and t.num_sampled_tokens > 0 for t in trajectories)
    assert len({t.reward for t in trajectories}) > 1


@pytest.mark.parametrize("method", ["dpo", "ipo", "cdpo", "kto"])
def test_dpo_family_trains_on_the_store(tmp_path, store, method):
    config = tiny_config(tmp_path, **OFFLINE)
    proc = run_cli("dpo", config, "--set", f"offline.store={store}", "--set", f"offline.method={method}",
                   "--set", "offline.success_threshold=0.05")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "run"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train" and r["step"] > 0]
    assert len(train) >= 1 and all(math.isfinite(r["loss"]) and r["grad_norm"] > 0 for r in train)
    if method != "kto":
        assert "reward_accuracy" in train[0]
        # The first step starts at the reference: every log-ratio is 0, so the loss is known exactly.
        first = {"dpo": math.log(2), "cdpo": math.log(2), "ipo": (1 / (2 * 0.1)) ** 2}[method]
        assert train[0]["loss"] == pytest.approx(first, rel=1e-3)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["method"] == method and summary["steps"] == len(train)
    assert _weights_moved(run, summary["steps"])


def test_rpo_adds_the_chosen_answers_nll_to_dpo(tmp_path, store):
    config = tiny_config(tmp_path, **OFFLINE)
    proc = run_cli("dpo", config, "--set", f"offline.store={store}", "--set", "offline.rpo_alpha=0.5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in records if r["split"] == "train" and r["step"] == 1)
    # At the reference DPO's term is log 2; RPO adds alpha x the chosen answers' NLL per token.
    assert first["chosen_nll_per_token"] > 0
    assert first["loss"] == pytest.approx(math.log(2) + 0.5 * first["chosen_nll_per_token"], rel=1e-4)


def test_rft_keeps_only_successes_and_trains(tmp_path, store):
    rewards = [t.reward for t in TrajectoryStore(store).trajectories()]
    threshold = statistics.median(rewards)
    kept = sum(r >= threshold for r in rewards)
    config = tiny_config(tmp_path, **OFFLINE)
    proc = run_cli("sft", config, "--set", f"offline.store={store}", "--set", "offline.method=rft",
                   "--set", f"offline.success_threshold={threshold}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert 0 < summary["examples"] == kept < len(rewards)
    assert summary["steps"] == math.ceil(kept / 2)
    assert _weights_moved(tmp_path / "run", summary["steps"])


def _demonstrations(path: Path) -> Path:
    path.write_text(json.dumps({"prompt": "What is the capital of France?", "completion": "Paris"}) + "\n"
                    + json.dumps({"messages": [{"role": "user", "content": "Capital of Germany?"},
                                               {"role": "assistant", "content": "Berlin"}]}) + "\n")
    return path


def test_sft_on_demonstrations_lowers_their_loss_and_checkpoints_as_asked(tmp_path):
    config = tiny_config(tmp_path, **{**OFFLINE, "offline": {**OFFLINE["offline"], "epochs": 5}})
    demos = _demonstrations(tmp_path / "demos.jsonl")
    proc = run_cli("sft", config, "--set", "offline.method=sft", "--set", f"sft.demonstrations={demos}",
                   "--set", "train.checkpoint_every=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    train = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in train if r["split"] == "train" and r["step"] > 0]
    assert len(losses) == 5 and losses[-1] < losses[0]
    checkpoints = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert checkpoints == ["step-000002", "step-000004", "step-000005"]  # every 2 steps and the last


def test_offline_user_errors_are_one_line_exit_2(tmp_path):
    config = tiny_config(tmp_path, **OFFLINE)
    cases = [
        (["dpo", config, "--set", f"offline.store={tmp_path / 'empty'}"], "holds no readable trajectories"),
        (["dpo", config], "set offline.store"),
        (["sft", config], "trains offline.method rft or sft"),
        (["sft", config, "--set", "offline.method=sft", "--set", f"sft.demonstrations={tmp_path / 'no.jsonl'}"],
         "demonstrations file not found"),
        (["train", config, "--set", "sft.weight=0.5"], "set sft.demonstrations"),
    ]
    for args, message in cases:
        assert_one_line_error(invoke(*args), message)


def test_a_store_holding_held_out_tasks_is_refused(tmp_path):
    """A store collected with 8 problems held out holds problems 8-10; evaluating on the first 10 would test the
    policy on 2 problems it trained on."""
    config = tiny_config(tmp_path)
    store = tmp_path / "store"
    collected = invoke("collect", config, "--out", store, "--n", 2, "--tasks", 3)
    assert collected.exit_code == 0 and collected.exception is None, collected.stderr[-3000:]
    wider = ["--set", f"offline.store={store}", "--set", "env.kwargs.num_eval=10", "--set", "eval.num_tasks=10"]
    for command, method in (("dpo", "dpo"), ("sft", "rft")):
        assert_one_line_error(invoke(command, config, *wider, "--set", f"offline.method={method}"),
                              "holds 2 of the 10 held-out tasks")


def test_online_training_writes_every_sampled_trajectory_to_the_store(tmp_path):
    store = tmp_path / "online-store"
    config = tiny_config(tmp_path, store={"write": True, "path": str(store)}, eval={"before_training": False})
    proc = run_cli("train", config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cfg = yaml.safe_load(config.read_text())
    trajectories = TrajectoryStore(store).trajectories()
    per_step = cfg["train"]["tasks_per_step"] * cfg["algorithm"]["group_size"]
    assert len(trajectories) == cfg["train"]["steps"] * per_step
    assert [t.metadata["policy_version"] for t in trajectories] == [0] * per_step + [1] * per_step
    assert len({t.metadata["run_id"] for t in trajectories}) == 1


def test_sft_mixing_adds_the_weighted_demonstration_loss(tmp_path):
    demos = _demonstrations(tmp_path / "demos.jsonl")
    losses = {}
    for weight in (0.0, 2.0):
        run_dir = tmp_path / f"w{weight}"
        run_dir.mkdir()
        config = tiny_config(run_dir, sft={"demonstrations": str(demos), "weight": weight, "batch_size": 2},
                             eval={"before_training": False})
        proc = run_cli("train", config)
        assert proc.returncode == 0, proc.stderr[-3000:]
        records = [json.loads(line) for line in (run_dir / "run" / "metrics.jsonl").read_text().splitlines()]
        losses[weight] = [r for r in records if r["split"] == "train"]
    plain, mixed = losses[0.0], losses[2.0]
    assert "sft_loss" not in plain[0] and mixed[0]["sft_loss"] > 0
    # Step 1 samples the same batch with the same weights: the losses differ by exactly weight x SFT loss.
    assert mixed[0]["loss"] - plain[0]["loss"] == pytest.approx(2.0 * mixed[0]["sft_loss"], rel=1e-4)
    assert mixed[1]["loss"] != pytest.approx(plain[1]["loss"], rel=1e-6)  # the updates differed


# ------------------------------------------------------------------ resume


def _timing(key: str) -> bool:
    return key in ("time", "tokens_per_second") or key.endswith("seconds")


def _records(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not _timing(k)} for line in lines]


RESUMABLE = {  # method -> (command, --set arguments past offline.method): at least 3 steps, a checkpoint every 2
    "dpo": ("dpo", ["offline.epochs=2"]),
    "kto": ("dpo", ["offline.success_threshold=0.05"]),
    "sft": ("sft", ["offline.batch_size=1", "offline.epochs=2"]),
}


@pytest.mark.parametrize("method", sorted(RESUMABLE))
def test_an_offline_run_resumed_from_its_checkpoint_equals_an_uninterrupted_one(tmp_path, store, method):
    """Run b, a copy of the finished run a, is cut back to how a kill after step 3 leaves it: metrics and an
    evaluation past its newest checkpoint (step 2). Resumed, it logs what a logged and ends on a's weights."""
    command, sets = RESUMABLE[method]
    data = (f"sft.demonstrations={_demonstrations(tmp_path / 'demos.jsonl')}" if method == "sft"
            else f"offline.store={store}")
    args = [f"--set={s}" for s in (f"offline.method={method}", data, "train.checkpoint_every=2", *sets)]
    config = tiny_config(tmp_path, **OFFLINE)
    ended = invoke(command, config, *args)
    assert ended.exit_code == 0 and ended.exception is None, ended.stderr[-3000:]
    run_a, run_b = tmp_path / "run", tmp_path / "b"
    steps = json.loads((run_a / "summary.json").read_text())["steps"]
    assert steps >= 3
    shutil.copytree(run_a, run_b)
    for later in sorted((run_b / "checkpoints").iterdir())[1:]:
        shutil.rmtree(later)
    assert [p.name for p in (run_b / "checkpoints").iterdir()] == ["step-000002"]

    ended = invoke(command, config, *args, "--resume", run_b)
    assert ended.exit_code == 0 and ended.exception is None, ended.stderr[-3000:]
    a, b = _records(run_a), _records(run_b)
    assert [(r["split"], r["step"]) for r in b] == [(r["split"], r["step"]) for r in a]  # nothing counted twice
    assert b == a
    final = f"checkpoints/step-{steps:06d}/model/model.safetensors"
    assert (run_a / final).read_bytes() == (run_b / final).read_bytes()
    assert json.loads((run_b / "summary.json").read_text())["steps"] == steps


def test_resuming_an_offline_run_on_other_data_or_settings_is_refused(tmp_path):
    config = tiny_config(tmp_path, **OFFLINE)
    demos = _demonstrations(tmp_path / "demos.jsonl")
    args = ["--set", "offline.method=sft", "--set", f"sft.demonstrations={demos}"]
    ended = invoke("sft", config, *args)
    assert ended.exit_code == 0 and ended.exception is None, ended.stderr[-2000:]
    run = tmp_path / "run"
    metrics = (run / "metrics.jsonl").read_bytes()

    assert_one_line_error(invoke("sft", config, *args, "--set", "offline.learning_rate=0.5", "--resume", run),
                          "offline.learning_rate is 0.5 here")
    with demos.open("a") as file:
        file.write(json.dumps({"prompt": "Capital of Spain?", "completion": "Madrid"}) + "\n")
    assert_one_line_error(invoke("sft", config, *args, "--resume", run),
                          "the training examples are not the ones", "(3 now, 2 then)", str(demos))
    assert (run / "metrics.jsonl").read_bytes() == metrics  # nothing cut
