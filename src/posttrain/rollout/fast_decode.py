"""Prefill and decode steps for Llama-family models with little Python per token, on our weight copies and a
static KV cache.

Why our own and not the model's ``forward``: at the batch sizes of RL on a CPU (1 to 64 rows, one
new token each), Hugging Face's forward spends as much time in Python and small tensor operations
(per-step mask construction, the growing ``DynamicCache``, per-projection matmuls, the
rotary-embedding module) as in the matmuls: on the default model at batch 1, about half of its
~30 ms per token. Here each decoder layer is a handful of operations: RMSNorm, one fused
q/k/v matmul, rotary embedding on q and k together, the new key and value written into a
preallocated cache, grouped-query attention over the cache without repeating the KV heads
(:func:`attend`), one output matmul, RMSNorm, one fused gate/up matmul and the down
matmul. Where our C kernels build and measured faster (:mod:`posttrain.models.decode_layer`),
everything but the matmuls is four calls a layer instead of about 25: each residual add with the
RMSNorm after it, the rotary embedding, cache write and attention in one, and the SwiGLU. Every
matmul runs on weights packed once for oneDNN (:mod:`posttrain.models.packed_linear`), with LoRA
adapters folded in, exactly as the generic path does. The prompts' prefill (:func:`prefill`) runs the
same arithmetic for many tokens a row, on the copy of the weights the first decode step reads, and
writes its keys and values straight into the static cache.

In float32 the arithmetic is the model's own (same formulas), so the sampled tokens'
log-probabilities agree with the trainer's forward pass to float rounding, which the trainer
relies on when it reuses them as the old policy's. In bfloat16 (``rollout.decode_dtype``) the
matmuls take bf16 weights, and on PyTorch's and oneDNN's kernels bf16 inputs too (everything else
stays float32, but for the SiLU-gated product that is the down projection's bf16 input; our panel
kernel takes float32 inputs and sums in float32), at the price of log-probabilities that differ from
the trainer's, which the trainer then treats as another engine's
(``HFBackend.same_logprobs_as_trainer``).

Which matmul kernel (:mod:`posttrain.models.decode_kernels`) serves a step depends on its width
and on the CPU: each step takes the kernel measured fastest here at its width, one row for steps
of up to :data:`NARROW_ROWS` rows (bound by reading the weights) and 16 rows above
(:func:`~posttrain.models.cpu_probe.narrow_decode_kernel`,
:func:`~posttrain.models.cpu_probe.wide_decode_kernel`), a bf16 one only when decoding in bf16. On
a Zen 3 EPYC (AVX2 only) that is our own panel kernel (:mod:`posttrain.models.panel_linear`) at
both widths: the default model's matmuls at 16 rows in 39-42 ms instead of oneDNN's 55-57; the
probe's 16 layers at one row in 9.7 ms instead of 13.5 ms packed float32, and with bf16 weights
(half the bytes) in 5.2 ms instead of 7.8 ms on PyTorch's plain bf16 kernel. With bf16 units
(AVX512-BF16, AMX) oneDNN's packed bf16 weights decode 1.4-1.75x faster than float32; without them
a bf16 matmul of many rows is emulated, slower than float32's. On an Intel Xeon with AMX, one-row
steps were fastest on MKL's plain float32 weights (36 ms instead of 49 ms packed, 40 ms packed bf16).
Each copy of the weights is made the first time a step needs it. Models this module does not
recognise (other architectures, biases in the MLP or the output projection, sliding windows, a
non-SiLU activation) use the generic path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from posttrain.models import decode_layer
from posttrain.models.cpu_probe import narrow_decode_kernel, native_layer_pays, prefill_pays, wide_decode_kernel
from posttrain.models.decode_kernels import KERNELS, Kernel, Linear, Weight
from posttrain.models.packed_linear import _mergeable_lora, merged_lora_weight, packing_available

SUPPORTED_TYPES = {"llama", "qwen2", "mistral"}
NARROW_ROWS = 2  # steps of at most this many rows are bound by reading the weights


def effective_weight(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(weight, bias) a linear layer computes with, LoRA adapters folded in; None if it is not one we know."""
    if _mergeable_lora(module):
        return merged_lora_weight(module), module.base_layer.bias
    if type(module) is nn.Linear:
        return module.weight, module.bias
    return None


