"""The trainable policy: model + tokenizer, and the frozen reference when the KL needs one."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from peft import PeftModel

from posttrain.config import ModelSection
from posttrain.models.attention import use_posttrain_attention
from posttrain.models.device import autocast_dtype, resolve_device, uses_packed_weights
from posttrain.models.loading import ModelLoadError, describe_error, load_model, load_tokenizer
from posttrain.models.logprobs import TokenOutputs, policy_forward, token_logprobs
from posttrain.models.lora import apply_lora, peft_quietly
from posttrain.models.onednn_linear import onednn_training
from posttrain.models.packed_linear import pack_frozen_linears
from posttrain.models.train_elementwise import use_fused_norm_mlp


def use_training_kernels(model: torch.nn.Module) -> None:
    """The training pass's own layers for ``model``, as every model posttrain trains or scores runs them:
    packed attention without padding (float32 attention on our kernels on the CPU) and float32 RMSNorm and
    SwiGLU on our kernels on the CPU, each where it applies and measured faster."""
    use_posttrain_attention(model)
    use_fused_norm_mlp(model)


class Policy:
    """A causal LM being trained, with helpers the trainer and the rollout share.

    The model is moved to ``cfg.device`` (resolved: ``auto`` is CUDA when present); every
    tensor the trainer builds for it goes to ``policy.device``.

    The reference model exists only when ``need_reference`` (KL coefficient > 0). With LoRA it
    costs nothing: the reference is the same network with its adapters switched off.
    """

    def __init__(self, model, tokenizer, cfg: ModelSection, need_reference: bool = False,
                 sampler_dtype: torch.dtype = torch.float32):
        self.device = resolve_device(cfg.device)
        self.model = model.to(self.device)
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.autocast_dtype = autocast_dtype(cfg, self.device, sampler_dtype)
        use_training_kernels(self.model)
        self._reference = None
        if need_reference and not isinstance(model, PeftModel):
            self._reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.has_reference = need_reference
        if uses_packed_weights(cfg, self.device):  # frozen weights (reference, LoRA base layers): packed once
            for frozen in (self._reference, model if isinstance(model, PeftModel) else None):
                if frozen is not None:
                    pack_frozen_linears(frozen)

    @classmethod
    def load(cls, cfg: ModelSection, need_reference: bool = False, checkpoint: str | Path | None = None,
             sampler_dtype: torch.dtype = torch.float32) -> "Policy":
        """Load ``cfg.name`` (or a saved checkpoint of it), with LoRA when configured. ``sampler_dtype`` is the
        precision the rollout decodes in, which ``model.autocast: auto`` follows on a CPU."""
        resolve_device(cfg.device)  # a device that is not there fails before the model loads
        if checkpoint is not None:
            path = _model_dir(Path(checkpoint))
            if (path / "adapter_config.json").is_file():
                base = load_model(cfg.name, cfg.dtype)
                try:
                    with peft_quietly():
                        model = PeftModel.from_pretrained(base, str(path), is_trainable=True)
                except Exception as e:  # noqa: BLE001 - truncated or garbage adapter files raise many types
                    raise ModelLoadError(f"cannot load the LoRA adapters in {path}: {describe_error(e)}") from None
            else:
                model = load_model(str(path), cfg.dtype)
            tokenizer = load_tokenizer(str(path))
        else:
            model = load_model(cfg.name, cfg.dtype)
            tokenizer = load_tokenizer(cfg.name)
            if cfg.lora.enabled:
                model = apply_lora(model, cfg.lora)
        if cfg.gradient_checkpointing:
            # transformers 5.2x renamed it activation checkpointing; the old name goes in v6.
            if hasattr(model, "activation_checkpointing_enable"):
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.config.use_cache = False
        return cls(model, tokenizer, cfg, need_reference, sampler_dtype)

    @property
    def pad_id(self) -> int:
        return int(self.tokenizer.pad_token_id)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    @property
    def pack_weights(self) -> bool:
        """Whether generation should pack linear weights for oneDNN (a CPU-only fast path)."""
        return uses_packed_weights(self.cfg, self.device)

    def autocast(self):
        """The ``model.autocast`` context for forward passes (a no-op without autocast)."""
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    @contextmanager
    def _pass(self) -> Iterator[None]:
        """The context of a forward pass of the policy: ``model.autocast``, and its float32 matmuls on
        oneDNN where that measured faster than PyTorch's own (``model.pack_weights``, CPU only). Not
        with activation checkpointing: its recomputation in backward runs outside this context, and
        must save what the forward saved."""
        onednn = None if self.pack_weights and not self.cfg.gradient_checkpointing else False
        with self.autocast(), onednn_training(self.model, onednn):
            yield

    def logprobs(self, input_ids, attention_mask, positions=None, prompt_lengths=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token (logprobs, entropy); see :func:`posttrain.models.logprobs.token_logprobs`."""
        with self._pass():
            return token_logprobs(self.model, input_ids, attention_mask, positions, self.cfg.logprob_chunk_size,
                                  prompt_lengths)

    def forward(self, input_ids, attention_mask, positions=None, prompt_lengths=None, value_head=None,
                entropy_grad: bool = False) -> TokenOutputs:
        """Logprobs, entropy and, with ``value_head``, values from one forward pass (see policy_forward)."""
        with self._pass():
            return policy_forward(self.model, input_ids, attention_mask, positions, self.cfg.logprob_chunk_size,
                                  prompt_lengths, value_head, entropy_grad)

    @torch.no_grad()
    def reference_logprobs(self, input_ids, attention_mask, positions=None, prompt_lengths=None) -> torch.Tensor:
        if not self.has_reference:
            raise RuntimeError("reference log-probs requested but the policy was loaded without a reference")
        if self._reference is not None:
            model, ctx = self._reference, nullcontext()
        else:
            model, ctx = self.model, self.model.disable_adapter()
        with ctx, self.autocast():
            lp, _ = token_logprobs(model, input_ids, attention_mask, positions, self.cfg.logprob_chunk_size,
                                   prompt_lengths)
        return lp

    def save(self, path: str | Path, state_dict: dict | None = None) -> None:
        """Save weights (or only the adapters, with LoRA) and the tokenizer as a loadable directory;
        ``state_dict`` replaces the model's own (the gathered weights of a sharded model)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path, state_dict=state_dict)
        self.tokenizer.save_pretrained(path)


def _model_dir(path: Path) -> Path:
    """Accept a run's checkpoint directory (which holds ``model/``) or a model directory itself."""
    if (path / "model").is_dir():
        path = path / "model"
    if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
        raise FileNotFoundError(f"checkpoint {path}: no config.json or adapter_config.json (expected a saved model)")
    return path
