"""The training pass's attention on our own kernels (``train_attention.c``): forward and backward.

At the shapes of RL batches (heads of 64, tens to a few hundred keys) PyTorch's CPU flash-attention
kernel runs at 60-70 GFLOP/s, a third of what the CPU's matmuls reach, and attention took 7-10% of
a training pass. The kernels in ``train_attention.c`` take one (sequence, KV head) at a time, with
its keys packed once and its query heads' rows in cache-sized blocks (see there), stop each sum where
the mask leaves only zeros, and keep only each row's log-normaliser for the backward, as FlashAttention
does. On a Zen 4 EPYC (2 threads, 30 layers forward and backward, 9 query and 3 KV heads of 64) they
took 641 ms against SDPA's 921 for 8 sequences of 256 tokens under a causal mask, 242 against 310 ms for
16 completions of 64 tokens over 99 keys; stopping at each six rows' last key rather than each 64
rows', and each weighted sum at the rows or keys that contribute, then made them 1.5x SDPA at the
latter shapes (:func:`posttrain.models.cpu_probe.train_attention_speedup`: 1.12-1.22x before).

:mod:`posttrain.models.attention` runs a packed batch's attention on them where
:func:`posttrain.models.cpu_probe.train_attention_pays` measured them faster than SDPA, and SDPA
where they cannot be built (:mod:`posttrain.models.native`).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from posttrain.models import native

SOURCE = Path(__file__).with_name("train_attention.c")


_P, _SIZE, _THREADS = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SHAPE = [_P, _P, _P, _P, _SIZE, _SIZE, _SIZE, _SIZE, _SIZE, _SIZE, ctypes.c_float]
_KERNELS = native.Kernels(SOURCE, "training attention kernels", {
    "attention_scratch": ([_SIZE, _SIZE], _SIZE),
    "attention_forward": [*_SHAPE, _P, _P, _P, _THREADS],
    "attention_backward": [*_SHAPE, _P, _P, _P, _P, _P, _P, _P, _THREADS]})
unavailable_reason = _KERNELS.unavailable_reason


def supports(query: torch.Tensor, key: torch.Tensor) -> bool:
    """True when the kernels are built here and take these ``[B, heads, L, dim]`` queries and keys:
    float32 on the CPU, a head dimension that is a multiple of 8, whole groups of query heads."""
    return (unavailable_reason() is None and query.device.type == "cpu" and query.dtype == key.dtype == torch.float32
            and query.shape[-1] % 8 == 0 and query.shape[1] % key.shape[1] == 0)


def _pointer(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _scratch(keys: int, dim: int) -> torch.Tensor:
    threads = torch.get_num_threads()
    return torch.empty(threads * _KERNELS.loaded().attention_scratch(keys, dim))


class _Attention(torch.autograd.Function):
    """softmax(scale q k^T, masked) v per head, with the backward of train_attention.c."""

    @staticmethod
    def forward(ctx, query, key, value, keep, scale):
        query, key, value = query.contiguous(), key.contiguous(), value.contiguous()
        batch, heads, length, dim = query.shape
        kv_heads, keys = key.shape[1], key.shape[2]
        out, lse = torch.empty_like(query), torch.empty(batch, heads, length)
        scratch = _scratch(keys, dim)  # held here: a temporary's memory would be freed before the call
        _KERNELS.loaded().attention_forward(
            query.data_ptr(), key.data_ptr(), value.data_ptr(), _pointer(keep), batch, heads, kv_heads, length, keys,
            dim, scale, out.data_ptr(), lse.data_ptr(), scratch.data_ptr(), torch.get_num_threads())
        ctx.save_for_backward(query, key, value, keep, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, keep, out, lse = ctx.saved_tensors
        batch, heads, length, dim = query.shape
        kv_heads, keys = key.shape[1], key.shape[2]
        grad_out = grad_out.contiguous()
        grads = torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)
        scratch = _scratch(keys, dim)
        _KERNELS.loaded().attention_backward(
            query.data_ptr(), key.data_ptr(), value.data_ptr(), _pointer(keep), batch, heads,
            kv_heads, length, keys, dim, ctx.scale, out.data_ptr(), lse.data_ptr(), grad_out.data_ptr(),
            *(g.data_ptr() for g in grads), scratch.data_ptr(), torch.get_num_threads())
        return *grads, None, None


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None = None,
              scale: float | None = None) -> torch.Tensor:
    """What ``F.scaled_dot_product_attention(query, key, value, attn_mask=mask, is_causal=mask is None,
    scale=scale, enable_gqa=True)`` computes, on our kernels: ``query`` ``[B, heads, L, dim]``,
    ``key``/``value`` ``[B, kv_heads, Lk, dim]`` (float32, :func:`supports`); ``mask`` ``[B, 1, L, Lk]``
    bool (True: the key is visible), or None for causal attention (query i sees keys 0 .. i, as
    SDPA's ``is_causal``). A query that sees no key returns zeros (SDPA returns NaN there)."""
    batch, heads, length, dim = query.shape
    if key.shape != value.shape or key.shape[0] != batch or key.shape[3] != dim or heads % key.shape[1]:
        raise ValueError(f"queries {list(query.shape)} do not fit keys {list(key.shape)} and values "
                         f"{list(value.shape)}")
    keep = None
    if mask is not None:
        if mask.dtype != torch.bool or mask.shape != (batch, 1, length, key.shape[2]):
            raise ValueError(f"expected a bool mask of shape {[batch, 1, length, key.shape[2]]}, got "
                             f"{mask.dtype} {list(mask.shape)}")
        keep = mask.reshape(batch, length, key.shape[2]).contiguous().view(torch.uint8)
    return _Attention.apply(query, key, value, keep, dim**-0.5 if scale is None else scale)
