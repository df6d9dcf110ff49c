"""The matmul kernels a decode step can run on, each with the copy of a weight it reads.

oneDNN's linear on weights reordered once into its blocked layout (:mod:`posttrain.models.packed_linear`),
PyTorch's own ``F.linear`` on plain row-major weights (MKL, and its matrix-vector kernel at one
row), or our own kernel on weights in panels of 16 outputs (:mod:`posttrain.models.panel_linear`,
AVX2 CPUs with a C compiler; "panel512" is its AVX-512 build); with float32 weights, or bf16 ones
(half the bytes to read; plain and panel bf16 weights are widened to float32 as they are read,
packed ones run on bf16 dot-product units where the CPU has them, as does our "dot bf16" kernel,
:mod:`posttrain.models.panel_dot`, on CPUs with AVX512-BF16). Which is fastest differs by CPU and by
the number of rows, so :mod:`posttrain.models.cpu_probe` times them and :mod:`posttrain.rollout.fast_decode`
runs each step on the kernel chosen for its width.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from posttrain.models import native, panel_dot, panel_linear
from posttrain.models.packed_linear import _pack, _packed_linear
from posttrain.models.panel_linear import Weight

Linear = Callable[[object, torch.Tensor | None, torch.Tensor], torch.Tensor]  # (copy of the weight, bias, x)


def _whole(weight: Weight) -> torch.Tensor:
    return weight if isinstance(weight, torch.Tensor) else torch.cat(list(weight))


@dataclass(frozen=True)
class Kernel:
    """``prepare(weight, rows)`` makes the copy the kernel reads from a weight or the parts it is made
    of, one below the other (``rows``: the batch it is packed for; RuntimeError where this CPU cannot
    run the kernel); ``linear(copy, bias, x)`` is x W^T + b, from inputs in any float dtype, in
    ``activations``: the dtype of the inputs it computes from and of its results (the copy's, or
    float32 for the panel kernel, which widens bf16 weights as it reads them); ``dtype`` is the
    copy's and the bias's."""

    prepare: Callable[[Weight, int], object]
    linear: Linear
    dtype: torch.dtype
    activations: torch.dtype


def _plain(dtype: torch.dtype) -> Kernel:
    return Kernel(lambda w, rows: _whole(w).to(dtype).contiguous(), lambda w, b, x: F.linear(x.to(dtype), w, b),
                  dtype, dtype)


def _packed(dtype: torch.dtype) -> Kernel:
    return Kernel(lambda w, rows: _pack(_whole(w).to(dtype), rows),
                  lambda w, b, x: _packed_linear(w, b, x.to(dtype)), dtype, dtype)


def _panel(dtype: torch.dtype, build: native.Kernels = panel_linear.AVX2) -> Kernel:
    return Kernel(lambda w, rows: panel_linear.pack(w, dtype, build), panel_linear.linear, dtype, torch.float32)


KERNELS = {"packed fp32": _packed(torch.float32), "plain fp32": _plain(torch.float32),
           "panel fp32": _panel(torch.float32), "panel512 fp32": _panel(torch.float32, panel_linear.AVX512),
           "packed bf16": _packed(torch.bfloat16), "plain bf16": _plain(torch.bfloat16),
           "panel bf16": _panel(torch.bfloat16), "panel512 bf16": _panel(torch.bfloat16, panel_linear.AVX512),
           "dot bf16": Kernel(lambda w, rows: panel_dot.pack(w), panel_dot.linear, torch.bfloat16, torch.float32)}
FP32_KERNELS = ("packed fp32", "plain fp32", "panel fp32", "panel512 fp32")


def definitions() -> str:
    """This module's source and our kernels' C sources: what timings of these kernels depend on in our
    code (the decode-kernel probes of :mod:`posttrain.models.cpu_probe` measure again when it changes)."""
    return (inspect.getsource(sys.modules[__name__]) + native.source_text(panel_linear.SOURCE)
            + native.source_text(panel_dot.SOURCE))