def supports(model: nn.Module) -> bool:
    """True when :class:`DecodeWeights` can run ``model`` on this machine (CPU, float32, a known architecture)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) not in SUPPORTED_TYPES or not packing_available():
        return False
    if getattr(config, "hidden_act", "silu") != "silu" or getattr(config, "mlp_bias", False):
        return False
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return False
    weight = model.get_output_embeddings().weight
    return weight.device.type == "cpu" and weight.dtype == torch.float32


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm: x / sqrt(mean(x^2) + eps), scaled by ``weight`` (Zhang & Sennrich 2019)."""
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (Su et al. 2021) in the half-split layout HF Llama uses:
    x cos + (-x2, x1) sin, with the sign of sin's first half folded into ``signed_sin`` (see
    :meth:`DecodeWeights.rotary_tables`), so that (-x2, x1) is a roll by half: the same products, in
    fewer operations."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * signed_sin


SDPA_ROWS = 8  # attention through one fused call up to this many rows, two batched matmuls above


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Grouped-query attention of one query per row over the cache, without repeating the KV heads:
    q ``[rows, heads, dim]``, keys and values ``[rows, kv_heads, length, dim]``, additive mask
    ``bias`` ``[rows, 1, 1, length]``; returns ``[rows, heads * dim]``. PyTorch's fused attention
    costs fewer operations, which is what a narrow step pays for (45 instead of 95 us a layer at one
    row on a Zen 3 EPYC); at 32 rows its kernel was 15% slower than two batched matmuls."""
    rows, heads, dim = q.shape
    if rows <= SDPA_ROWS:
        return F.scaled_dot_product_attention(q.unsqueeze(2), keys, values, attn_mask=bias,
                                              enable_gqa=True).view(rows, heads * dim)
    kv_heads = keys.shape[1]
    grouped = q.reshape(rows, kv_heads, heads // kv_heads, dim)
    scores = torch.matmul(grouped, keys.transpose(-1, -2)).mul_(dim ** -0.5).add_(bias)
    return torch.matmul(scores.softmax(-1), values).reshape(rows, heads * dim)


def torch_append_and_attend(qkv: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, keys: torch.Tensor,
                            values: torch.Tensor, col: int, bias: torch.Tensor, heads: int) -> torch.Tensor:
    """One layer's attention for one new token per row on PyTorch's operations (what
    :func:`posttrain.models.decode_layer.append_and_attend` does in one call): q and k of ``qkv``
    ``[rows, heads + 2 kv_heads, dim]`` rotated by ``cos``/``signed_sin`` ``[rows, 1, dim]``, the
    new key and value written at column ``col`` of the float32 cache, attention over columns 0..col
    with the mask ``bias`` ``[rows, 1, 1, capacity]``; returns ``[rows, heads * dim]``."""
    kv_heads = keys.shape[1]
    qk = rotate(qkv[:, : heads + kv_heads], cos, signed_sin)
    keys[:, :, col] = qk[:, heads:]
    values[:, :, col] = qkv[:, heads + kv_heads :]
    return attend(qk[:, :heads], keys[:, :, : col + 1], values[:, :, : col + 1], bias[..., : col + 1])


@dataclass
class _Layer:
    norm1: torch.Tensor
    qkv: object  # the kernel's copy of the [q; k; v] weight
    qkv_bias: torch.Tensor | None
    out: object
    norm2: torch.Tensor
    gate_up: object  # of the [gate; up] weight
    down: object


@dataclass
class Matmuls:
    """One copy of the model's projection weights, in the layout and precision of one kernel, and
    that kernel: ``linear(weight, bias, x)`` is x W^T + b, computed from and returned in
    ``activations`` (float32, or bf16 from bf16 weights on PyTorch's and oneDNN's kernels). A bf16
    result is not widened here: the float32 operation that consumes it (rotary embedding, residual
    add, the cache write) promotes it in the same pass, and the MLP's SiLU-gated product stays bf16
    as the down projection's input."""

    layers: list[_Layer]
    head: object
    head_bias: torch.Tensor | None
    linear: Linear
    activations: torch.dtype


