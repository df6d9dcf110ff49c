"""Our own attention for decode steps (``decode_attention.c``): rotary embedding, cache write and
grouped-query attention of one decoder layer in one call per layer.

A decode step of 8 to 64 rows spent about a quarter of its time in attention on a Zen 4 EPYC when
PyTorch ran it: two batched matmuls of a few hundred 3 x 64 x L products per layer read the cache
at 8 GB/s (the memory streams at about 30 there), and the rotary multiplies of bf16 projections by
float32 tables were slower still per byte. The kernel reads each KV head's keys and values once for
the query heads that share them, from a float32 cache or a bf16 one (half the bytes; what decoding
in bf16 keeps), with float32 sums and a float32 softmax. It is built on first use
(:mod:`posttrain.models.native`); :mod:`posttrain.models.cpu_probe` uses it only where it measured
faster than PyTorch's operations, and :mod:`posttrain.rollout.fast_decode` falls back to those
where it cannot be built.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from posttrain.models import native

SOURCE = Path(__file__).with_name("decode_attention.c")
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}


@functools.cache
def _library() -> ctypes.CDLL | str:
    """The loaded kernel, or why there is none."""
    lib = native.load(SOURCE)
    if isinstance(lib, str):
        return lib
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    for a in _SUFFIX.values():
        for c in _SUFFIX.values():
            getattr(lib, f"decode_attention_{a}_{c}").argtypes = [
                pointer, size, pointer, pointer, pointer, pointer, size, size, pointer, pointer,
                size, size, size, size, ctypes.c_float, pointer, ctypes.c_int]
    return lib


def unavailable_reason() -> str | None:
    """Why the kernel cannot run here, or None when it can."""
    lib = _library()
    return lib if isinstance(lib, str) else None


def supports(head_dim: int, heads: int, kv_heads: int) -> bool:
    """True when the kernel is built here and handles this attention's shape."""
    return unavailable_reason() is None and head_dim % 8 == 0 and heads % kv_heads == 0


def append_and_attend(qkv: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, keys: torch.Tensor,
                      values: torch.Tensor, col: int, bias: torch.Tensor, heads: int) -> torch.Tensor:
    """One decoder layer's attention for one new token per row, as :func:`posttrain.rollout.fast_decode.
    rotate` and :func:`~posttrain.rollout.fast_decode.attend` compute it: q and k of ``qkv``
    ``[rows, heads + 2 kv_heads, dim]`` (float32 or bf16) rotated by ``cos``/``signed_sin`` ``[rows,
    dim]``; the key and value written at column ``col`` of ``keys``/``values`` ``[rows, kv_heads,
    capacity, dim]`` (float32 or bf16); each query head attending over columns 0..col with the
    additive mask ``bias`` ``[rows, 1, 1, capacity]``. Returns ``[rows, heads * dim]`` float32."""
    lib = _library()
    if isinstance(lib, str):
        raise RuntimeError(f"the decode attention kernel is not available: {lib}")
    rows, width, dim = qkv.shape
    kv_heads, capacity = keys.shape[1], keys.shape[2]
    if width != heads + 2 * kv_heads or keys.shape != (rows, kv_heads, capacity, dim) or values.shape != keys.shape:
        raise ValueError(f"qkv {list(qkv.shape)} and a cache {list(keys.shape)} do not fit {heads} query heads")
    if qkv.stride()[1:] != (dim, 1) or not (keys.is_contiguous() and values.is_contiguous()):
        raise ValueError("qkv's heads and the cache must be contiguous")
    if not 0 <= col < capacity or values.dtype != keys.dtype:
        raise ValueError(f"column {col} is outside the cache (capacity {capacity}) or keys and values differ in dtype")
    cos, signed_sin = cos.float().contiguous(), signed_sin.float().contiguous()
    bias = bias.float().contiguous()
    threads = torch.get_num_threads()
    group = heads // kv_heads
    scratch = torch.empty(threads * (group * (col + 1) + (group + 1) * dim))
    out = torch.empty(rows, heads * dim)
    kernel = getattr(lib, f"decode_attention_{_SUFFIX[qkv.dtype]}_{_SUFFIX[keys.dtype]}")
    kernel(qkv.data_ptr(), qkv.stride(0), cos.data_ptr(), signed_sin.data_ptr(), keys.data_ptr(),
           values.data_ptr(), capacity, col, bias.data_ptr(), out.data_ptr(), rows, heads, kv_heads, dim,
           dim ** -0.5, scratch.data_ptr(), threads)
    return out
