"""Checkpoints: the model (or its LoRA adapters) and the trainer's state.

Layout of ``<run>/checkpoints/step-000010/``: ``model/`` (a loadable HF directory, what
``posttrain eval --checkpoint`` reads), ``trainer_state.pt`` (optimiser, scheduler, step, RNG and
task-order state, critic weights; kept for resuming, which the trainer does not do yet). A
checkpoint is written to a temporary name and renamed into place, so a crash never leaves a
half-written one behind.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import torch

from posttrain.models.policy import Policy


def checkpoint_path(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step-{step:06d}"


def save_checkpoint(
    run_dir: Path, step: int, policy: Policy, optimizer, scheduler, extra: dict[str, Any],
    model_state: dict | None = None,
) -> Path:
    final = checkpoint_path(run_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    policy.save(tmp / "model", model_state)
    torch.save(
        {
            "step": step,
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "scheduler": scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
            **extra,
        },
        tmp / "trainer_state.pt",
    )
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return final
