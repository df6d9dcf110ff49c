"""What this CPU computes fastest: read once from its flags and a short measurement.

CPUs differ in ways that flip which precision and kernel are fastest: on an AMD EPYC with
AVX512-BF16 a bf16 matmul at decoding shapes runs about 1.5x faster than fp32; on an Intel Xeon
with AMX, about 3x; on a CPU with neither, a bf16 matmul is emulated and slower than fp32. A step
of one or two rows is another matter: it is bound by reading the weights, and there the fastest
kernel was plain bf16 weights on a Zen 3 EPYC (half the bytes, 1.6-2.1x; of the float32 ones,
oneDNN's packed; since then our own panel kernel, in either dtype), and MKL's matrix-vector kernel
on plain float32 weights on an Intel Xeon with AMX, whose packed kernels, bf16 included, were slower
at one row. So the fast paths are chosen by measuring, once per machine (kept in a file, so that
every run and its resumption choose alike: :mod:`posttrain.models.probe_cache`): the packed linear
layer at the decoding shape of the default model (16 rows, 576 -> 1536) in both dtypes (about 50
ms); every decode kernel at one row, at 16 rows and at 128 (a prompt prefill's width), over more
weights than a cache holds (1-3 s each, the first time a step of that width needs it). Kernels for
training are chosen the same way: the training pass's float32 matmuls run on oneDNN where it
measured clearly faster than PyTorch's MKL path (2x on a Zen 5 AMD EPYC, whose CPUs MKL runs on a
generic code path; level on a Zen 3 one, which keeps MKL; 0.85x on the Intel Xeon), and their weight
gradients on whichever of the two measured faster at those products (oneDNN on a Zen 4 AMD EPYC since
our kernel copies its transposed operand; MKL before, when PyTorch's copy did).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable

import torch

from posttrain.models import decode_layer, native, sample_tokens, train_attention, train_elementwise, transpose
from posttrain.models.allocator import keep_freed_memory
from posttrain.models.decode_kernels import FP32_KERNELS, KERNELS, definitions
from posttrain.models.packed_linear import _pack, _packed_linear, packing_available
from posttrain.models.probe_cache import cpu_flags, stored_per_machine


def has_bf16_units() -> bool:
    """AVX512-BF16 or AMX-BF16: hardware bf16 dot products (without them bf16 is emulated)."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def _best_seconds_in_turns(runs: dict[object, Callable[[], object]], repeats: int = 3) -> dict[object, float]:
    """Best time of each callable, timed in turns so that a burst of load on a shared machine does
    not fall on one of them only."""
    best = dict.fromkeys(runs, float("inf"))
    for fn in runs.values():
        fn()
    for _ in range(repeats):
        for name, fn in runs.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


@stored_per_machine
def bf16_decode_speedup() -> float:
    """How many times faster a packed bf16 linear layer is than fp32 here, at a decoding shape of the
    default model (16 rows, 576 -> 1536); 0 when bf16 cannot be used (no bf16 units, or no oneDNN
    packing in this torch)."""
    if not has_bf16_units() or not packing_available():
        return 0.0
    rows, features, outputs = 16, 576, 1536
    with torch.no_grad():
        weight, x = torch.randn(outputs, features), torch.randn(rows, features)
        try:
            p32, p16 = _pack(weight, rows), _pack(weight.bfloat16(), rows)
            x16 = x.bfloat16()
            best = _best_seconds_in_turns({"fp32": lambda: [_packed_linear(p32, None, x) for _ in range(20)],
                                           "bf16": lambda: [_packed_linear(p16, None, x16) for _ in range(20)]},
                                          repeats=5)
        except RuntimeError:
            return 0.0
    return best["fp32"] / best["bf16"]


# bf16 autocast must buy at least this much in a training matmul before ``model.autocast: auto`` takes it on
# a CPU: the rest of a training pass (attention, norms, the LM head, the optimiser) stays float32.
BF16_TRAINING_THRESHOLD = 1.3


