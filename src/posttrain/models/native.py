"""Our C kernels (``panel_gemm.c``, ``decode_layer.c``, ``train_attention.c``, ``train_elementwise.c``), compiled
on first use with the system's C compiler.

Each source is compiled once per machine into the posttrain cache directory (next to the CPU
probe's file: :func:`posttrain.models.probe_cache.cache_dir`) with ``$CC`` or ``cc``, ``-O3 -mavx2
-mfma -fopenmp``, and loaded with ctypes; a source may include the headers beside it (``simd.h``).
No Python headers are involved, so a build takes about a second. The kernels run on PyTorch's own
OpenMP runtime and thread count. Where one cannot be built (not x86-64, no AVX2 and FMA, no C
compiler, a failed build) :func:`load` says why, and the operations PyTorch ships serve instead.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from posttrain.models.probe_cache import cache_dir, cpuinfo

# -ffp-contract=off: a*b + c in C stays two roundings, as in PyTorch (intrinsics FMAs are explicit)
COMPILE_FLAGS = ("-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC")


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def source_text(source: Path) -> str:
    """The text a kernel is built from: its source and the headers beside it that it may include (what
    a build, and a probe timing the kernel, depend on)."""
    return source.read_text() + "".join(h.read_text() for h in sorted(source.parent.glob("*.h")))


def _build(source: Path, compiler: str) -> Path:
    """The shared library, compiled unless this source was already compiled with this compiler and flags."""
    key = hashlib.sha256(f"{source_text(source)} {compiler} {COMPILE_FLAGS}".encode()).hexdigest()[:16]
    for root in (cache_dir(), Path(tempfile.gettempdir()) / f"posttrain-{os.getuid()}"):
        library = root / f"{source.stem}-{key}.so"
        if library.exists():
            return library
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError:  # a read-only home directory: the temporary directory
            continue
        if not os.access(root, os.W_OK):
            continue
        partial = root / f"{source.stem}-{key}.{os.getpid()}.so"
        try:
            result = subprocess.run([compiler, *COMPILE_FLAGS, str(source), "-o", str(partial), "-lm"],
                                    capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            raise OSError(f"{compiler} did not build {source.name} within 120 s") from None
        if result.returncode != 0:
            partial.unlink(missing_ok=True)
            lines = result.stderr.strip().splitlines() or [f"exit status {result.returncode}"]
            raise OSError(f"{compiler} could not build {source.name}: {lines[-1]}")
        partial.replace(library)  # another process loading it never sees half a file
        return library
    raise OSError("no writable directory for the compiled kernel")


def load(source: Path) -> ctypes.CDLL | str:
    """``source`` compiled and loaded, or why it cannot be here."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"not an x86-64 CPU ({platform.machine()})"
    flags = set(cpuinfo().get("flags", "").split())
    if not {"avx2", "fma"} <= flags:
        return "the CPU has no AVX2 and FMA"
    compiler = _compiler()
    if compiler is None:
        return "no C compiler (cc, or $CC)"
    try:
        return ctypes.CDLL(str(_build(source, compiler)))
    except OSError as e:
        return str(e)
