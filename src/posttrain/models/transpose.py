"""A float32 CPU matrix transposed into a contiguous one, on our kernel (``transpose.c``).

The training pass's weight gradients on oneDNN (:func:`posttrain.models.onednn_linear.weight_grad`)
need the upstream gradient transposed, and PyTorch's copy of a transposed view ran at 2.5-4 GB/s on a
Zen 4 EPYC, where the kernel, a 16 x 16 block at a time through registers, runs at 10-18 GB/s. Where
the kernel cannot be built (:func:`posttrain.models.native.load` says why), PyTorch's copy serves.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import torch

from posttrain.models import native

SOURCE = Path(__file__).with_name("transpose.c")
_P, _SIZE = ctypes.c_void_p, ctypes.c_int64
_KERNELS = native.Kernels(SOURCE, "transpose kernel", {"transpose_f32": [_P, _SIZE, _SIZE, _SIZE, _P, ctypes.c_int]})
unavailable_reason = _KERNELS.unavailable_reason


_scratch = threading.local()  # each thread's buffer for transposed(..., scratch=True)


def transposed(x: torch.Tensor, scratch: bool = False) -> torch.Tensor:
    """``x.T`` as a contiguous tensor, for a 2-D tensor; on the kernel for float32 CPU tensors whose rows are
    contiguous (a view of every ``k``-th row, or of some columns, too). ``scratch``: written into this thread's
    buffer, kept from call to call and grown to the largest matrix, so the result is valid only until the next
    such call (a training pass's weight gradients each use theirs at once, and need no block of their own)."""
    if (x.dim() != 2 or x.dtype != torch.float32 or x.device.type != "cpu" or x.stride(1) != 1
            or unavailable_reason() is not None):
        return x.t().contiguous()
    rows, cols = x.shape
    if scratch:
        buffer = getattr(_scratch, "buffer", None)
        if buffer is None or buffer.numel() < x.numel():
            buffer = _scratch.buffer = torch.empty(x.numel())
        out = buffer[:x.numel()].view(cols, rows)
    else:
        out = torch.empty(cols, rows)
    if x.numel():
        _KERNELS.loaded().transpose_f32(x.data_ptr(), rows, cols, x.stride(0), out.data_ptr(), torch.get_num_threads())
    return out