@stored_per_machine
def bf16_training_speedup() -> float:
    """How many times faster a linear layer's forward and backward run under bf16 autocast than in
    fp32 here, at a training shape of the default model (512 rows, 576 -> 1536); 0 without bf16 units.
    On a Zen 4 EPYC (AVX512-BF16): about 2x."""
    if not has_bf16_units():
        return 0.0
    rows, features, outputs = 512, 576, 1536
    weight = torch.randn(outputs, features, requires_grad=True)
    x = torch.randn(rows, features, requires_grad=True)

    def step(autocast: bool) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = torch.nn.functional.linear(x, weight)
        out.float().sum().backward()

    try:
        with torch.enable_grad():
            best = _best_seconds_in_turns({autocast: lambda autocast=autocast: [step(autocast) for _ in range(5)]
                                           for autocast in (False, True)}, repeats=5)
    except RuntimeError:
        return 0.0
    return best[False] / best[True]


def bf16_training_pays() -> bool:
    """Whether bf16 autocast clearly speeds up training matmuls here (:data:`BF16_TRAINING_THRESHOLD`)."""
    return bf16_training_speedup() >= BF16_TRAINING_THRESHOLD


# (outputs, inputs) of the default model's fused decoder-layer matmuls: q/k/v, output, gate/up, down.
_DECODE_LAYER_SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))


def _decode_kernel_seconds(rows: int, kernels: tuple[str, ...]) -> dict[str, float]:
    """Seconds per decode kernel for ``rows``-row matmuls of 16 decoder layers of the default
    model's shapes (113 MB of float32 weights: more than a CPU cache holds, as the model's 540 MB
    are), timed in turns, best of 3; a kernel this CPU cannot run is left out."""
    with torch.no_grad():
        weights = [torch.empty(shape).uniform_(-0.05, 0.05) for _ in range(16) for shape in _DECODE_LAYER_SHAPES]
        inputs = {w.shape[1]: torch.randn(rows, w.shape[1]) for w in weights}
        runs = {}
        for name in kernels:
            kernel = KERNELS[name]
            try:
                pairs = [(kernel.prepare(w, rows), inputs[w.shape[1]]) for w in weights]
                kernel.linear(pairs[0][0], None, pairs[0][1])
            except RuntimeError:  # this CPU cannot run it (oneDNN packs bf16 only with bf16 units)
                continue
            runs[name] = lambda f=kernel.linear, pairs=pairs: [f(w, None, x) for w, x in pairs]
        return _best_seconds_in_turns(runs)


@stored_per_machine(depends_on=definitions())
def narrow_decode_seconds() -> dict[str, float]:
    """Seconds per decode kernel (:data:`~posttrain.models.decode_kernels.KERNELS`) for one-row
    matmuls (:func:`_decode_kernel_seconds`). One row is bound by reading the weights, and the
    fastest kernel differs by machine. Over the default model's 121 matmuls: on a Zen 3 EPYC,
    packed fp32 30-36 ms, MKL on plain fp32 41-46, plain bf16 24-27, our panel kernel 22-26; on an
    Intel Xeon with AMX, MKL on plain fp32 36 ms, packed fp32 49, packed bf16 40, plain bf16 43.
    Under 1 s in all; {} without oneDNN packing."""
    return _decode_kernel_seconds(1, tuple(KERNELS)) if packing_available() else {}


@stored_per_machine(depends_on=definitions())
def wide_decode_seconds() -> dict[str, float]:
    """Seconds per decode kernel for 16-row matmuls (:func:`_decode_kernel_seconds`): the demo's
    decode steps (2 prompts x 8 samples), bound by the vector units and by reading the weights at
    once. Over the default model's matmuls on a Zen 3 EPYC: oneDNN's packed fp32 55-57 ms, our
    panel kernel 39-42 ms in float32; on a Zen 4 EPYC in bf16, oneDNN's packed 20 ms, our dot-product
    kernel (:mod:`posttrain.models.panel_dot`) 14 ms. About 1 s in all; {} without oneDNN packing."""
    return _decode_kernel_seconds(16, tuple(KERNELS)) if packing_available() else {}


def _fastest(seconds: dict[str, float], bf16: bool) -> str:
    """The fastest of the measured kernels: of the float32 ones, and of the bf16 ones too when ``bf16``."""
    allowed = {k: s for k, s in seconds.items() if k in KERNELS and (bf16 or k in FP32_KERNELS)}
    return min(allowed, key=allowed.__getitem__) if allowed else "packed fp32"


