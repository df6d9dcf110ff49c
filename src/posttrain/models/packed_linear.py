"""Linear layers with oneDNN pre-packed weights, for generation on CPU.

Decoding multiplies a few rows (one token per sequence) by every weight matrix of the model,
once per generated token. On this kind of shape MKL's sgemm on a plain row-major weight runs far
below the machine's peak; oneDNN's linear on a weight reordered once into its blocked layout (the
path torch.compile's CPU backend takes after freezing) does the same product 2-3x faster: measured
on SmolLM2-135M at 16 rows, 29 ms instead of 66 ms for the 210 trunk matmuls of a decode step and
6 ms instead of 20 ms for the LM head. We call the op directly rather than through torch.compile
because compiling costs minutes on a laptop CPU and recompiles as the batch shrinks.

Packing copies every weight (about 0.1 s and one extra copy of the weights for 135M parameters),
so it is done once per generation call, after the optimiser has moved the weights. Packed layers
serve no-grad calls only; with gradients enabled a layer falls back to its ordinary weight.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn


@functools.cache
def packing_available() -> bool:
    """True when this torch build has oneDNN's packed linear and it agrees with ``F.linear``."""
    try:
        w, b, x = torch.randn(8, 4), torch.randn(8), torch.randn(2, 3, 4)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, 2)
        out = torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")
        return bool(torch.backends.mkldnn.is_available() and torch.allclose(out, F.linear(x, w, b), atol=1e-5))
    except (AttributeError, RuntimeError):
        return False


def _packed_forward(packed: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor):
    if torch.is_grad_enabled() or x.dtype != torch.float32:
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")


@contextmanager
def packed_linears(model: nn.Module, batch_hint: int = 16) -> Iterator[None]:
    """Within the block, every fp32 CPU ``nn.Linear`` of ``model`` computes with a packed copy of
    its current weight (also the base layers inside LoRA wrappers); nothing changes when packing
    is unavailable. ``batch_hint`` is the expected number of rows per call."""
    patched: list[nn.Module] = []
    try:
        if packing_available():
            for module in model.modules():
                w = getattr(module, "weight", None)
                if type(module) is nn.Linear and w.dtype == torch.float32 and w.device.type == "cpu":
                    packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), max(1, batch_hint))
                    module.forward = functools.partial(_packed_forward, packed, w, module.bias)
                    patched.append(module)
        yield
    finally:
        for module in patched:
            del module.forward  # the instance attribute; the class's forward is back
