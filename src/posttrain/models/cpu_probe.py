"""What this CPU computes fastest: read once from its flags and a short measurement.

CPUs differ in ways that flip which precision is fastest: on an AMD EPYC with AVX512-BF16 a
bf16 matmul at decoding shapes runs about 1.5x faster than fp32; on an Intel Xeon with AMX,
about 3x; on a CPU with neither, a bf16 matmul is emulated and slower than fp32, except at one
or two rows, where reading bf16 weights (half the bytes) wins (1.6-2.1x on a Zen 3 EPYC). So the fast
paths that change precision are chosen by measuring, once per process: the packed linear layer
at the decoding shape of the default model (16 rows, 576 -> 1536), in both dtypes, best of a few
repetitions (about 50 ms in all); on a CPU without bf16 units, one-row matmuls over more weights
than its caches hold (about 0.5 s). Kernels are chosen the same way: the training pass's float32
matmuls run on oneDNN where it measured clearly faster than PyTorch's MKL path (2x on a Zen 5
AMD EPYC, whose CPUs MKL runs on a generic code path; level on a Zen 3 one, which keeps MKL).
"""

from __future__ import annotations

import functools
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from posttrain.models.packed_linear import _pack, _packed_linear, packing_available


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (/proc/cpuinfo on Linux; empty elsewhere), read once per process."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def has_bf16_units() -> bool:
    """AVX512-BF16 or AMX-BF16: hardware bf16 dot products (without them bf16 is emulated)."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def _best_seconds(fn, repeats: int = 5, calls: int = 20) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


@functools.cache
def bf16_decode_speedup(rows: int = 16, features: int = 576, outputs: int = 1536) -> float:
    """How many times faster a packed bf16 linear layer is than fp32 here, at a decoding shape;
    0 when bf16 cannot be used (no bf16 units, or no oneDNN packing in this torch)."""
    if not has_bf16_units() or not packing_available():
        return 0.0
    with torch.no_grad():
        weight, x = torch.randn(outputs, features), torch.randn(rows, features)
        try:
            p32, p16 = _pack(weight, rows), _pack(weight.bfloat16(), rows)
            x16 = x.bfloat16()
            fp32 = _best_seconds(lambda: _packed_linear(p32, None, x))
            bf16 = _best_seconds(lambda: _packed_linear(p16, None, x16))
        except RuntimeError:
            return 0.0
    return fp32 / bf16


@functools.cache
def bf16_training_speedup(rows: int = 512, features: int = 576, outputs: int = 1536) -> float:
    """How many times faster a linear layer's forward and backward run under bf16 autocast than in
    fp32 here, at a training shape; 0 without bf16 units."""
    if not has_bf16_units():
        return 0.0
    weight = torch.randn(outputs, features, requires_grad=True)
    x = torch.randn(rows, features, requires_grad=True)

    def step(autocast: bool) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = torch.nn.functional.linear(x, weight)
        out.float().sum().backward()

    try:
        with torch.enable_grad():
            fp32 = _best_seconds(lambda: step(False), calls=5)
            bf16 = _best_seconds(lambda: step(True), calls=5)
    except RuntimeError:
        return 0.0
    return fp32 / bf16


@functools.cache
def one_row_bf16_decode_speedup(layers: int = 24, features: int = 576, outputs: int = 1536) -> float:
    """How many times faster a one-row decoding step's matmuls are on plain bf16 weights (PyTorch's
    matrix-vector kernel, which widens them to fp32 as it reads them) than on packed fp32 ones,
    here; 0 without oneDNN packing. Timed over ``layers`` weights (85 MB in fp32), more than a CPU
    cache holds, because a one-row step is bound by reading its weights from memory (about 0.5 s)."""
    if not packing_available():
        return 0.0
    with torch.no_grad():
        weights = [torch.rand(outputs, features) - 0.5 for _ in range(layers)]
        packed = [_pack(w, 1) for w in weights]
        halves = [w.bfloat16() for w in weights]
        del weights
        x = torch.randn(1, features)
        fp32 = _best_seconds(lambda: [_packed_linear(p, None, x) for p in packed], repeats=3, calls=2)
        bf16 = _best_seconds(lambda: [F.linear(x.bfloat16(), h).float() for h in halves], repeats=3, calls=2)
    return fp32 / bf16


def bf16_decoding_speedup() -> float:
    """What ``rollout.decode_dtype: bfloat16`` buys here, as :mod:`posttrain.rollout.fast_decode` uses
    it: at every step where the CPU has bf16 units (:func:`bf16_decode_speedup`), otherwise only at
    narrow steps of one or two rows (:func:`one_row_bf16_decode_speedup`)."""
    return bf16_decode_speedup() if has_bf16_units() else one_row_bf16_decode_speedup()


# The oneDNN training path is taken only with a clear margin: on an AMD EPYC (Zen 3, AVX2 only) single
# layers measured 0.9-1.2x, with a median of 1.08x, while whole training passes ran 1.1-1.3x slower
# on it (benchmarks/mfu.py); on Zen 5 a layer measured 2.1-2.2x.
ONEDNN_TRAINING_THRESHOLD = 1.25


@functools.cache
def onednn_training_speedup(rows: int = 256, features: int = 576, hidden: int = 1536) -> float:
    """How many times faster float32 linear layers' forward and backward run on oneDNN
    (:class:`~posttrain.models.onednn_linear.OneDNNLinear`) than through PyTorch's own matmuls
    here, at the training shapes of an MLP block (``features -> hidden -> features``); 0 when this
    torch has no oneDNN linear op. The two paths are timed in turns and the median ratio taken, so
    that a burst of load on a shared machine does not decide for the whole run."""
    from posttrain.models.onednn_linear import OneDNNLinear

    if not packing_available():
        return 0.0
    up, down = torch.randn(hidden, features, requires_grad=True), torch.randn(features, hidden, requires_grad=True)
    x = torch.randn(rows, features, requires_grad=True)

    def step(onednn: bool) -> None:
        linear = (lambda a, w: OneDNNLinear.apply(a, w, None)) if onednn else torch.nn.functional.linear
        linear(linear(x, up), down).sum().backward()

    def seconds(onednn: bool) -> float:
        start = time.perf_counter()
        step(onednn)
        return time.perf_counter() - start

    try:
        with torch.enable_grad(), torch.autocast("cpu", enabled=False):  # whatever pass asks first
            seconds(False), seconds(True)
            return statistics.median(seconds(False) / seconds(True) for _ in range(9))
    except RuntimeError:
        return 0.0


def onednn_training_pays() -> bool:
    """Whether training passes run their float32 matmuls on oneDNN here (see ONEDNN_TRAINING_THRESHOLD)."""
    return onednn_training_speedup() >= ONEDNN_TRAINING_THRESHOLD


def decode_dtype(name: str) -> torch.dtype:
    """``rollout.decode_dtype`` as a torch dtype; ``auto`` is bfloat16 where it measured 1.2x faster or
    more (:func:`bf16_decoding_speedup`)."""
    if name == "auto":
        return torch.bfloat16 if bf16_decoding_speedup() >= 1.2 else torch.float32
    return getattr(torch, name)
