"""What machine a benchmark ran on, printed beside every table: CPU figures differ by CPU type. Also the
console a benchmark prints its tables on and the JSON file it writes its figures to.

Machines of one kind here differ (AMD EPYC with AVX512-BF16, Intel Xeon with AMX), and the fastest
dtype and kernels differ with them, so a table means little without the CPU model and its flags.

    python benchmarks/machine.py    # prints that line alone (measuring what this machine has not measured yet)
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from rich.console import Console

from posttrain.models import decode_layer, sample_tokens, train_attention, train_elementwise
from posttrain.models.cpu_probe import (
    ONEDNN_TRAINING_THRESHOLD,
    bf16_decode_speedup,
    bf16_training_speedup,
    cpu_flags,
    has_bf16_units,
    narrow_bf16_decode_speedup,
    narrow_decode_kernel,
    native_layer_pays,
    native_layer_speedup,
    onednn_training_pays,
    onednn_training_speedup,
    onednn_weight_grad_pays,
    onednn_weight_grad_speedup,
    prefill_pays,
    sampler_pays,
    sampler_speedup,
    train_attention_pays,
    train_attention_speedup,
    train_elementwise_pays,
    train_elementwise_speedup,
    wide_decode_kernel,
)
from posttrain.models.panel_linear import unavailable_reason
from posttrain.models.probe_cache import cpuinfo, isa_ceilings, probe_file

LOG_WIDTH = 160


def console() -> Console:
    """rich's console for a benchmark's tables: the terminal's width in a terminal; in a log (``targets.py``,
    ``| tee``), 160 columns, where rich would take 80 and wrap a table's long first column over many lines."""
    return Console(width=None if sys.stdout.isatty() else LOG_WIDTH)


def write_json(path: str | Path, data: object) -> None:
    """Write a benchmark's figures to ``path`` as JSON (its folder made as needed), and say where."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    console().print(f"wrote {path}")


FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


def cpu_model_and_flags() -> tuple[str, list[str]]:
    """The CPU's model name and which of FLAGS it has (from /proc/cpuinfo; platform data elsewhere), less
    those above an instruction-set ceiling set in the environment."""
    model = platform.processor() or platform.machine()
    fields = cpuinfo()
    if fields:
        # Machines of one name differ by generation (an "AMD EPYC" was Zen 4 in one VM, Zen 5 in another).
        model = f"{fields.get('model name', model)} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')})"
    return model, [f for f in FLAGS if f in cpu_flags()]


def describe() -> str:
    """One line: CPU model, cores, vector/matrix flags (and any ceiling set on them), measured speed-ups
    of the dtype and kernel choices, torch version, load now, and the file those measurements are kept in."""
    import torch

    model, flags = cpu_model_and_flags()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    ceilings = ", ".join(f"{name}={value}" for name, value in isa_ceilings().items())
    ceilings = f" (capped by {ceilings})" if ceilings else ""
    return (f"machine: {model}, {os.cpu_count()} cores, flags {' '.join(flags) or 'none of ' + '/'.join(FLAGS)}"
            f"{ceilings}; "
            f"{bf16_line()}; {layer_line()}; {sampler_line()}; {attention_line()}; {elementwise_line()}; "
            f"fp32 training matmuls on {'oneDNN' if onednn_training_pays() else 'MKL'} (oneDNN vs MKL "
            f"{onednn_training_speedup():.2f}x, oneDNN from {ONEDNN_TRAINING_THRESHOLD}x), their weight gradients on "
            f"{'oneDNN' if onednn_weight_grad_pays() else 'MKL'} (oneDNN vs MKL {onednn_weight_grad_speedup():.2f}x); "
            f"torch {torch.__version__}; load average {load:.1f}; "
            f"the choices' measurements, taken once on this machine, are kept in {probe_file()}")


def bf16_line() -> str:
    """What bf16 decoding and training matmuls measured here against fp32, and the kernels that
    decode steps take (and why our own panel kernel cannot run, where it cannot)."""
    narrow = (f"one-row decode steps on {narrow_decode_kernel(False)} (float32), {narrow_decode_kernel(True)} (bf16), "
              f"wider ones on {wide_decode_kernel(False)} (float32), {wide_decode_kernel(True)} (bf16)")
    def prefill(kernel: Callable[[bool], str], bf16: bool) -> str:
        return "ours" if prefill_pays(kernel(bf16), bf16) else "the model's"

    narrow += (f"; prompts prefilled by our layer loop where the step's kernel is no slower at 128 rows than the "
               f"model's forward: one-row {prefill(narrow_decode_kernel, False)} / "
               f"{prefill(narrow_decode_kernel, True)}, wider {prefill(wide_decode_kernel, False)} / "
               f"{prefill(wide_decode_kernel, True)} (float32 / bf16)")
    if unavailable_reason():
        narrow += f"; no panel kernel: {unavailable_reason()}"
    if has_bf16_units():
        return (f"bf16 vs fp32: decoding {bf16_decode_speedup():.2f}x, "
                f"training matmuls {bf16_training_speedup():.2f}x; {narrow}")
    return f"no bf16 units: bf16 vs fp32 one-row decoding {narrow_bf16_decode_speedup():.2f}x; {narrow}"


def kernel_line(work: str, module: ModuleType, pays: Callable[[], bool], speedup: Callable[[], float],
                theirs: str) -> str:
    """What ``work`` runs on: our kernels (``module``'s) where they measured faster, else ``theirs``."""
    if module.unavailable_reason():
        return f"{work} on {theirs} (no kernels: {module.unavailable_reason()})"
    where = "our kernels" if pays() else theirs
    return f"{work} on {where} (ours vs {theirs.removesuffix(' operations')} {speedup():.2f}x)"


def layer_line() -> str:
    """What decode steps run a layer's work besides its matmuls on."""
    return kernel_line("decode layers' non-matmul work", decode_layer, native_layer_pays, native_layer_speedup,
                       "PyTorch's operations")


def sampler_line() -> str:
    """What draws the next tokens from float32 logits (without top-p)."""
    return kernel_line("token draws", sample_tokens, sampler_pays, sampler_speedup, "PyTorch's operations")


def attention_line() -> str:
    """What a packed training pass's attention runs on."""
    return kernel_line("training attention", train_attention, train_attention_pays, train_attention_speedup, "SDPA")


def elementwise_line() -> str:
    """What a float32 training pass's RMSNorm, SwiGLU and LM-head softmax run on."""
    return kernel_line("training RMSNorm/SwiGLU/head softmax", train_elementwise, train_elementwise_pays,
                       train_elementwise_speedup, "PyTorch's operations")


if __name__ == "__main__":
    print(describe())