@functools.cache  # asked at every narrow decode step
def narrow_decode_kernel(bf16: bool) -> str:
    """The fastest kernel for decode steps of one or two rows here (:func:`narrow_decode_seconds`):
    among the float32 ones, and the bf16 ones too when ``bf16`` (``rollout.decode_dtype: bfloat16``)."""
    return _fastest(narrow_decode_seconds(), bf16)


@functools.cache  # asked at every wide decode step
def wide_decode_kernel(bf16: bool) -> str:
    """The fastest kernel for decode steps of more than two rows here, measured at 16 rows
    (:func:`wide_decode_seconds`), a bf16 one only when ``bf16`` on a CPU with bf16 units. Without
    them a wide step is bound by arithmetic, not bytes, and bf16 weights gain nothing: on a Zen 3
    EPYC the panel kernel's bf16 and float32 copies measured within 10% of each other, in either
    order from one measurement to the next, so wide steps stay float32 there (the trainer's own
    log-probabilities for them, as documented for ``rollout.decode_dtype``)."""
    return _fastest(wide_decode_seconds(), bf16 and has_bf16_units())


PREFILL_ROWS = 128  # the rows of a prompt prefill's matmuls that the prefill probe times


@stored_per_machine(depends_on=definitions())
def prefill_seconds() -> dict[str, float]:
    """Seconds per decode kernel for 128-row matmuls (:func:`_decode_kernel_seconds`): a prompt
    prefill's width (:func:`posttrain.rollout.fast_decode.prefill` takes at most 512 rows a pass),
    bound by the vector units. About 2 s; {} without oneDNN packing."""
    return _decode_kernel_seconds(PREFILL_ROWS, tuple(KERNELS)) if packing_available() else {}


def prefill_pays(kernel: str, bf16: bool) -> bool:
    """Whether the prompts' prefill runs on ``kernel``'s copy of the weights (the first decode step's)
    rather than through the model's own forward: where ``kernel`` measured at a prefill's width
    (:func:`prefill_seconds`) no slower than the matmul that forward would run on: PyTorch's bf16
    kernel under autocast when decoding in ``bf16`` on a CPU with bf16 units, else the training
    pass's float32 one (oneDNN's or MKL's, :func:`onednn_training_pays`)."""
    seconds = prefill_seconds()
    if bf16 and has_bf16_units():
        baseline = "plain bf16"
    else:
        baseline = "packed fp32" if onednn_training_pays() else "plain fp32"
    return kernel in seconds and seconds[kernel] <= seconds.get(baseline, float("inf"))


def narrow_bf16_decode_speedup() -> float:
    """How many times faster one-row decoding matmuls are on the fastest kernel when bf16 may be
    used than on the fastest float32 one here; 0 without oneDNN packing."""
    seconds = narrow_decode_seconds()
    if not seconds:
        return 0.0
    return seconds[narrow_decode_kernel(False)] / seconds[narrow_decode_kernel(True)]


def bf16_decoding_speedup() -> float:
    """What ``rollout.decode_dtype: bfloat16`` buys here, as :mod:`posttrain.rollout.fast_decode` uses
    it: at every step where the CPU has bf16 units (:func:`bf16_decode_speedup`), otherwise only at
    narrow steps of one or two rows (:func:`narrow_bf16_decode_speedup`)."""
    return bf16_decode_speedup() if has_bf16_units() else narrow_bf16_decode_speedup()


