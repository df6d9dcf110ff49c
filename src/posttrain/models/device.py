"""Which device the policy runs on, and the precision defaults that go with it.

One config runs on a laptop and on a GPU: ``model.device: auto`` picks CUDA when torch sees a
GPU. On CUDA the weights stay float32 (the optimiser's master copy) and forward passes run under
bfloat16 autocast, as mixed-precision training does (Micikevicius et al. 2018, arXiv:1710.03740);
on CPU autocast stays off unless asked for, since bf16 matmuls are slower than fp32 on CPUs
without AMX (see DESIGN.md's reference numbers).
"""

from __future__ import annotations

import torch

from posttrain.config import ConfigError, ModelSection


def resolve_device(name: str) -> torch.device:
    """``auto | cpu | cuda | cuda:N`` as a torch device; ConfigError when CUDA is asked for but absent."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"model.device={name}: this torch ({torch.__version__}) sees no CUDA GPU; "
                              "use model.device=auto or cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"model.device={name}: only {torch.cuda.device_count()} CUDA device(s) here "
                              f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})")
    return device


def autocast_dtype(cfg: ModelSection, device: torch.device) -> torch.dtype | None:
    """The dtype forward passes autocast to, or None for no autocast."""
    name = cfg.autocast
    if name == "auto":
        name = "bfloat16" if device.type == "cuda" and cfg.dtype == "float32" else "none"
    return None if name == "none" else getattr(torch, name)


def uses_packed_weights(cfg: ModelSection, device: torch.device) -> bool:
    """oneDNN's packed linear weights are a CPU fast path; CUDA matmuls need no such help."""
    return cfg.pack_weights and device.type == "cpu"
