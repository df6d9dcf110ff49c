"""LoRA adapters (Hu et al. 2021, arXiv:2106.09685) through peft."""

from __future__ import annotations

import contextlib
import warnings

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import PeftModel, get_peft_model
from transformers import PreTrainedModel

from posttrain.config import ConfigError, LoraConfig


@contextlib.contextmanager
def peft_quietly():
    """peft reads model.is_gradient_checkpointing whenever it wraps a model, a name transformers 5.2x deprecated:
    a FutureWarning on every LoRA run that only peft can act on, silenced where peft wraps ours."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


def apply_lora(model: PreTrainedModel, cfg: LoraConfig) -> PeftModel:
    """Freeze ``model`` and wrap it with trainable low-rank adapters on ``cfg.target_modules``."""
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [m for m in cfg.target_modules if m not in present]
    if missing:
        raise ConfigError(
            f"model.lora.target_modules: {missing} not found in the model "
            f"(its linear layers include: {sorted(n for n in present if n.endswith('proj'))})"
        )
    peft_cfg = PeftLoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        task_type="CAUSAL_LM",
    )
    with peft_quietly():
        return get_peft_model(model, peft_cfg)


def merged_weights(model) -> list[tuple[str, torch.Tensor]]:
    """The model's weights under their Hugging Face names, with LoRA adapters folded in
    (W + scale * B A) for an inference engine that knows nothing of adapters.

    The merged tensors are fresh copies: the policy's own weights and adapters stay as they are
    (merging in place and back would add rounding error to the base weights at every sync).
    Tied weights appear once (``named_parameters`` drops duplicates).
    """
    if not isinstance(model, PeftModel):
        return [(name, p.detach()) for name, p in model.named_parameters()]
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    out = []
    with torch.no_grad():
        for name, module in base.named_modules():
            if isinstance(module, LoraLayer):
                layer = module.get_base_layer()
                weight = layer.weight
                if not module.merged and not module.disable_adapters:
                    weight = weight + sum(module.get_delta_weight(a) for a in module.active_adapters)
                out.append((f"{name}.weight", weight.detach()))
                if getattr(layer, "bias", None) is not None:
                    out.append((f"{name}.bias", layer.bias.detach()))
        out += [(name, p.detach()) for name, p in base.named_parameters()
                if "lora_" not in name and ".base_layer." not in name]
    return out
