"""Metric sinks: metrics.jsonl and TensorBoard by default; W&B (offline) and trackio when enabled."""

import importlib.util
import json
import sqlite3
import sys

import pytest

from posttrain.config import ConfigError, LoggingSection, load_config
from posttrain.train.metrics import MetricsLogger, _require


def test_default_sinks_write_jsonl_and_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = MetricsLogger(tmp_path)
    logger.log("train", 1, {"reward_mean": 0.5, "nan": float("nan")})
    logger.log("eval", 1, {"accuracy": 0.25})
    logger.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["split"], r["step"]) for r in records] == [("train", 1), ("eval", 1)]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"train/reward_mean", "eval/accuracy"}  # non-finite values skipped
    assert events.Scalars("eval/accuracy")[0].value == pytest.approx(0.25)


def test_tensorboard_can_be_turned_off(tmp_path):
    MetricsLogger(tmp_path, LoggingSection(tensorboard=False)).close()
    assert (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "tensorboard").exists()


def test_wandb_offline_run_receives_the_metrics(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = LoggingSection(tensorboard=False, wandb={"enabled": True, "mode": "offline", "project": "t"})
    logger = MetricsLogger(tmp_path, cfg, {"seed": 3})
    logger.log("train", 1, {"reward_mean": 0.5})
    logger.log("train", 2, {"reward_mean": 0.75})
    (run,) = [sink._run for sink in logger.sinks]
    # W&B commits a step's row when a later step arrives; the summary shows the last committed one.
    assert run.summary["train/reward_mean"] in (0.5, 0.75) and run.config["seed"] == 3
    logger.close()
    assert list(tmp_path.glob("wandb/offline-run-*/run-*.wandb"))  # ready for `wandb sync`


def test_trackio_project_receives_the_metrics(tmp_path, monkeypatch):
    if importlib.util.find_spec("trackio") is None:
        pytest.skip("trackio is not installed")
    # trackio reads TRACKIO_DIR when imported; modules imported earlier keep a copy.
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    for name, module in list(sys.modules.items()):
        if name.startswith("trackio") and hasattr(module, "TRACKIO_DIR"):
            monkeypatch.setattr(module, "TRACKIO_DIR", tmp_path / "trackio")
    cfg = LoggingSection(tensorboard=False, trackio={"enabled": True, "project": "posttrain-test"})
    logger = MetricsLogger(tmp_path / "run", cfg, {"seed": 3})
    logger.log("train", 1, {"reward_mean": 0.5})
    logger.log("eval", 1, {"accuracy": 0.25})
    logger.close()
    (db,) = (tmp_path / "trackio").glob("posttrain-test*.db")
    rows = sqlite3.connect(db).execute("select step, metrics from metrics order by id").fetchall()
    assert [(step, json.loads(m)) for step, m in rows] == [(1, {"train/reward_mean": 0.5}), (1, {"eval/accuracy": 0.25})]


def test_an_enabled_tracker_that_is_missing_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no_such_tracker is not installed"):
        _require("no_such_tracker", "logging.wandb.enabled")
    with pytest.raises(ConfigError, match="logging.wandb.mode"):
        load_config(None, ["logging.wandb.mode=sometimes"])
