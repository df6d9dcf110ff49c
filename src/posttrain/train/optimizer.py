"""The optimiser every trainer uses: AdamW (Loshchilov & Hutter 2019)."""

from __future__ import annotations

import math

import torch


def adamw(param_groups: list, lr: float, weight_decay: float, fused: bool = True) -> torch.optim.AdamW:
    """AdamW with torch's fused kernel where the parameters' device has one: on CPU one step of
    the 135M-parameter default model takes 0.08 s instead of 0.4 s with the per-tensor loop.
    ``fused=False`` takes the loop (FSDP's mix of sharded and replicated tensors needs it)."""
    if not fused:
        return torch.optim.AdamW(param_groups, lr=lr, weight_decay=weight_decay)
    try:
        return torch.optim.AdamW(param_groups, lr=lr, weight_decay=weight_decay, fused=True)
    except (RuntimeError, ValueError):  # a device or dtype without the fused kernel
        return torch.optim.AdamW(param_groups, lr=lr, weight_decay=weight_decay)


def lr_schedule(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int, kind: str = "constant",
                min_ratio: float = 0.0) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over ``warmup_steps`` optimiser steps, then ``kind``: constant, or a linear or
    cosine (Loshchilov & Hutter 2017, SGDR) decay to ``min_ratio`` x the peak at ``total_steps``."""

    def factor(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        if kind == "constant" or total_steps <= warmup_steps:
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        shape = 1.0 - progress if kind == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        return min_ratio + (1.0 - min_ratio) * shape

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
