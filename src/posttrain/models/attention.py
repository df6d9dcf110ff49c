"""The policy's attention: transformers' SDPA, in float32 on the CPU, and per segment on packed batches.

Float32 on the CPU: under ``model.autocast: bfloat16`` PyTorch runs the CPU attention kernel in
bf16: the value projection returns bf16, and autocast narrows attention's inputs to bf16 even where
they are float32 (the rotary embedding returns float32 queries and keys). There its backward is
3-4x slower than in float32 at the shapes of RL batches (SDPA forward + backward, 8 rows x 48
tokens, 9 query and 3 key/value heads of 64: 10.1 ms bf16 against 2.5 ms float32, and 3.2 ms when
bf16 inputs are widened to float32 first; Zen 4 EPYC, 2 threads). Attention is a small share of the
arithmetic, so widening its inputs costs little and also keeps its softmax in float32. On other
devices the inputs keep their dtype.

Packed batches: the training pass runs a batch as one packed sequence
(:mod:`posttrain.models.packing`) and passes its layout as the ``packed`` keyword, which
transformers hands through every layer to this function. Then the start all prompts share (if any)
attends causally to itself, the prompts, as a batch, causally to that start's keys followed by their
own, and the completions, as a third batch, to their whole prompt's keys followed by their own. The
function is registered with transformers' attention interface (with the SDPA mask builder, so padding
is masked as before); a float32 pass without ``packed`` computes what plain
SDPA does (see :func:`posttrain_sdpa`). A packed batch's attention runs on our own kernels
(:mod:`posttrain.models.train_attention`) where they measured faster than SDPA, as on a Zen 4 EPYC.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from posttrain.models import train_attention
from posttrain.models.cpu_probe import train_attention_pays
from posttrain.models.packing import Packed

NAME = "posttrain_sdpa"


def posttrain_sdpa(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, packed: Packed | None = None,
                   **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention (``[B, heads, T, dim]`` in, ``[B, T, heads, dim]`` out), on float32
    inputs with autocast off on the CPU (the output returns to the query's dtype); with ``packed``,
    attention within the segments of a packed batch (B = 1; ``attention_mask`` is then ignored).
    Float32 inputs outside autocast give what transformers' SDPA gives: without ``packed`` the same
    output (key and value gradients up to the order of a sum, see :func:`_grouped_sdpa`); packed, on
    our kernels where they pay, equal up to the order of the sums."""
    dtype, cpu = query.dtype, query.device.type == "cpu"
    if cpu:
        query, key, value = query.float(), key.float(), value.float()
        if attention_mask is not None and attention_mask.is_floating_point():
            attention_mask = attention_mask.float()
    dropout, scaling = kwargs.get("dropout", 0.0), kwargs.get("scaling")
    with torch.autocast("cpu", enabled=False) if cpu else nullcontext():
        if packed is not None:
            out = _segment_attention(query[0], key[0], value[0], packed, scaling, dropout)
        elif (attention_mask is not None and query.shape[2] > 1 and getattr(module, "num_key_value_groups", 1) > 1
                and kwargs.get("position_bias") is None and kwargs.get("softcap") is None and cpu):
            out = _grouped_sdpa(query, key, value, attention_mask, dropout, scaling)
        else:
            out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    return out.to(dtype), None


def _grouped_sdpa(query, key, value, attention_mask, dropout: float, scaling: float | None) -> torch.Tensor:
    """Masked grouped-query attention with each key/value head read where it is, as ``[batch, seq, heads,
    dim]``. Given a mask, transformers' SDPA first copies every key/value head once per query head it
    serves (its ``repeat_kv``: PyTorch's GQA is slow on CUDA with a mask); PyTorch's CPU kernel takes the
    grouping itself (``enable_gqa``), which makes attention's forward and backward about 1.2-1.5x faster
    at RL batch shapes (14 rows x 48 queries x 87 keys, 9 query and 3 key/value heads: 11.0 -> 7.4 ms;
    Zen 4, 2 threads). The output is the same; the key and value gradients sum their query heads in
    another order."""
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous()


def _segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packed: Packed, scaling: float | None,
                       dropout: float) -> torch.Tensor:
    """Attention of one packed sequence (``q``: ``[heads, N, dim]``, ``k``/``v``: ``[kv_heads, N, dim]``),
    returned as ``[1, N, heads, dim]``, on our kernels where they run and measured faster than SDPA
    (:mod:`posttrain.models.train_attention`), otherwise on SDPA; key/value heads are read in place
    by either (``enable_gqa``)."""
    q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [N, heads, dim]

    def gather(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:  # [S, W] -> [S, heads, W, dim]
        # index_select, not x[index]: its backward adds whole rows (index_add_), where indexing's
        # accumulating index_put_ goes element by element (8 x 400 tokens: 0.2 s of a 18 s pass).
        return x.index_select(0, index.reshape(-1)).view(*index.shape, *x.shape[1:]).transpose(1, 2)

    ours = dropout == 0.0 and q.device.type == "cpu" and train_attention_pays()

    def attend(queries, keys, values, mask=None) -> torch.Tensor:  # -> [S * W, heads, dim]
        if ours and train_attention.supports(queries, keys):
            out = train_attention.attention(queries, keys, values, mask, scaling)
        else:
            out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, is_causal=mask is None,
                                                 dropout_p=dropout, scale=scaling, enable_gqa=True)
        return out.transpose(1, 2).reshape(-1, out.shape[1], out.shape[3])

    def attend_keys(queries: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return attend(gather(q, queries), gather(k, keys), gather(v, keys), mask)

    parts = []
    if packed.start.shape[1]:  # the start every prompt shares: causal
        parts.append(attend_keys(packed.start, packed.start, None))
    if packed.prompts.shape[1]:  # prompts: causal after the shared start; no real token sees the padding at the end
        parts.append(attend_keys(packed.prompts, packed.prompt_keys, packed.prompt_mask))
    parts.append(attend_keys(packed.completions, packed.completion_keys, packed.completion_mask))
    return torch.cat(parts).index_select(0, packed.order).unsqueeze(0)


AttentionInterface.register(NAME, posttrain_sdpa)
AttentionMaskInterface.register(NAME, sdpa_mask)


def use_posttrain_attention(model: nn.Module) -> None:
    """Switch ``model`` (a transformers model, also when wrapped by peft) from SDPA attention to
    :func:`posttrain_sdpa`; models on another attention implementation are left as they are.
    Not saved with the model: a checkpoint loads with SDPA."""
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(NAME)