class DecodeWeights:
    """The model's weights prepared for decoding in ``dtype``, built once per ``generate`` call
    (``rows``: the rows of its first step, whose copy is made at once; see the module docstring
    for which copy serves which steps)."""

    @torch.no_grad()
    def __init__(self, model: nn.Module, rows: int, dtype: torch.dtype = torch.float32):
        config, decoder = model.config, model.get_decoder()
        self.model, self.dtype = model, dtype
        self.layers = len(decoder.layers)
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = float(config.rms_norm_eps)
        self.embed = decoder.embed_tokens.weight
        self.rotary = decoder.rotary_emb
        self.final_norm = decoder.norm.weight
        # a layer's work besides its matmuls on our kernels where they measured faster (module docstring)
        self.native_layer = decode_layer.supports(self.head_dim, self.heads, self.kv_heads) and native_layer_pays()
        self._copies: dict[str, Matmuls] = {}
        self.matmuls(rows)  # raises ValueError now, not mid-generation, for a layer we do not know
        # bf16 keys and values (half the bytes to read) when every step decodes in bf16; wide steps that
        # stay float32 (no bf16 units) keep the trainer's own log-probabilities, so a float32 cache
        wide_bf16 = KERNELS[self.kernel(NARROW_ROWS + 1)].dtype == torch.bfloat16
        self.cache_dtype = torch.bfloat16 if wide_bf16 and self.native_layer else torch.float32

    def kernel(self, rows: int) -> str:
        """The name of the kernel a step of ``rows`` rows runs on (module docstring)."""
        bf16 = self.dtype == torch.bfloat16
        if rows <= NARROW_ROWS:
            return narrow_decode_kernel(bf16)
        return wide_decode_kernel(bf16)

    def matmuls(self, rows: int) -> Matmuls:
        """The weights and kernel for a step of ``rows`` rows."""
        return self.copy(self.kernel(rows), rows)

    def prefill_matmuls(self, rows: int) -> Matmuls | None:
        """The copy of the weights that prompts decoded ``rows`` rows at a time prefill on (the first
        decode step's), or None where the model's own forward prefills faster
        (:func:`~posttrain.models.cpu_probe.prefill_pays`)."""
        return self.matmuls(rows) if prefill_pays(self.kernel(rows), self.dtype == torch.bfloat16) else None

    def copy(self, kernel: str, rows: int) -> Matmuls:
        """The weights in the layout and precision of ``kernel`` (packed for ``rows`` rows), made once."""
        if kernel not in self._copies:
            self._copies[kernel] = self._build(KERNELS[kernel], rows)
        return self._copies[kernel]

    @torch.no_grad()
    def _build(self, kernel: Kernel, rows: int) -> Matmuls:
        def prepare(weight: Weight) -> object:
            return kernel.prepare(weight, rows)

        head = effective_weight(self.model.get_output_embeddings())
        if head is None:
            raise ValueError("the output embedding is not a linear layer")
        layers = [self._layer(layer, prepare, kernel.dtype) for layer in self.model.get_decoder().layers]
        return Matmuls(layers, prepare(head[0]), _cast(head[1], kernel.dtype), kernel.linear, kernel.activations)

    @staticmethod
    def _layer(layer: nn.Module, prepare: Callable[[Weight], object], bias_dtype: torch.dtype) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        parts = [effective_weight(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj,
                                               mlp.gate_proj, mlp.up_proj, mlp.down_proj)]
        if any(p is None for p in parts) or parts[3][1] is not None:
            raise ValueError("a projection is not a plain (or LoRA) linear layer without output bias")
        (q, qb), (k, kb), (v, vb), (o, _), (gate, _), (up, _), (down, _) = parts
        biases = [qb, kb, vb]
        qkv_bias = None if all(b is None for b in biases) else torch.cat(
            [b if b is not None else torch.zeros(w.shape[0]) for b, w in zip(biases, (q, k, v))])
        return _Layer(layer.input_layernorm.weight, prepare((q, k, v)), _cast(qkv_bias, bias_dtype),
                      prepare(o), layer.post_attention_layernorm.weight, prepare((gate, up)), prepare(down))

    def rotary_tables(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin ``[length, head_dim]`` for positions 0..length-1, from the model's own
        rotary module; signed sin has its first half negated, for :func:`rotate`."""
        positions = torch.arange(length).unsqueeze(0)
        cos, sin = self.rotary(self.embed[:1].unsqueeze(0), positions)
        half = self.head_dim // 2
        return cos[0], torch.cat((-sin[0, :, :half], sin[0, :, half:]), dim=-1)


def _cast(bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return None if bias is None else bias.to(dtype)


class StaticCache:
    """Keys and values of every layer, ``[rows, kv_heads, capacity, head_dim]``, filled column by column.

    Prompts are left-padded to one width, so every row writes its next token at the same column;
    ``bias`` ``[rows, 1, 1, capacity]`` is the additive attention mask (``-inf`` at padding) over
    the columns so far, ``length`` the columns written (:func:`prefill` writes the prompts', each
    :func:`decode_step` one more). The cache is ``dtype`` (:attr:`DecodeWeights.cache_dtype`)
    whatever the activations': float32 keys rounded into a bf16 cache, bf16 ones widened.
    """

    def __init__(self, layers: int, rows: int, kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype = torch.float32):
        # columns past ``length`` are never read, so they are left as allocated
        self.keys = [torch.empty(rows, kv_heads, capacity, head_dim, dtype=dtype) for _ in range(layers)]
        self.values = [torch.empty(rows, kv_heads, capacity, head_dim, dtype=dtype) for _ in range(layers)]
        self.bias = torch.zeros(rows, 1, 1, capacity)
        self.length = 0

    def write(self, keys: list[torch.Tensor], values: list[torch.Tensor], mask: torch.Tensor) -> None:
        """Appends columns: every layer's keys and values ``[rows, kv_heads, width, head_dim]`` (the
        model's own forward's, where it prefills) and their ``mask`` ``[rows, width]`` (0 at padding)."""
        end = self.length + mask.shape[1]
        for cache, new in zip((*self.keys, *self.values), (*keys, *values)):
            cache[:, :, self.length : end] = new
        self.bias[:, 0, 0, self.length : end].masked_fill_(mask == 0, float("-inf"))
        self.length = end

    def select(self, index: torch.Tensor) -> None:
        """Keep only rows ``index`` (finished rows leave the batch), in that order. Only the rows whose
        place changes are moved, in place, over the columns in use: in the order of
        :func:`posttrain.rollout.hf_backend.surviving_rows`, one for each finished row that is not
        among the last."""
        n = len(index)
        moved = (index != torch.arange(n)).nonzero().squeeze(-1)
        sources = index[moved]
        for t in (*self.keys, *self.values):
            t[moved, :, : self.length] = t[sources, :, : self.length]
        self.bias[moved] = self.bias[sources]
        self.keys = [k[:n] for k in self.keys]
        self.values = [v[:n] for v in self.values]
        self.bias = self.bias[:n]


PREFILL_PASS_ROWS = 512  # at most this many rows (prompts x columns) in one pass of a prefill's layers


@torch.no_grad()
def prefill(w: DecodeWeights, cache: StaticCache, tokens: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor,
            signed_sin: torch.Tensor, matmuls: Matmuls, copies: int = 1) -> torch.Tensor:
    """Logits ``[prompts, vocab]`` after each prompt's last token; writes the prompts' keys and values
    at the cache's next ``width`` columns, each prompt's into ``copies`` consecutive rows of the cache
    (its samples; all rows for a start every prompt shares), and attends over all of a row's columns.

    ``tokens`` ``[prompts, width]``, left-padded (``mask`` 0 at padding); ``cos``/``signed_sin``
    ``[prompts, width, head_dim]``: the rotary tables at each token's position. The arithmetic is
    :func:`_pytorch_step`'s for many tokens a row, causal, on the copy of the weights the decode
    steps use (``matmuls``), and on PyTorch's fused attention. Long prompts go through the layers a
    few columns at a time (at most :data:`PREFILL_PASS_ROWS` rows a pass: bounded memory, and
    widths nearer the one the prefill probe measured), each pass attending to the ones before it
    in the cache. Why not the model's own forward: it adds masks, a growing cache and a copy of it
    into this one, and runs its matmuls on kernels that the decode kernels beat where this path is
    taken (:func:`~posttrain.models.cpu_probe.prefill_pays`). On a Zen 4 EPYC (40-416 rows of the
    default model's layers, float32 panel kernel 171-208 GFLOP/s against oneDNN's 144-195, bf16
    dot-product kernel 333-358 against autocast's 216-328) the prefill of 32 arithmetic prompts
    took 576 ms instead of 724 in float32, 389 instead of 492 in bf16; of one, 60 ms instead of 105.
    """
    prompts, width = tokens.shape
    if prompts * copies != cache.bias.shape[0] or cache.length + width > cache.bias.shape[-1]:
        raise ValueError(f"{prompts} prompts x {copies} copies of {width} tokens do not fit a cache of "
                         f"{cache.bias.shape[0]} rows with {cache.bias.shape[-1] - cache.length} free columns")
    step = max(1, PREFILL_PASS_ROWS // prompts)
    for start in range(0, width, step):
        end = min(start + step, width)
        x = _prefill_columns(w, cache, tokens[:, start:end], mask[:, start:end], cos[:, start:end],
                             signed_sin[:, start:end], matmuls, copies)
    return matmuls.linear(matmuls.head, matmuls.head_bias, rms_norm(x, w.final_norm, w.eps))


def _prefill_columns(w: DecodeWeights, cache: StaticCache, tokens: torch.Tensor, mask: torch.Tensor,
                     cos: torch.Tensor, signed_sin: torch.Tensor, m: Matmuls, copies: int) -> torch.Tensor:
    """:func:`prefill` of the cache's next ``tokens.shape[1]`` columns; returns the hidden state
    ``[prompts, hidden]`` after the last of them."""
    prompts, width = tokens.shape
    col, length = cache.length, cache.length + width
    row_bias = cache.bias.view(prompts, copies, cache.bias.shape[-1])
    row_bias[:, :, col:length].masked_fill_((mask == 0).unsqueeze(1), float("-inf"))
    # each token attends to the columns before it that are not padding, and to itself (so that a
    # padding token's own softmax has a term: its keys are masked for every other token)
    new = torch.arange(width)
    before = torch.arange(length) < (col + new).unsqueeze(-1)
    bias = torch.where(before, row_bias[:, :1, None, :length], float("-inf"))  # [prompts, 1, width, length]
    bias[:, :, new, col + new] = 0.0
    cos, signed_sin = cos.unsqueeze(1), signed_sin.unsqueeze(1)  # broadcast over heads
    x = w.embed[tokens].reshape(prompts * width, -1)
    for i, layer in enumerate(m.layers):
        h = rms_norm(x, layer.norm1, w.eps)
        qkv = m.linear(layer.qkv, layer.qkv_bias, h).view(prompts, width, -1, w.head_dim).transpose(1, 2)
        qk = rotate(qkv[:, : w.heads + w.kv_heads], cos, signed_sin)
        keys, values = (c.view(prompts, copies, *c.shape[1:]) for c in (cache.keys[i], cache.values[i]))
        keys[:, :, :, col:length] = qk[:, None, w.heads :]
        values[:, :, :, col:length] = qkv[:, None, w.heads + w.kv_heads :]
        q = qk[:, : w.heads]
        attended = F.scaled_dot_product_attention(q, keys[:, 0, :, :length].to(q.dtype),
                                                  values[:, 0, :, :length].to(q.dtype), attn_mask=bias,
                                                  enable_gqa=True)
        x = x + m.linear(layer.out, None, attended.transpose(1, 2).reshape(prompts * width, -1))
        h = rms_norm(x, layer.norm2, w.eps)
        gate, up = m.linear(layer.gate_up, None, h).chunk(2, dim=-1)
        x = x + m.linear(layer.down, None, F.silu(gate) * up)
    cache.length = length
    return x.view(prompts, width, -1)[:, -1]


@torch.no_grad()
def decode_step(w: DecodeWeights, cache: StaticCache, tokens: torch.Tensor, cos: torch.Tensor,
                signed_sin: torch.Tensor, matmuls: Matmuls | None = None) -> torch.Tensor:
    """Logits ``[rows, vocab]`` (float32, or bf16 from bf16 weights) for one new token per row;
    appends its keys and values to ``cache``.

    ``cos``/``signed_sin`` are ``[rows, head_dim]``: the rotary tables at each row's position.
    ``matmuls``: the copy of the weights to run on (:meth:`DecodeWeights.copy`); by default the one
    chosen for this many rows.
    """
    m = matmuls or w.matmuls(tokens.shape[0])
    step = _native_step if w.native_layer else _pytorch_step
    logits = step(w, cache, w.embed[tokens], cos, signed_sin, m)
    cache.length += 1
    return logits


def _pytorch_step(w: DecodeWeights, cache: StaticCache, x: torch.Tensor, cos: torch.Tensor,
                  signed_sin: torch.Tensor, m: Matmuls) -> torch.Tensor:
    rows, col = x.shape[0], cache.length
    cos, signed_sin = cos.unsqueeze(1), signed_sin.unsqueeze(1)  # broadcast over heads
    for i, layer in enumerate(m.layers):
        h = rms_norm(x, layer.norm1, w.eps)
        qkv = m.linear(layer.qkv, layer.qkv_bias, h).view(rows, w.heads + 2 * w.kv_heads, w.head_dim)
        attended = torch_append_and_attend(qkv, cos, signed_sin, cache.keys[i], cache.values[i], col, cache.bias,
                                           w.heads)
        x = x + m.linear(layer.out, None, attended)
        h = rms_norm(x, layer.norm2, w.eps)
        gate, up = m.linear(layer.gate_up, None, h).chunk(2, dim=-1)
        x = x + m.linear(layer.down, None, F.silu(gate) * up)
    return m.linear(m.head, m.head_bias, rms_norm(x, w.final_norm, w.eps))


def _native_step(w: DecodeWeights, cache: StaticCache, x: torch.Tensor, cos: torch.Tensor,
                 signed_sin: torch.Tensor, m: Matmuls) -> torch.Tensor:
    """:func:`_pytorch_step`'s arithmetic on :mod:`posttrain.models.decode_layer`'s kernels: each
    residual add is folded into the RMSNorm that follows it, and the activations stay in the matmul
    kernel's dtype."""
    rows, col, act = x.shape[0], cache.length, m.activations
    cos, signed_sin = cos.float().contiguous(), signed_sin.float().contiguous()
    delta = None  # the last block's output, not yet added to the residual stream x
    for i, layer in enumerate(m.layers):
        h = decode_layer.add_rms_norm(x, delta, layer.norm1, w.eps, act)
        qkv = m.linear(layer.qkv, layer.qkv_bias, h).view(rows, w.heads + 2 * w.kv_heads, w.head_dim)
        attended = decode_layer.append_and_attend(qkv, cos, signed_sin, cache.keys[i], cache.values[i], col,
                                                  cache.bias, w.heads)
        h = decode_layer.add_rms_norm(x, m.linear(layer.out, None, attended), layer.norm2, w.eps, act)
        delta = m.linear(layer.down, None, decode_layer.swiglu(m.linear(layer.gate_up, None, h)))
    return m.linear(m.head, m.head_bias, decode_layer.add_rms_norm(x, delta, w.final_norm, w.eps, act))
