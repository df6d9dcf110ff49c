"""What machine a benchmark ran on, printed beside every table: CPU figures differ by CPU type.

Machines of one kind here differ (AMD EPYC with AVX512-BF16, Intel Xeon with AMX), and the fastest
dtype and kernels differ with them, so a table means little without the CPU model and its flags.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


def cpu_model_and_flags() -> tuple[str, list[str]]:
    """The CPU's model name and which of FLAGS it has (from /proc/cpuinfo; platform data elsewhere)."""
    info = Path("/proc/cpuinfo")
    if not info.is_file():
        return platform.processor() or platform.machine(), []
    model, flags = platform.machine(), set()
    for line in info.read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model == platform.machine():
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return model, [f for f in FLAGS if f in flags]


def describe() -> str:
    """One line: CPU model, cores, vector/matrix flags, torch version, load average now."""
    import torch

    model, flags = cpu_model_and_flags()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"machine: {model}, {os.cpu_count()} cores, flags {' '.join(flags) or 'none of ' + '/'.join(FLAGS)}; "
            f"torch {torch.__version__}; load average {load:.1f}")
