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

A checkpoint is read as data, never as code: ``trainer_state.pt`` is unpickled with
``weights_only=True`` (tensors, numbers, strings and containers), so a run directory from elsewhere
cannot run anything on ``--resume``. A checkpoint file that is damaged, or not what this version of
posttrain writes, stops the resume with one line naming it, before anything in the run directory
changes.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from posttrain.config import ConfigError, RunConfig
from posttrain.data.store import SCHEMA, DataError, TrajectoryStore, fsync_dir
from posttrain.models.loading import describe_error
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


def changed_field(saved: dict[str, Any], cfg: RunConfig,
                  fields: tuple[str, ...] | None = None) -> tuple[str, Any, Any] | None:
    """The first field that changes the run, as (key, checkpoint's value, this config's value); ``fields``
    (keys, or prefixes ending in ".") limits the comparison to what a command reads."""
    old, new = flatten(saved), flatten(cfg.model_dump(mode="json"))
    # A decaying learning rate is laid out over train.steps, so then the step budget is part of the run.
    fixed_length = old.get("train.lr_schedule", "constant") != "constant"
    for key in sorted(set(old) | set(new)):
        if fields is not None and not _matches(key, fields):
            continue
        if key == "train.steps" and fixed_length:
            pass
        elif _matches(key, MAY_CHANGE):
            continue
        if old.get(key) != new.get(key):
            return key, old.get(key), new.get(key)
    return None


def _matches(key: str, patterns: tuple[str, ...]) -> bool:
    return any(key == p or (p.endswith(".") and key.startswith(p)) for p in patterns)


def latest_checkpoint(run_dir: Path, required: bool = True) -> Path | None:
    """The newest complete checkpoint (half-written ones keep a hidden ``.tmp`` name and are never listed);
    without one, an exit-2 error, or None when not ``required``."""
    recover_checkpoints(run_dir)  # a replacement a crash interrupted is finished first
    done = [p for p in (run_dir / "checkpoints").glob("step-*")
            if p.is_dir() and p.name.removeprefix("step-").isdigit() and (p / "trainer_state.pt").is_file()
            and (p / "config.json").is_file()]
    if not done and required:
        raise ConfigError(f"--resume {run_dir}: no complete checkpoint under {run_dir / 'checkpoints'} (a run saves "
                          "one every train.checkpoint_every steps, on SIGINT or SIGTERM and, when it trains a "
                          "policy, at the end)")
    return max(done, key=lambda p: int(p.name.removeprefix("step-"))) if done else None


def resume_from(resume: str | Path | None, cfg: RunConfig) -> tuple[Path | None, RunConfig]:
    """For a trainer's ``resume`` argument: the checkpoint to restore (None without one) and the config to run,
    writing into the resumed directory. Every check runs here, before any model is loaded, so a refused resume
    costs nothing."""
    if resume is None:
        return None, cfg
    checkpoint = latest_checkpoint(Path(resume))
    check_resumable(checkpoint, cfg)
    if cfg.train.async_steps or cfg.train.fsdp:
        raise ConfigError("--resume: runs with train.async_steps or train.fsdp cannot resume exactly yet "
                          "(in-flight rollouts and sharded optimiser state are not checkpointed)")
    return checkpoint, cfg.model_copy(update={"output_dir": str(resume)})


def check_resumable(checkpoint: Path, cfg: RunConfig, fields: tuple[str, ...] | None = None) -> None:
    """Exit-2 error naming the first run-changing field (of ``fields``, see :func:`changed_field`) where ``cfg``
    differs from the config in ``checkpoint`` (a checkpoint or run directory holding ``config.json``)."""
    path = checkpoint / "config.json"
    try:
        saved = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise ConfigError(f"--resume: {path} is not the run config a checkpoint holds ({describe_error(e)})") from None
    if not isinstance(saved, dict):
        raise ConfigError(f"--resume: {path} holds {json.dumps(saved)[:60]}, not the run config a checkpoint holds "
                          "(a JSON object)")
    diff = changed_field(saved, cfg, fields)
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
        number = path.stem.removeprefix("step-")
        if number.isdigit() and int(number) > step:
            path.unlink()


def cut_store(store: TrajectoryStore, step: int, run_ids: set[str]) -> None:
    """Drop this run's rows sampled after ``step``: each part file is kept, rewritten or removed. Every part is
    read before any is changed, so that a part that does not read stops the resume with the store as it was."""
    parts = []
    for name in store.files():
        try:
            parts.append((name, pq.read_table(name, schema=SCHEMA).to_pylist()))
        except (pa.ArrowException, OSError, ValueError) as e:
            raise DataError(f"--resume: trajectory store part {name} does not read as this store's Parquet "
                            f"({describe_error(e)}); move it out of {store.path} to resume") from None
    for name, rows in parts:
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
    """Everything written after ``step`` goes: store rows (first: the one cut that can fail on a damaged file),
    metrics, held-out samples, the summary."""
    if store is not None:
        cut_store(store, step, run_ids)
    cut_metrics(run_dir, step)
    cut_eval_samples(run_dir, step)
    (run_dir / "summary.json").unlink(missing_ok=True)


