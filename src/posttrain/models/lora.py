"""LoRA adapters (Hu et al. 2021, arXiv:2106.09685) through peft."""

from __future__ import annotations

from peft import LoraConfig as PeftLoraConfig
from peft import PeftModel, get_peft_model
from transformers import PreTrainedModel

from posttrain.config import ConfigError, LoraConfig


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
    return get_peft_model(model, peft_cfg)
