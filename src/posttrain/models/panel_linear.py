"""Our own matmul for decode steps (``panel_gemm.c``), built on the first use with the system's C compiler.

A decode step multiplies 1 to 64 rows by every weight of the model. At those widths the work is
bound by reading the weights (one row) or by the vector units (16 rows and up), and on an AVX2 CPU
(Zen 3 EPYC, 2 threads) neither oneDNN's packed kernel nor MKL reached either bound: at 16 rows
oneDNN ran the default model's matmuls at 60-90 GFLOP/s against the machine's 180 (the weights'
540 MB stream at 29 GB/s there, so the bound is about 25 ms against oneDNN's 55-57 ms). The
kernel in ``panel_gemm.c`` keeps the weights in panels of 16 outputs, one sequential stream each,
and holds a 6-row x 16-output block of sums in registers; the weights are float32, or bf16 widened
to float32 as they are read (half the bytes), and the sums float32. Measured there over the
default model's float32 matmuls (30 layers and the head, medians): 1 row 22-26 ms (oneDNN 31-33),
4 rows 22 (35), 16 rows 39-42 (55-57), 64 rows 125 (149).

It is built on first use (:mod:`posttrain.models.native`). Where it cannot be built
:func:`unavailable_reason` says why and the decode kernels that PyTorch ships serve every step;
where it can, :mod:`posttrain.models.cpu_probe` still uses it only where it measured faster. On CPUs
with AVX-512 the same source is built a second time with it (:data:`AVX512`: 16 outputs a vector,
two panels and 8 rows at a time; the same panels and the same sums), which the probes time as
kernels of their own: on a Zen 4 EPYC the default model's float32 matmuls took 24.5-25.1 ms at 16 rows
against 25.1-26.1 for the AVX2 build, 14.3-19.6 against 16.9-20.2 at 8 rows, 44.0-45.1 against 46.4-52.2
at 32 (two runs, each one process timing both in turns, medians of 12; the kernel asks for its next
panels from every block of rows since, see ``panel_gemm.c``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from posttrain.models import native

SOURCE = Path(__file__).with_name("panel_gemm.c")
PANEL = 16  # outputs per panel, as in panel_gemm.c


@dataclass(frozen=True)
class PanelWeight:
    """A weight ``[outputs, inputs]`` stored as ``panels`` ``[ceil(outputs / 16), inputs, 16]``
    (float32 or bfloat16; outputs past ``outputs`` are zero), and the build of the kernel that reads it."""

    panels: torch.Tensor
    outputs: int
    build: native.Kernels


Weight = torch.Tensor | Sequence[torch.Tensor]  # a weight, or its parts one below the other (q, k and v)

_P, _SIZE = ctypes.c_void_p, ctypes.c_int64
_SIGNATURES = {**{name: [_P, _SIZE, _SIZE, _P, _SIZE, _P, _P, ctypes.c_int]
                  for name in ("panel_linear_f32", "panel_linear_bf16")},
               **{name: [_P, _SIZE, _SIZE, _SIZE, _P, ctypes.c_int] for name in ("panel_pack_f32", "panel_pack_bf16")}}
AVX2 = native.Kernels(SOURCE, "panel matmul kernel", _SIGNATURES)
AVX512 = native.Kernels(SOURCE, "panel matmul kernel (AVX-512 build)", _SIGNATURES, needs=("avx512f",),
                        flags=("-mavx512f",))
unavailable_reason = AVX2.unavailable_reason


def weight_parts(weight: Weight) -> tuple[list[torch.Tensor], int, int]:
    """A weight ``[outputs, inputs]``, or the parts it is made of one below the other (q, k and v), as
    contiguous float32 parts, and its (outputs, inputs); ValueError for parts that do not stack."""
    parts = [weight] if isinstance(weight, torch.Tensor) else list(weight)
    parts = [part.detach().float().contiguous() for part in parts]
    if not parts or any(part.dim() != 2 or part.shape[1] != parts[0].shape[1] for part in parts):
        shapes = [list(part.shape) for part in parts]
        raise ValueError(f"expected weights [outputs, inputs] with one input width, got {shapes}")
    return parts, sum(part.shape[0] for part in parts), parts[0].shape[1]


def write_parts(write: Callable[..., None], parts: list[torch.Tensor], panels: torch.Tensor) -> None:
    """The parts of a weight (:func:`weight_parts`) written one below the other into ``panels``
    ``[ceil(outputs / 16), ...]`` by ``write``, one of our C packing routines (``src, rows, inputs,
    first output, dst, threads``); the outputs past the weight's zero."""
    start = 0
    if sum(part.shape[0] for part in parts) % PANEL:
        panels[-1].zero_()
    for part in parts:
        if part.shape[0]:
            write(part.data_ptr(), part.shape[0], part.shape[1], start, panels.data_ptr(), torch.get_num_threads())
        start += part.shape[0]


def pack(weight: Weight, dtype: torch.dtype = torch.float32, build: native.Kernels = AVX2) -> PanelWeight:
    """``weight`` ``[outputs, inputs]`` (or its parts, one below the other, packed as their
    concatenation without making it) in the kernel's layout, in ``dtype`` (float32 or bfloat16), for
    ``build`` (:data:`AVX2` or :data:`AVX512`) to read; RuntimeError where that build cannot run here."""
    lib = build.loaded()
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"the panel kernel reads float32 or bfloat16 weights, not {dtype}")
    parts, outputs, inputs = weight_parts(weight)
    panels = torch.empty(-(-outputs // PANEL), inputs, PANEL, dtype=dtype)
    write_parts(lib.panel_pack_bf16 if dtype == torch.bfloat16 else lib.panel_pack_f32, parts, panels)
    return PanelWeight(panels, outputs, build)


def float32_operands(x: torch.Tensor, bias: torch.Tensor | None, inputs: int,
                     outputs: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``x`` ``[rows, inputs]`` and ``bias`` ``[outputs]`` (or None) as contiguous float32, as our decode
    matmul kernels read them; ValueError for other shapes."""
    x = x.to(torch.float32).contiguous()
    if x.dim() != 2 or x.shape[1] != inputs:
        raise ValueError(f"expected inputs of shape [rows, {inputs}], got {list(x.shape)}")
    if bias is not None:
        bias = bias.to(torch.float32).contiguous()
        if bias.shape != (outputs,):
            raise ValueError(f"expected a bias of shape [{outputs}], got {list(bias.shape)}")
    return x, bias


def linear(weight: PanelWeight, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """x ``[rows, inputs]`` W^T + b, float32 ``[rows, outputs]`` (float32 sums whatever the weights' dtype)."""
    inputs = weight.panels.shape[1]
    x, bias = float32_operands(x, bias, inputs, weight.outputs)
    lib = weight.build.loaded()
    kernel = lib.panel_linear_bf16 if weight.panels.dtype == torch.bfloat16 else lib.panel_linear_f32
    out = torch.empty(x.shape[0], weight.outputs)
    kernel(x.data_ptr(), x.shape[0], inputs, weight.panels.data_ptr(), weight.outputs,
           None if bias is None else bias.data_ptr(), out.data_ptr(), torch.get_num_threads())
    return out
