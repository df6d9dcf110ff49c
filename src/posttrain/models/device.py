"""Which device the policy runs on, and the precision defaults that go with it.

One config runs on a laptop and on a GPU: ``model.device: auto`` picks CUDA when torch sees a
GPU. On CUDA the weights stay float32 (the optimiser's master copy) and forward passes run under
bfloat16 autocast, as mixed-precision training does (Micikevicius et al. 2018, arXiv:1710.03740);
on CPU it follows the sampler's precision where bf16 measured faster (see :func:`autocast_dtype`),
since bf16 matmuls are emulated and slower than fp32 on CPUs without bf16 units (see DESIGN.md's
reference numbers).
"""

from __future__ import annotations

import torch

from posttrain.config import ConfigError, ModelSection
from posttrain.models.cpu_probe import bf16_training_pays


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


def autocast_dtype(cfg: ModelSection, device: torch.device, sampler_dtype: torch.dtype = torch.float32) -> torch.dtype | None:
    """The dtype forward passes autocast to, or None for no autocast.

    ``auto`` on a CPU follows the sampler (``sampler_dtype``, the resolved ``rollout.decode_dtype``): when it
    decodes in bf16 its log-probabilities are no longer the float32 training pass's anyway, so training
    in bf16 gives up no exactness that is left, and it takes bf16 where it measured clearly faster
    (:func:`~posttrain.models.cpu_probe.bf16_training_pays`: about 2x in a training matmul on a Zen 4 EPYC).
    A float32 sampler keeps the whole loop in float32, with the sampler's log-probabilities the trainer's own.
    """
    name = cfg.autocast
    if name == "auto":
        if cfg.dtype != "float32":  # bf16 weights need no autocast
            name = "none"
        elif device.type == "cuda":
            name = "bfloat16"
        else:
            name = "bfloat16" if sampler_dtype == torch.bfloat16 and bf16_training_pays() else "none"
    return None if name == "none" else getattr(torch, name)


def uses_packed_weights(cfg: ModelSection, device: torch.device) -> bool:
    """oneDNN's packed linear weights are a CPU fast path; CUDA matmuls need no such help."""
    return cfg.pack_weights and device.type == "cpu"
