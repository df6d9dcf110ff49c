"""Messages that say what is wrong: a missing model path, an offline hub id, a run where every
episode failed, and metrics files that stay valid JSON whatever the numbers were."""

import json
import math
import os
import subprocess
import sys

import pytest
from cli_inprocess import ROOT, assert_one_line_error, invoke, tiny_config

from posttrain.models.loading import ModelLoadError, resolve_model_path
from posttrain.train.metrics import MetricsLogger, dumps_finite


@pytest.mark.parametrize("name", ["/no/such/model", "./models/mine", "~/nowhere/model", "a/b/c"])
def test_a_model_path_that_does_not_exist_says_so(name):
    with pytest.raises(ModelLoadError) as e:
        resolve_model_path(name)
    assert str(e.value).startswith("model path ") and "does not exist" in str(e.value)
    assert "Repo id" not in str(e.value)


def test_a_model_path_that_is_a_file_says_so(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="is a file"):
        resolve_model_path(str(tmp_path / "weights.bin"))


def test_an_uncached_hub_id_fails_at_once_offline(tmp_path):
    # A subprocess, so that huggingface_hub reads HF_HUB_OFFLINE at import as it does for a user.
    config = tiny_config(tmp_path, model={"name": "someorg/not-cached-anywhere"})
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])}
    # Without the probe, transformers retried the download for about a minute; 60 s means a hang.
    proc = subprocess.run([sys.executable, "-m", "posttrain.cli", "eval", str(config)], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert "'someorg/not-cached-anywhere' is not in the Hugging Face cache and HF_HUB_OFFLINE is set" in line


def test_an_uncached_hub_id_is_one_line_online_or_not():
    # Without a network (as here) the probe fails once, fast; with one, the hub says there is no such model.
    with pytest.raises(ModelLoadError) as e:
        resolve_model_path("someorg/not-cached-anywhere")
    assert ("is not cached and the Hugging Face hub cannot be reached" in str(e.value)
            or "no such model on the Hugging Face hub" in str(e.value)), str(e.value)
    assert "\n" not in str(e.value)


def test_eval_where_every_episode_failed_exits_2_saying_what_failed(tmp_path):
    config = tiny_config(tmp_path, env={"id": "user_envs:AlwaysFailing", "kwargs": {}}, eval={"num_tasks": 1})
    line = assert_one_line_error(invoke("eval", config), "every held-out episode of tiny-random failed (1 of 1)")
    assert "step: RuntimeError: the environment's backend is down" in line
    assert "0.0%" not in invoke("eval", config).stdout


def test_collect_where_every_episode_failed_keeps_them_and_exits_2(tmp_path):
    config = tiny_config(tmp_path, env={"id": "user_envs:AlwaysFailing", "kwargs": {}})
    store = tmp_path / "store"
    line = assert_one_line_error(invoke("collect", config, "--out", store, "--n", 2, "--tasks", 1),
                                 "every episode of the collection failed (2 of 2", "the environment's backend is down")
    assert str(store) in line
    from posttrain.data import TrajectoryStore

    assert [t.error is not None for t in TrajectoryStore(store)] == [True, True]  # failures are data, kept


def test_metrics_with_non_finite_values_stay_valid_json(tmp_path):
    logger = MetricsLogger(tmp_path)
    logger.log("train", 1, {"loss": float("nan"), "kl": float("inf"), "reward_mean": 0.5})
    logger.close()
    line = (tmp_path / "metrics.jsonl").read_text().strip()
    record = json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c} in metrics.jsonl"))
    assert record["loss"] is None and record["kl"] is None and record["reward_mean"] == 0.5
    assert record["non_finite_values"] == 2
    assert json.loads(dumps_finite({"a": [1.0, -math.inf], "b": {"c": math.nan}})) == \
        {"a": [1.0, None], "b": {"c": None}, "non_finite_values": 2}