@stored_per_machine(depends_on=native.source_text(decode_layer.SOURCE))
def native_layer_speedup() -> float:
    """How many times faster our kernels (:mod:`posttrain.models.decode_layer`) run a decoder
    layer's decode-step work besides its matmuls (two residual adds with RMSNorm, rotary embedding,
    cache write, attention, SwiGLU) than PyTorch's operations as :mod:`posttrain.rollout.fast_decode`
    runs them, in float32 at the default model's shapes (576 wide, 9 query heads over 3 KV heads
    of 64, an MLP of 1536) for 16 rows over 128 cached columns, 30 layers in turn; 0 where the
    kernels cannot be built. On a Zen 4 EPYC: 2.1-2.3x (attention alone 2-5x from 1 to 64 rows)."""
    from posttrain.rollout.fast_decode import rms_norm, torch_append_and_attend

    hidden, heads, kv_heads, dim, inter, rows, col, layers = 576, 9, 3, 64, 1536, 16, 127, 30
    if not decode_layer.supports(dim, heads, kv_heads):
        return 0.0
    keys = [torch.randn(rows, kv_heads, col + 1, dim) for _ in range(layers)]
    values = [torch.randn(rows, kv_heads, col + 1, dim) for _ in range(layers)]
    qkv, cos, sin = torch.randn(rows, heads + 2 * kv_heads, dim), torch.randn(rows, dim), torch.randn(rows, dim)
    x, delta, norm = torch.randn(rows, hidden), torch.randn(rows, hidden), torch.rand(hidden)
    gate_up = torch.randn(rows, 2 * inter)
    bias = torch.zeros(rows, 1, 1, col + 1)

    def ours() -> None:
        for k, v in zip(keys, values):
            decode_layer.add_rms_norm(x, delta, norm, 1e-5, torch.float32)
            decode_layer.append_and_attend(qkv, cos, sin, k, v, col, bias, heads)
            decode_layer.add_rms_norm(x, delta, norm, 1e-5, torch.float32)
            decode_layer.swiglu(gate_up)

    def pytorch() -> None:
        for k, v in zip(keys, values):
            rms_norm(x + delta, norm, 1e-5)
            torch_append_and_attend(qkv, cos.unsqueeze(1), sin.unsqueeze(1), k, v, col, bias, heads)
            rms_norm(x + delta, norm, 1e-5)
            gate, up = gate_up.chunk(2, dim=-1)
            torch.nn.functional.silu(gate) * up

    with torch.no_grad():
        best = _best_seconds_in_turns({"ours": ours, "pytorch": pytorch})
    return best["pytorch"] / best["ours"]


def native_layer_pays() -> bool:
    """Whether decode steps run a layer's work besides its matmuls on our kernels here: where they measured faster."""
    return native_layer_speedup() > 1.0


@stored_per_machine(depends_on=native.source_text(sample_tokens.SOURCE))
def sampler_speedup() -> float:
    """How many times faster our kernel (:mod:`posttrain.models.sample_tokens`) draws the next tokens than
    :func:`posttrain.rollout.sampling.sample_with_torch` here, for 1 and for 32 rows of the default model's
    49k vocabulary at temperature 1 (the two times summed, in turns); 0 where the kernel cannot be built.
    On a Zen 4 EPYC: 3.3-3.8x."""
    from posttrain.rollout.sampling import sample_with_torch  # here: the rollout imports this module

    if sample_tokens.unavailable_reason() is not None:
        return 0.0
    generator = torch.Generator().manual_seed(0)
    logits = [3 * torch.randn(rows, 49152, generator=generator) for rows in (1, 32)]
    uniform = [torch.rand(len(z), generator=generator, dtype=torch.float64) for z in logits]
    runs = {"ours": lambda: [sample_tokens.draw(z, 1.0, u) for z, u in zip(logits, uniform)],
            "torch": lambda: [sample_with_torch(z, 1.0, 1.0, generator) for z in logits]}
    best = _best_seconds_in_turns(runs, repeats=10)
    return best["torch"] / best["ours"]


def sampler_pays() -> bool:
    """Whether float32 logits on the CPU are sampled from on our kernel here: where it measured faster."""
    return sampler_speedup() > 1.0


@stored_per_machine(depends_on=native.source_text(train_attention.SOURCE))
def train_attention_speedup() -> float:
    """How many times faster our attention kernels (:mod:`posttrain.models.train_attention`) run a
    training pass's attention, forward and backward, than PyTorch's SDPA here, at the shapes of a
    GRPO batch of the default model: 2 prompts of 35 tokens (causal) and 16 completions of 64 tokens,
    each attending to its prompt's keys and its own (masked), 9 query and 3 KV heads of 64; 8 layers'
    forwards, then their backward, on posttrain's malloc setting as in training; 0 where the kernels
    cannot be built. On a Zen 4 EPYC: 1.5x (1.1-1.25x before the kernels stopped at each row's last key)."""
    import torch.nn.functional as F

    keep_freed_memory()  # as every posttrain process runs (load_model sets it): else both pay page faults
    cases = []  # each layer its own tensors, as in a pass
    generator = torch.Generator().manual_seed(0)
    for _layer in range(8):
        for batch, length, keys, causal in ((2, 35, 35, True), (16, 64, 99, False)):
            q = torch.randn(batch, 9, length, 64, generator=generator, requires_grad=True)
            k, v = (torch.randn(batch, 3, keys, 64, generator=generator, requires_grad=True) for _ in range(2))
            mask = None if causal else torch.ones(keys, keys, dtype=torch.bool).tril()[-length:].repeat(
                batch, 1, 1, 1)  # one per completion, as a packed batch's
            cases.append((q, k, v, mask))
    if not train_attention.supports(cases[0][0], cases[0][1]):
        return 0.0

    def sdpa(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=True)

    def run(attend) -> None:
        torch.stack([attend(q, k, v, mask).sum() for q, k, v, mask in cases]).sum().backward()

    runs = {"ours": lambda: run(train_attention.attention), "sdpa": lambda: run(sdpa)}
    best = _best_seconds_in_turns(runs, repeats=6)
    return best["sdpa"] / best["ours"]