def load_weights(policy, model_dir: Path, option: str = "--resume") -> None:
    """Load a checkpoint's weights (or LoRA adapters) into the already built policy; errors begin with the
    command-line ``option`` that named the checkpoint.

    The policy is built from ``model.name`` first, so a frozen reference model stays the original
    one; only the trained weights come from the checkpoint.
    """
    from peft import PeftModel

    model = policy.model
    if isinstance(model, PeftModel):
        load_adapters(model, "default", model_dir, option)
        return
    weights: dict = {}
    for part in sorted(model_dir.glob("model*.safetensors")):  # one file, or the shards of a large model
        weights.update(_read_weights(part, option))
    try:
        missing, unexpected = model.load_state_dict(weights, strict=False)
    except RuntimeError as e:  # the same names with other shapes
        raise ConfigError(f"{option}: the weights in {model_dir} do not match model.name's architecture "
                          f"({describe_error(e)})") from None
    tied = {k for k in missing if "lm_head" in k} if model.config.tie_word_embeddings else set()
    if not weights or set(missing) - tied or unexpected:
        raise ConfigError(f"{option}: the weights in {model_dir} do not match model.name's architecture "
                          f"(missing {sorted(set(missing) - tied)[:3]}, unexpected {unexpected[:3]})")


def load_adapters(model, name: str, folder: Path, option: str = "--resume") -> None:
    """The LoRA adapter ``name`` of a peft ``model`` from ``folder``'s ``adapter_model.safetensors``."""
    from peft import set_peft_model_state_dict

    adapters = _read_weights(folder / "adapter_model.safetensors", option)
    try:
        set_peft_model_state_dict(model, adapters, adapter_name=name)
    except RuntimeError as e:  # a tensor of another shape: adapters of another rank or model
        raise ConfigError(f"{option}: the adapters in {folder} do not fit this run's model and "
                          f"model.lora ({describe_error(e)})") from None


def _read_weights(path: Path, option: str) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except SafetensorError as e:  # empty, cut short or not safetensors (a missing file is an OSError)
        raise ConfigError(f"{option}: {path} is not a readable safetensors file ({describe_error(e)})") from None


# What every checkpoint's trainer_state.pt holds (:func:`posttrain.train.checkpoint.save_checkpoint`); each
# trainer adds its own keys.
CHECKPOINT_KEYS = ("step", "optimizer", "scheduler", "torch_rng", "python_rng", "rng")


def load_trainer_state(checkpoint: Path, keys: tuple[str, ...]) -> dict[str, Any]:
    """``checkpoint``'s ``trainer_state.pt``, unpickled as data only (see the module docstring), holding
    :data:`CHECKPOINT_KEYS` and ``keys`` (what the trainer restores); anything else is an exit-2 error naming
    the file."""
    return load_state_file(checkpoint / "trainer_state.pt", (*CHECKPOINT_KEYS, *keys), "trainer state")


def load_state_file(path: Path, keys: tuple[str, ...], what: str) -> dict[str, Any]:
    """A dict posttrain saved with ``torch.save`` at ``path``, read as data only, holding ``keys``; anything else
    is an exit-2 error naming the file as not the ``what`` expected."""
    with path.open("rb") as file:  # a file that cannot be opened is reported by the CLI with its name
        try:
            state = torch.load(file, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - whatever the bytes make the unpickler raise
            raise ConfigError(f"--resume: {path} is not a {what} posttrain wrote: {_unpickling_error(e)}") \
                from None
    if not isinstance(state, dict):
        raise ConfigError(f"--resume: {path} holds a {type(state).__name__}, not a {what} (a dict)")
    missing = [key for key in keys if key not in state]
    if missing:
        raise ConfigError(f"--resume: {path} has no {', '.join(missing)}: not a {what} of this run's kind "
                          "(written by another version of posttrain, or by another kind of run)")
    return state


def check_examples(checkpoint: Path, saved: Any, count: int, digest: str, source: str) -> None:
    """The checkpoint's ``[count, digest]`` of the examples it was trained on must match this run's (see
    ``train.epochs.examples_digest``); else a DataError saying that ``source`` changed since the run began."""
    with restoring(checkpoint):
        then, saved_digest = saved
    if saved_digest != digest:
        raise DataError(f"--resume: the training examples are not the ones {checkpoint} was trained on ({count} now, "
                        f"{then} then): {source} changed since the run began; expected the same data, or a new run")


@contextmanager
def restoring(checkpoint: Path, file: str = "trainer_state.pt") -> Iterator[None]:
    """Around a trainer's restore from ``checkpoint``'s state (``file`` in it): what ``load_state_dict`` and the
    generators' setters raise on a state of another shape becomes an exit-2 error naming the file."""
    try:
        yield
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError) as e:
        raise ConfigError(f"--resume: {checkpoint / file} does not fit this run: {describe_error(e)}") from None


def _unpickling_error(error: Exception) -> str:
    """torch.load's reason, in a few words (its weights-only refusals run to a paragraph of advice)."""
    text = str(error)
    code = re.search(r"GLOBAL ([\w.]+)", text)
    if code:
        return (f"it asks to import {code.group(1)}, and a trainer state holds only tensors, numbers, strings and "
                "containers (a checkpoint is never run as code)")
    if isinstance(error, EOFError):
        return "it is empty or cut short"
    if "Weights only load failed" in text:
        return "its bytes are not a pickle that torch.save wrote"
    return describe_error(error)
