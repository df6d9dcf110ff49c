"""Our C kernels (``panel_gemm.c``, ``panel_dot.c``, ``decode_layer.c``, ``sample_tokens.c``,
``train_attention.c``, ``train_elementwise.c``, ``transpose.c``), compiled on first use with the system's C compiler.

Each source is compiled once per machine into the posttrain cache directory (next to the CPU
probe's file: :func:`posttrain.models.probe_cache.cache_dir`) with ``$CC``, ``cc`` or ``gcc``,
``-O3 -mavx2 -mfma -fopenmp``, and loaded with ctypes; a source may include the headers beside it
(``simd.h``). No Python headers are involved, so a build takes about a second. The kernels run on
PyTorch's own OpenMP runtime and thread count. Where one cannot be built (not x86-64, no AVX2 and FMA,
no C compiler: :func:`cannot_build`; a failed build) :func:`load` says why, and the operations PyTorch
ships serve instead.
Each kernel module holds one :class:`Kernels` for its source, or one per build where a source is also
built with more of the CPU's instructions (``panel_gemm.c`` with ``-mavx512f``).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch

from posttrain.models.probe_cache import cache_dir, cpu_flags, hardware_flags

# -ffp-contract=off: a*b + c in C stays two roundings, as in PyTorch (intrinsics FMAs are explicit)
COMPILE_FLAGS = ("-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC")


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def source_text(source: Path) -> str:
    """The text a kernel is built from: its source and the headers beside it that it may include (what
    a build, and a probe timing the kernel, depend on)."""
    return source.read_text() + "".join(h.read_text() for h in sorted(source.parent.glob("*.h")))


def _build(source: Path, compiler: str, flags: tuple[str, ...] = ()) -> Path:
    """The shared library, compiled unless this source was already compiled with this compiler and flags."""
    key = hashlib.sha256(f"{source_text(source)} {compiler} {COMPILE_FLAGS} {flags}".encode()).hexdigest()[:16]
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
            result = subprocess.run([compiler, *COMPILE_FLAGS, *flags, str(source), "-o", str(partial), "-lm"],
                                    capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            raise OSError(f"{compiler} did not build {source.name} within 120 s") from None
        except OSError as e:  # $CC names no program, or one that cannot be run
            raise OSError(f"the C compiler {compiler} could not be run: {e.strerror}") from None
        if result.returncode != 0:
            partial.unlink(missing_ok=True)
            lines = result.stderr.strip().splitlines() or [f"exit status {result.returncode}"]
            raise OSError(f"{compiler} could not build {source.name}: {lines[-1]}")
        partial.replace(library)  # another process loading it never sees half a file
        return library
    raise OSError("no writable directory for the compiled kernel")


def cannot_build(needs: tuple[str, ...] = ()) -> str | None:
    """Why a kernel that runs on AVX2, FMA and ``needs`` (CPU flags as /proc/cpuinfo names them) cannot be
    built and run here, before any build is tried, or None: then a failed build is a fault, not the
    machine's (tests fail on it rather than skip). A flag above PyTorch's instruction-set cap
    (:func:`posttrain.models.probe_cache.cpu_flags`) counts as missing."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"not an x86-64 CPU ({platform.machine()})"
    if not {"avx2", "fma"} <= hardware_flags():
        return "the CPU has no AVX2 and FMA"
    missing = [flag for flag in needs if flag not in hardware_flags()]
    if missing:
        return f"the CPU has no {', '.join(missing)}"
    capped = [flag for flag in ("avx2", "fma", *needs) if flag not in cpu_flags()]
    if capped:
        capability = torch.backends.cpu.get_cpu_capability()
        cause = "ATEN_CPU_CAPABILITY sets it" if os.environ.get("ATEN_CPU_CAPABILITY") else \
            "PyTorch's choice for this CPU"
        return f"{', '.join(capped)} above PyTorch's instruction set here ({capability}; {cause})"
    if _compiler() is None:
        return "no C compiler (cc, gcc or $CC)"
    return None


def load(source: Path, needs: tuple[str, ...] = (), flags: tuple[str, ...] = ()) -> ctypes.CDLL | str:
    """``source`` compiled (with ``flags`` besides :data:`COMPILE_FLAGS`) and loaded, or why it cannot be
    here. ``needs``: the CPU flags it runs on besides AVX2 and FMA (:func:`cannot_build`), for a source or
    build that asks the compiler for more (``#pragma GCC target``, ``-mavx512f``): its instructions would
    stop the process where they are missing."""
    reason = cannot_build(needs)
    if reason is not None:
        return reason
    try:
        return ctypes.CDLL(str(_build(source, _compiler(), flags)))
    except OSError as e:
        return str(e)


@functools.cache
def kernels_unavailable() -> str | None:
    """Why our kernels cannot be built in this process, or None: :func:`cannot_build`, or a failed build of
    the smallest of them (``transpose.c``: a ``$CC`` that does not work). The CPU probes keep what they
    measure without our kernels apart (:func:`posttrain.models.probe_cache.probe_file`), so that a
    process that can build them never chooses by timings that left them out, and one that cannot never
    chooses a kernel it cannot load."""
    from posttrain.models import transpose  # here: transpose imports this module

    return transpose.unavailable_reason()


class Kernels:
    """The functions of one C source, loaded on first use (:func:`load`) with their ctypes signatures.

    ``signatures`` maps a function's name to its argument types, or to (argument types, return type);
    ``what`` names the kernels in the error of :meth:`loaded`; ``needs`` (CPU flags) and ``flags``
    (the compiler's), as for :func:`load`.
    """

    def __init__(self, source: Path, what: str, signatures: dict[str, list | tuple[list, Any]],
                 needs: tuple[str, ...] = (), flags: tuple[str, ...] = ()) -> None:
        self.source, self.what, self.signatures, self.needs, self.flags = source, what, signatures, needs, flags
        self._library: ctypes.CDLL | str | None = None

    def library(self) -> ctypes.CDLL | str:
        """The loaded library, or why there is none (built or found once per process)."""
        if self._library is None:
            lib = load(self.source, self.needs, self.flags)
            if not isinstance(lib, str):
                for name, signature in self.signatures.items():
                    argtypes, restype = signature if isinstance(signature, tuple) else (signature, None)
                    function = getattr(lib, name)
                    function.argtypes = argtypes
                    if restype is not None:
                        function.restype = restype
            self._library = lib
        return self._library

    def unavailable_reason(self) -> str | None:
        """Why the kernels cannot run here, or None when they can."""
        lib = self.library()
        return lib if isinstance(lib, str) else None

    def loaded(self) -> ctypes.CDLL:
        """The library; RuntimeError where it cannot be loaded here."""
        lib = self.library()
        if isinstance(lib, str):
            raise RuntimeError(f"the {self.what} ({self.source.name}) cannot run here: {lib}")
        return lib

    def forget(self) -> None:
        """Load again on the next use (for tests that change the compiler)."""
        self._library = None