def train_attention_pays() -> bool:
    """Whether packed training passes run attention on our kernels here: where they measured faster."""
    return train_attention_speedup() > 1.0


@stored_per_machine(depends_on=native.source_text(train_elementwise.SOURCE))
def train_elementwise_speedup() -> float:
    """How many times faster our elementwise training kernels (:mod:`posttrain.models.train_elementwise`) run
    than PyTorch's operations here: RMSNorm and SwiGLU forward and backward (Llama's RMSNorm as transformers
    writes it, ``silu(gate) * up``) at the width of the default model and the token count of a GRPO batch (1094
    tokens, 576 and 1536 wide), 8 layers' forwards, then their backward; and the LM head's softmax statistics
    for 256 rows of the default model's 49k vocabulary (what a GRPO batch's head computes per 8 layers); on
    posttrain's malloc setting as in training; 0 where the kernels cannot be built. On a Zen 4 EPYC: 1.45-1.75x
    without the head."""
    from posttrain.models.logprobs import torch_softmax_statistics  # here: logprobs imports this module

    if train_elementwise.unavailable_reason() is not None:
        return 0.0
    keep_freed_memory()
    generator = torch.Generator().manual_seed(0)
    tokens, hidden, inter = 1094, 576, 1536
    layers = [[torch.randn(tokens, width, generator=generator, requires_grad=True) for width in (hidden, inter, inter)]
              for _layer in range(8)]
    weight = torch.rand(hidden, generator=generator, requires_grad=True)
    # Each run leaves the logits shifted (PyTorch's) or turned into probabilities (ours): as costly a next time.
    logits, targets = torch.randn(256, 49152, generator=generator), torch.randint(0, 49152, (256,), generator=generator)

    def torch_norm(x):
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))

    def run(norm, glu, softmax) -> None:
        torch.stack([norm(x).sum() + glu(g, u).sum() for x, g, u in layers]).sum().backward()
        softmax(logits, targets)

    runs = {"ours": lambda: run(lambda x: train_elementwise.rms_norm(x, weight, 1e-5), train_elementwise.swiglu,
                                train_elementwise.softmax_statistics),
            "torch": lambda: run(torch_norm, lambda g, u: torch.nn.functional.silu(g) * u, torch_softmax_statistics)}
    with torch.enable_grad(), torch.autocast("cpu", enabled=False):
        best = _best_seconds_in_turns(runs, repeats=6)
    return best["torch"] / best["ours"]


def train_elementwise_pays() -> bool:
    """Whether float32 training passes run RMSNorm and SwiGLU on our kernels here: where they measured faster."""
    return train_elementwise_speedup() > 1.0


# The oneDNN training path is taken with a margin over what the probe below measures. An earlier probe
# timed an MLP block's forward and backward at 256 rows, weight gradients included, and misled: on an AMD
# EPYC of the Zen 3 generation (AVX2 only; oneDNN then computed the weight gradients too) it read 0.9-1.2x
# while whole training passes ran 1.1-1.3x slower on oneDNN; on a Zen 4 EPYC it read 1.05-1.33x from
# process to process, under its 1.25x threshold as often as over it, while the pass ran 1.03-1.12x faster
# on oneDNN (benchmarks/mfu.py's shapes, one process, the two paths in turns). This probe times only the
# products that the choice moves (weight gradients have a probe of their own), at a training pass's
# rows: 1.09-1.16x on that Zen 4 EPYC.
ONEDNN_TRAINING_THRESHOLD = 1.05


