"""Checkpoints: the model (or its LoRA adapters) and the trainer's state, written so none is lost.

Layout of ``<run>/checkpoints/step-000010/``: ``model/`` (a loadable HF directory, what
``posttrain eval --checkpoint`` reads), ``trainer_state.pt`` (optimiser, scheduler, step, every RNG,
task sampler, algorithm and critic state: what ``posttrain train --resume`` restores, see
:mod:`posttrain.train.resume`) and ``config.json`` (the run's config, checked on resume).

Durability: a checkpoint is written under a hidden temporary name (``.step-000010.tmp``), every
file and directory in it fsynced, then renamed into place and the parent directory fsynced. An
existing checkpoint of the same step is first renamed aside (``.step-000010.old``) and deleted
only after the new one is in, so at every instant one complete checkpoint of the step exists;
:func:`recover_checkpoints` puts an aside copy back if a crash came between the two renames.
When writing fails (a full disk, a read-only or vanished directory) the half-written temporary
is removed, the weights are saved to a rescue directory on another filesystem where one can be
written, and :class:`CheckpointError` says where each went.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from posttrain.data.store import fsync_dir
from posttrain.models.policy import Policy


class CheckpointError(RuntimeError):
    """A checkpoint could not be written; the message says why and where the weights are."""


def checkpoint_path(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step-{step:06d}"


def save_checkpoint(
    run_dir: Path, step: int, policy: Policy, optimizer, scheduler, extra: dict[str, Any],
    model_state: dict | None = None, config_json: str = "{}",
) -> Path:
    """Write the checkpoint of ``step`` durably; raise :class:`CheckpointError` if it cannot be."""
    final = checkpoint_path(run_dir, step)
    state = {
        "step": step,
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
        **extra,
    }
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(final, lambda tmp: (policy.save(tmp / "model", model_state),
                                              torch.save(state, tmp / "trainer_state.pt"),
                                              (tmp / "config.json").write_text(config_json)))
    except Exception as e:  # noqa: BLE001 - any failure to write (OSError, safetensors' own errors) is reported
        reason = f"{type(e).__name__}: {e}" if not isinstance(e, OSError) else (e.strerror or str(e))
        where = _rescue_weights(policy, final)
        kept = (f"the trained weights were saved to {where} instead" if where else
                "no rescue directory could be written either: the trained weights were not saved")
        raise CheckpointError(f"cannot write the checkpoint of step {step} to {final}: {reason}; {kept}") from None
    return final


def _write_atomically(final: Path, write) -> None:
    """``write(tmp)`` fills a temporary directory that then replaces ``final`` (see the module docstring)."""
    tmp = final.with_name(f".{final.name}.tmp")
    aside = final.with_name(f".{final.name}.old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        write(tmp)
        _fsync_tree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a half-written checkpoint must not keep the disk full
        raise
    if final.exists():
        shutil.rmtree(aside, ignore_errors=True)
        final.rename(aside)
    tmp.rename(final)
    fsync_dir(final.parent)
    shutil.rmtree(aside, ignore_errors=True)


def recover_checkpoints(run_dir: Path) -> None:
    """Finish what a crash interrupted: an aside copy whose replacement never arrived goes back in
    place; temporaries of checkpoints that were never completed are removed."""
    folder = run_dir / "checkpoints"
    if not folder.is_dir():
        return
    for aside in folder.glob(".step-*.old"):
        final = folder / aside.name[1 : -len(".old")]
        if final.exists():
            shutil.rmtree(aside, ignore_errors=True)
        else:
            aside.rename(final)
    for tmp in folder.glob(".step-*.tmp"):
        shutil.rmtree(tmp, ignore_errors=True)


def rescue_candidates() -> list[Path]:
    """Where weights go when the run directory cannot take them: ``$POSTTRAIN_RESCUE_DIR``, then
    RAM-backed /dev/shm, then the system temporary directory."""
    out = [Path(os.environ["POSTTRAIN_RESCUE_DIR"])] if os.environ.get("POSTTRAIN_RESCUE_DIR") else []
    return out + [Path("/dev/shm"), Path(tempfile.gettempdir())]


def _rescue_weights(policy: Policy, final: Path) -> Path | None:
    """Save only the model (the smallest loadable part) to the first rescue directory that takes it."""
    for base in rescue_candidates():
        target = base / "posttrain-rescue" / f"{final.parent.parent.name}-{final.name}"
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            _write_atomically(target, lambda tmp: policy.save(tmp / "model"))
            return target / "model"
        except Exception:  # noqa: BLE001 - try the next place
            continue
    return None


def _fsync_tree(root: Path) -> None:
    for folder, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(folder))

