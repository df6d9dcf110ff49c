"""Our own bf16 matmul for decode steps on CPUs with AVX512-BF16 (``panel_dot.c``).

On such CPUs a decode step of 16 rows (the demo's: 2 prompts x 8 samples) ran its bf16 matmuls on
oneDNN's linear well below what the bf16 dot-product units and the memory allow: on a Zen 4 EPYC
(2 threads) the default model's 121 matmuls took about 20 ms, where reading its 270 MB of bf16
weights takes about 9 ms and their 4.3 GFLOP about as long. The kernel keeps each weight in panels
of 16 outputs by pairs of inputs, one 64-byte vector per pair, and multiplies them with vdpbf16ps
(32 multiply-adds an instruction) against the rows rounded to bf16 once per call; sums and results
stay float32. There, one process with the kernels in turns: 14.3 / 25.5 / 47.7 ms at 16 / 32 / 64
rows against oneDNN's 20.4 / 31.2 / 52.2, 10.6 against 14.4 (our AVX2 panel kernel in bf16) at 8,
level with it at one row. Built on first use (:mod:`posttrain.models.native`) where the CPU reports
AVX512F, AVX512BW and AVX512-BF16, and used only where :mod:`posttrain.models.cpu_probe` measured it
fastest for the step's width.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import torch

from posttrain.models import native
from posttrain.models.panel_linear import Weight, float32_operands, weight_parts, write_parts

SOURCE = Path(__file__).with_name("panel_dot.c")
PANEL = 16  # outputs per panel, as in panel_dot.c


@dataclass(frozen=True)
class PairedWeight:
    """A weight ``[outputs, inputs]`` in bf16 as ``panels`` ``[ceil(outputs / 16), ceil(inputs / 2), 16 x 2]``
    (outputs past ``outputs`` and an odd last input are zero)."""

    panels: torch.Tensor
    outputs: int
    inputs: int


_P, _SIZE = ctypes.c_void_p, ctypes.c_int64
_KERNELS = native.Kernels(SOURCE, "bf16 dot-product matmul kernel",
                          {"panel_dot_bf16": [_P, _SIZE, _SIZE, _P, _SIZE, _P, _P, _P, ctypes.c_int],
                           "panel_dot_pack": [_P, _SIZE, _SIZE, _SIZE, _P, ctypes.c_int]},
                          needs=("avx512f", "avx512bw", "avx512_bf16"))
unavailable_reason = _KERNELS.unavailable_reason


def pack(weight: Weight) -> PairedWeight:
    """``weight`` ``[outputs, inputs]`` (or its parts, one below the other) in bf16, in the kernel's
    layout; RuntimeError where it cannot run here."""
    lib = _KERNELS.loaded()
    parts, outputs, inputs = weight_parts(weight)
    panels = torch.empty(-(-outputs // PANEL), (inputs + 1) // 2, 2 * PANEL, dtype=torch.bfloat16)
    write_parts(lib.panel_dot_pack, parts, panels)
    return PairedWeight(panels, outputs, inputs)


def linear(weight: PairedWeight, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """x ``[rows, inputs]`` W^T + b, float32 ``[rows, outputs]``: x rounded to bf16, products summed in float32."""
    x, bias = float32_operands(x, bias, weight.inputs, weight.outputs)
    rows = x.shape[0]
    out = torch.empty(rows, weight.outputs)
    rounded = torch.empty(rows, 2 * weight.panels.shape[1], dtype=torch.bfloat16)  # the kernel's scratch
    _KERNELS.loaded().panel_dot_bf16(x.data_ptr(), rows, weight.inputs, weight.panels.data_ptr(), weight.outputs,
                                     None if bias is None else bias.data_ptr(), out.data_ptr(), rounded.data_ptr(),
                                     torch.get_num_threads())
    return out
