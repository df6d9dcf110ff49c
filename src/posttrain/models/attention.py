"""Attention in float32 on the CPU, whatever the dtype of the matmuls around it.

Under ``model.autocast: bfloat16`` PyTorch runs the CPU attention kernel in bf16: the value
projection returns bf16, and autocast narrows attention's inputs to bf16 even where they are
float32 (the rotary embedding returns float32 queries and keys). There its backward is 3-4x
slower than in float32 at the shapes of RL batches (SDPA forward + backward, 8 rows x 48 tokens,
9 query and 3 key/value heads of 64: 10.1 ms bf16 against 2.5 ms float32, and 3.2 ms when bf16
inputs are widened to float32 first; Zen 4 EPYC, 2 threads). Attention is a small share of the
arithmetic, so widening its inputs costs little and also keeps its softmax in float32. The
function is registered with transformers' attention interface (with the SDPA mask builder, so
padding is masked as before) and wraps transformers' own SDPA attention; a float32 pass without
autocast computes exactly what plain SDPA does."""

from __future__ import annotations

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "posttrain_float32_sdpa"


def float32_sdpa(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention on float32 inputs with autocast off (under autocast PyTorch narrows
    SDPA's inputs to bf16, also float32 ones such as the rotary-embedded queries and keys); the output
    returns to the query's dtype. Float32 inputs outside autocast pass through unchanged."""
    if attention_mask is not None and attention_mask.is_floating_point():
        attention_mask = attention_mask.float()
    with torch.autocast(query.device.type, enabled=False):
        out, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(), attention_mask,
                                              **kwargs)
    return out.to(query.dtype), weights


AttentionInterface.register(NAME, float32_sdpa)
AttentionMaskInterface.register(NAME, sdpa_mask)


def use_float32_attention(model: nn.Module) -> None:
    """Switch ``model`` (a transformers model, also when wrapped by peft) from SDPA attention to
    :func:`float32_sdpa`; models on another attention implementation are left as they are.
    Not saved with the model: a checkpoint loads with SDPA."""
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(NAME)