@stored_per_machine
def onednn_training_speedup() -> float:
    """How many times faster the forward and input-gradient matmuls of float32 linear layers run on oneDNN
    (:class:`~posttrain.models.onednn_linear.OneDNNLinear`) than through PyTorch's own matmuls here, at a
    training pass's shapes: the seven linear layers of one of the default model's decoder layers
    (576 -> 576, 192, 192, 576, 1536, 1536 and 1536 -> 576) at 512 rows. Their weight gradients take
    their own path (:func:`onednn_weight_grad_speedup`), so the layers are frozen here, as LoRA's base
    layers are. 0 when this torch has no oneDNN linear op. The two paths are timed in turns and the
    median ratio taken, so that a burst of load on a shared machine does not decide for the machine."""
    from posttrain.models.onednn_linear import OneDNNLinear

    if not packing_available():
        return 0.0
    rows, hidden, inter = 512, 576, 1536
    generator = torch.Generator().manual_seed(0)
    shapes = [(hidden, hidden), (192, hidden), (192, hidden), (hidden, hidden), (inter, hidden), (inter, hidden),
              (hidden, inter)]
    weights = [torch.randn(out, inp, generator=generator) for out, inp in shapes]
    inputs = {width: torch.randn(rows, width, generator=generator, requires_grad=True) for width in (hidden, inter)}
    grads = [torch.randn(rows, out, generator=generator) for out, _inp in shapes]

    def seconds(onednn: bool) -> float:
        linear = (lambda a, w: OneDNNLinear.apply(a, w, None)) if onednn else torch.nn.functional.linear
        start = time.perf_counter()
        torch.autograd.backward([linear(inputs[w.shape[1]], w) for w in weights], grads)
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


@stored_per_machine(depends_on=native.source_text(transpose.SOURCE))
def onednn_weight_grad_speedup() -> float:
    """How many times faster oneDNN's linear op computes float32 weight gradients ``dY^T x`` (after our
    kernel transposes ``dY``: :func:`~posttrain.models.onednn_linear.onednn_weight_grad`) than MKL's sgemm
    (which reads ``dY`` transposed in place) here, at a training pass's shapes: the default model's MLP
    (1024 rows, 576 <-> 1536), each of 4 layers its own tensors, as in a pass (an MKL product whose operands
    sit in the cache ran 15-25% faster on a Zen 4 EPYC than in the pass, oneDNN's 5%); 0 when this torch
    has no oneDNN linear op. Timed in turns, median of the ratios of the summed times, as
    :func:`onednn_training_speedup`. On a Zen 4 EPYC: 1.02-1.22x with an LM head slice among the products
    (0.94x when PyTorch copied ``dY^T``)."""
    from posttrain.models.onednn_linear import onednn_weight_grad

    if not packing_available():
        return 0.0
    keep_freed_memory()  # as in training: else both pay page faults for their results
    generator = torch.Generator().manual_seed(0)
    shapes = [(1024, out, inp) for _layer in range(4) for out, inp in ((1536, 576), (1536, 576), (576, 1536))]
    pairs = [(torch.randn(rows, out, generator=generator), torch.randn(rows, inp, generator=generator))
             for rows, out, inp in shapes]

    def seconds(onednn: bool) -> float:
        start = time.perf_counter()
        for grad, x in pairs:
            onednn_weight_grad(grad, x) if onednn else torch.mm(grad.t(), x)
        return time.perf_counter() - start

    try:
        with torch.autocast("cpu", enabled=False):
            seconds(False), seconds(True)
            return statistics.median(seconds(False) / seconds(True) for _ in range(7))
    except RuntimeError:
        return 0.0


def onednn_weight_grad_pays() -> bool:
    """Whether oneDNN computes the training pass's float32 weight gradients faster than MKL here."""
    return onednn_weight_grad_speedup() > 1.0


def decode_dtype(name: str) -> torch.dtype:
    """``rollout.decode_dtype`` as a torch dtype; ``auto`` is bfloat16 where it measured 1.2x faster or
    more (:func:`bf16_decoding_speedup`)."""
    if name == "auto":
        return torch.bfloat16 if bf16_decoding_speedup() >= 1.2 else torch.float32
    return getattr(torch, name)
