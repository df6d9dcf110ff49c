"""Exact resume: continue a run from its newest complete checkpoint as if it had never stopped.

A checkpoint (see :mod:`posttrain.train.checkpoint`) holds everything a step draws on: the weights
(or adapters), optimiser and scheduler, Python's and torch's RNGs, the generation backend's
sampling generator, every environment instance's ``np_random``, the task sampler (shuffle order or
curriculum state, with its generator), the algorithm's KL controller and reward statistics, the
critic, the demonstration cursor and the step counter. The trainer samples synchronously, so no
rollout is buffered or in flight at a checkpoint. On resume the run directory is cut back to the
checkpoint's step (metrics.jsonl, held-out samples, this run's rows in the trajectory store), so
nothing is counted twice.

A resumed run must be the same run: a config that differs from the checkpoint's in a field that
changes what training does is refused, naming the field. Fields that only say how long to train,
how to evaluate (evaluations sample from their own generator) or where to log may change.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from posttrain.config import ConfigError, RunConfig
from posttrain.data.store import SCHEMA, TrajectoryStore, fsync_dir
from posttrain.train.checkpoint import recover_checkpoints

# Dotted keys (or prefixes ending in ".") that a resumed run may change.
MAY_CHANGE = ("train.steps", "train.checkpoint_every", "eval.", "logging.", "store.write", "store.path",
              "output_dir")


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    if isinstance(value, dict) and not prefix.endswith("kwargs."):  # kwargs compare as one value
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): value}


def changed_field(saved: dict[str, Any], cfg: RunConfig) -> tuple[str, Any, Any] | None:
    """The first field that changes the run, as (key, checkpoint's value, this config's value)."""
    old, new = flatten(saved), flatten(cfg.model_dump(mode="json"))
    # A decaying learning rate is laid out over train.steps, so then the step budget is part of the run.
    fixed_length = old.get("train.lr_schedule", "constant") != "constant"
    for key in sorted(set(old) | set(new)):
        if key == "train.steps" and fixed_length:
            pass
        elif any(key == p or (p.endswith(".") and key.startswith(p)) for p in MAY_CHANGE):
            continue
        if old.get(key) != new.get(key):
            return key, old.get(key), new.get(key)
    return None


def latest_checkpoint(run_dir: Path) -> Path:
    """The newest complete checkpoint (half-written ones keep a hidden ``.tmp`` name and are never listed)."""
    recover_checkpoints(run_dir)  # a replacement a crash interrupted is finished first
    done = [p for p in (run_dir / "checkpoints").glob("step-*")
            if p.is_dir() and not p.name.endswith(".tmp") and (p / "trainer_state.pt").is_file()
            and (p / "config.json").is_file()]
    if not done:
        raise ConfigError(f"--resume {run_dir}: no complete checkpoint under {run_dir / 'checkpoints'} (a run saves "
                          "one every train.checkpoint_every steps and at the end)")
    return max(done, key=lambda p: int(p.name.removeprefix("step-")))


def check_resumable(checkpoint: Path, cfg: RunConfig) -> None:
    """Exit-2 error naming the first run-changing field where ``cfg`` differs from the checkpoint's."""
    saved = json.loads((checkpoint / "config.json").read_text())
    diff = changed_field(saved, cfg)
    if diff is not None:
        key, old, new = diff
        raise ConfigError(f"--resume: {key} is {new!r} here but {old!r} in {checkpoint}; resuming with another "
                          f"{key} would not continue the same run (only {', '.join(MAY_CHANGE)} may change)")


def _rewrite(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def cut_metrics(run_dir: Path, step: int) -> None:
    """Keep metrics.jsonl records up to ``step`` (a partial last line of a killed run goes too)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and record.get("step", 0) <= step:
            kept.append(line + "\n")
    _rewrite(path, "".join(kept))


def cut_eval_samples(run_dir: Path, step: int) -> None:
    for path in (run_dir / "eval_samples").glob("step-*.jsonl"):
        if int(path.stem.removeprefix("step-")) > step:
            path.unlink()


def cut_store(store: TrajectoryStore, step: int, run_ids: set[str]) -> None:
    """Drop this run's rows sampled after ``step``: each part file is kept, rewritten or removed."""
    for name in store.files():
        table = pq.read_table(name, schema=SCHEMA)
        rows = table.to_pylist()
        keep = [r for r in rows if r["run_id"] not in run_ids or json.loads(r["metadata"]).get("step", 0) <= step]
        if len(keep) == len(rows):
            continue
        if keep:
            tmp = Path(name).with_name(f".{Path(name).name}.tmp")
            pq.write_table(pa.Table.from_pylist(keep, schema=SCHEMA), tmp)
            os.replace(tmp, name)
        else:
            os.unlink(name)
    if store.path.is_dir():
        fsync_dir(store.path)


def cut_run_dir(run_dir: Path, step: int, store: TrajectoryStore | None, run_ids: set[str]) -> None:
    """Everything written after ``step`` goes: metrics, held-out samples, store rows, the summary."""
    cut_metrics(run_dir, step)
    cut_eval_samples(run_dir, step)
    if store is not None:
        cut_store(store, step, run_ids)
    (run_dir / "summary.json").unlink(missing_ok=True)


def load_weights(policy, model_dir: Path) -> None:
    """Load a checkpoint's weights (or LoRA adapters) into the already built policy.

    The policy is built from ``model.name`` first, so a frozen reference model stays the original
    one; only the trained weights come from the checkpoint.
    """
    from peft import PeftModel, set_peft_model_state_dict
    from safetensors.torch import load_file

    model = policy.model
    if isinstance(model, PeftModel):
        set_peft_model_state_dict(model, load_file(str(model_dir / "adapter_model.safetensors")))
        return
    weights: dict = {}
    for part in sorted(model_dir.glob("model*.safetensors")):  # one file, or the shards of a large model
        weights.update(load_file(str(part)))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = {k for k in missing if "lm_head" in k} if model.config.tie_word_embeddings else set()
    if not weights or set(missing) - tied or unexpected:
        raise ConfigError(f"--resume: the weights in {model_dir} do not match model.name's architecture "
                          f"(missing {sorted(set(missing) - tied)[:3]}, unexpected {unexpected[:3]})")
