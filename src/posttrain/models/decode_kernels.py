"""The matmul kernels a decode step can run on, each with the copy of a weight it reads.

oneDNN's linear on weights reordered once into its blocked layout (:mod:`posttrain.models.packed_linear`),
PyTorch's own ``F.linear`` on plain row-major weights (MKL, and its matrix-vector kernel at one
row), or our own kernel on weights in panels of 16 outputs (:mod:`posttrain.models.panel_linear`,
float32, AVX2 CPUs with a C compiler); in float32, or in bf16 (half the bytes to read; a plain bf16 weight is widened to float32
as it is read, a packed one runs on bf16 dot-product units where the CPU has them). Which is
fastest differs by CPU and by the number of rows, so :mod:`posttrain.models.cpu_probe` times them
and :mod:`posttrain.rollout.fast_decode` runs each step on the kernel chosen for its width.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from posttrain.models import panel_linear
from posttrain.models.packed_linear import _pack, _packed_linear


Linear = Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Kernel:
    """``prepare(weight, rows)`` makes the copy the kernel reads (``rows``: the batch it is packed
    for; RuntimeError where this CPU cannot run the kernel); ``linear(copy, bias, x)`` is x W^T + b, in the copy's dtype (a bf16 result is left for
    the float32 operation that consumes it to promote); ``dtype`` is the copy's and the bias's."""

    prepare: Callable[[torch.Tensor, int], torch.Tensor]
    linear: Linear
    dtype: torch.dtype


def _plain(dtype: torch.dtype) -> Kernel:
    return Kernel(lambda w, rows: w.to(dtype).contiguous(), lambda w, b, x: F.linear(x.to(dtype), w, b), dtype)


def _packed(dtype: torch.dtype) -> Kernel:
    return Kernel(lambda w, rows: _pack(w.to(dtype), rows), lambda w, b, x: _packed_linear(w, b, x.to(dtype)), dtype)


_PANEL = Kernel(lambda w, rows: panel_linear.pack(w), panel_linear.linear, torch.float32)

KERNELS = {"packed fp32": _packed(torch.float32), "plain fp32": _plain(torch.float32), "panel fp32": _PANEL,
           "packed bf16": _packed(torch.bfloat16), "plain bf16": _plain(torch.bfloat16)}
FP32_KERNELS = ("packed fp32", "plain fp32", "panel fp32")
