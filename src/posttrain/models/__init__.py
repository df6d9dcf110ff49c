"""Policies: loading, LoRA, per-token logprobs/entropy, the frozen reference."""

from posttrain.models.loading import (
    DEFAULT_MODEL,
    PRESETS,
    ModelLoadError,
    load_model,
    load_tokenizer,
    resolve_model_path,
)
from posttrain.models.logprobs import token_logprobs
from posttrain.models.policy import Policy

__all__ = [
    "DEFAULT_MODEL",
    "PRESETS",
    "ModelLoadError",
    "Policy",
    "load_model",
    "load_tokenizer",
    "resolve_model_path",
    "token_logprobs",
]
