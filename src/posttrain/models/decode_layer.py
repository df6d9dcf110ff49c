"""Our own kernels for a decoder layer's decode step besides its matmuls (``decode_layer.c``):
the residual add with RMSNorm, SwiGLU, and attention with its rotary embedding and cache write,
one call each.

PyTorch runs this work as about 25 operations a layer: an RMSNorm alone is seven, 20 us at one
row on a Zen 4 EPYC, and attention's batched matmuls of a few hundred 3 x 64 x L products read the
cache at 8 GB/s where the memory streams at about 30. Attention here reads each KV head's keys and
values once for the query heads that share them, from a float32 cache or a bf16 one (half the
bytes; what decoding in bf16 keeps), with float32 sums and a float32 softmax. The kernels are built
on first use (:mod:`posttrain.models.native`); :mod:`posttrain.rollout.fast_decode` uses them where
:func:`posttrain.models.cpu_probe.native_layer_speedup` measured them faster than PyTorch's
operations, and PyTorch's operations where they cannot be built.

Activations (a matmul kernel's inputs and outputs) are float32 or bf16; the residual stream
stays float32.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from posttrain.models import native

SOURCE = Path(__file__).with_name("decode_layer.c")
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}


_P, _SIZE, _FLOAT, _THREADS = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
_KERNELS = native.Kernels(SOURCE, "decode layer kernels", {
    **{f"decode_attention_{a}_{c}": [_P, _SIZE, _P, _P, _P, _P, _SIZE, _SIZE, _P, _P, _SIZE, _SIZE, _SIZE, _SIZE,
                                     _FLOAT, _P, _THREADS]
       for a in _SUFFIX.values() for c in _SUFFIX.values()},
    **{f"add_rms_norm_{a}": [_P, _P, _P, _SIZE, _SIZE, _FLOAT, _P, _THREADS] for a in _SUFFIX.values()},
    **{f"swiglu_{a}": [_P, _SIZE, _SIZE, _P, _THREADS] for a in _SUFFIX.values()}})
unavailable_reason = _KERNELS.unavailable_reason


def supports(head_dim: int, heads: int, kv_heads: int) -> bool:
    """True when the kernels are built here and handle this attention's shape."""
    return unavailable_reason() is None and head_dim % 8 == 0 and heads % kv_heads == 0


def _activations(*tensors: torch.Tensor) -> str:
    dtype = tensors[0].dtype
    if dtype not in _SUFFIX or any(t.dtype != dtype or not t.is_contiguous() for t in tensors):
        raise ValueError(f"expected contiguous activations, all float32 or all bf16, got "
                         f"{[str(t.dtype) for t in tensors]}")
    return _SUFFIX[dtype]


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float,
                 dtype: torch.dtype) -> torch.Tensor:
    """``x += delta`` in place (the residual stream ``[rows, hidden]``, float32; ``delta`` in
    ``dtype``, or None), then Llama's RMSNorm of ``x`` scaled by ``weight``, returned in ``dtype``:
    what :func:`posttrain.rollout.fast_decode.rms_norm` computes."""
    rows, hidden = x.shape
    if x.dtype != torch.float32 or not x.is_contiguous() or weight.shape != (hidden,):
        raise ValueError(f"expected a contiguous float32 residual stream and a weight of {hidden}, got "
                         f"{x.dtype} {list(x.shape)} and {list(weight.shape)}")
    out = torch.empty(rows, hidden, dtype=dtype)
    suffix = _activations(out, *([] if delta is None else [delta]))
    if delta is not None and delta.shape != x.shape:
        raise ValueError(f"the residual {list(delta.shape)} does not match the stream {list(x.shape)}")
    weight = weight.detach().float().contiguous()
    getattr(_KERNELS.loaded(), f"add_rms_norm_{suffix}")(
        x.data_ptr(), None if delta is None else delta.data_ptr(), weight.data_ptr(), rows, hidden, eps,
        out.data_ptr(), torch.get_num_threads())
    return out


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up`` ``[rows, 2 inter]`` (gate first), in its dtype."""
    rows, width = gate_up.shape
    out = torch.empty(rows, width // 2, dtype=gate_up.dtype)
    getattr(_KERNELS.loaded(), f"swiglu_{_activations(gate_up)}")(gate_up.data_ptr(), rows, width // 2,
                                                                  out.data_ptr(), torch.get_num_threads())
    return out


def append_and_attend(qkv: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, keys: torch.Tensor,
                      values: torch.Tensor, col: int, bias: torch.Tensor, heads: int) -> torch.Tensor:
    """One decoder layer's attention for one new token per row, as :func:`posttrain.rollout.fast_decode.
    rotate` and :func:`~posttrain.rollout.fast_decode.attend` compute it: q and k of ``qkv``
    ``[rows, heads + 2 kv_heads, dim]`` (float32 or bf16) rotated by ``cos``/``signed_sin`` ``[rows,
    dim]``; the key and value written at column ``col`` of ``keys``/``values`` ``[rows, kv_heads,
    capacity, dim]`` (float32 or bf16); each query head attending over columns 0..col with the
    additive mask ``bias`` ``[rows, 1, 1, capacity]``. Returns ``[rows, heads * dim]`` in qkv's dtype."""
    lib = _KERNELS.loaded()
    rows, width, dim = qkv.shape
    kv_heads, capacity = keys.shape[1], keys.shape[2]
    if width != heads + 2 * kv_heads or keys.shape != (rows, kv_heads, capacity, dim) or values.shape != keys.shape:
        raise ValueError(f"qkv {list(qkv.shape)} and a cache {list(keys.shape)} do not fit {heads} query heads")
    if qkv.stride()[1:] != (dim, 1) or not (keys.is_contiguous() and values.is_contiguous()):
        raise ValueError("qkv's heads and the cache must be contiguous")
    if not 0 <= col < capacity or values.dtype != keys.dtype or keys.dtype not in _SUFFIX or qkv.dtype not in _SUFFIX:
        raise ValueError(f"column {col} is outside the cache (capacity {capacity}), or qkv is not float32 or "
                         f"bf16, or keys and values are not both float32 or both bf16")
    cos, signed_sin = cos.float().contiguous(), signed_sin.float().contiguous()
    bias = bias.float().contiguous()
    threads = torch.get_num_threads()
    group = heads // kv_heads
    scratch = torch.empty(threads * (group * (col + 1) + (group + 1) * dim))
    out = torch.empty(rows, heads * dim, dtype=qkv.dtype)
    kernel = getattr(lib, f"decode_attention_{_SUFFIX[qkv.dtype]}_{_SUFFIX[keys.dtype]}")
    kernel(qkv.data_ptr(), qkv.stride(0), cos.data_ptr(), signed_sin.data_ptr(), keys.data_ptr(),
           values.data_ptr(), capacity, col, bias.data_ptr(), out.data_ptr(), rows, heads, kv_heads, dim,
           dim ** -0.5, scratch.data_ptr(), threads)
    return out
