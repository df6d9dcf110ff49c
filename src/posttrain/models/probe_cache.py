"""CPU measurements taken once per machine and kept in a file, so that every process agrees.

The fast paths of :mod:`posttrain.models.cpu_probe` are chosen by timing kernels, and on some CPUs two
kernels are close: an earlier oneDNN training probe read 1.05x to 1.33x across processes on a Zen 4
AMD EPYC, around the 1.25x threshold it had. Measured anew in each process, the choice then flipped between a
run and its resumed continuation, whose float sums differed in the last bits, so a resumed run did
not repeat the uninterrupted one; two runs of one config and seed differed the same way. The first
process on a machine measures and writes the file; every later one reads it (a lock keeps two
first processes from measuring at once). Delete the file to measure again. A measurement may
run code whose kernels another measurement chooses: the process holds the file's lock once, however
deep.

The file is keyed by what the timings depend on: the CPU (model and flags), torch's version, the
number of threads torch runs matmuls on, any instruction-set ceiling set in the environment
(:data:`ISA_CEILINGS`) and whether our kernels can be built
(:func:`posttrain.models.native.kernels_unavailable`); each value by its function's name and source
(and the code it measures, where that lives elsewhere), so that a changed measurement is taken again;
a value that is not of the type its function returns (a hand-edited or damaged file) is measured again too. It
lives in ``$POSTTRAIN_CACHE_DIR``, else ``$XDG_CACHE_HOME/posttrain``, else ``~/.cache/posttrain``;
where that cannot be written, each process measures for itself.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import inspect
import json
import os
import threading
import typing
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

T = TypeVar("T")

# One thread of this process measures at a time; it takes the file's lock at the outermost
# measurement only (a second flock on the same file from this process would wait for itself).
_measuring = threading.RLock()
_depth = 0


@functools.cache
def cpuinfo() -> dict[str, str]:
    """The first CPU's fields in /proc/cpuinfo (``model name``, ``flags``, ...), read once per
    process; empty where there is no such file."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


# Environment variables that cap the instructions PyTorch's kernels (ATEN_CPU_CAPABILITY), oneDNN's
# and MKL's use: they change what the probes measure. posttrain's own kernels keep to PyTorch's cap
# (:func:`cpu_flags`), so that one variable runs the whole stack as a CPU without AVX-512 would.
ISA_CEILINGS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def hardware_flags() -> frozenset[str]:
    """The CPU's feature flags as /proc/cpuinfo names them (empty where there is no such file)."""
    return frozenset(cpuinfo().get("flags", "").split())


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The flags whose instructions posttrain may use: the CPU's, less those above the instruction
    set PyTorch was told to stop at (``ATEN_CPU_CAPABILITY=avx2``: no AVX-512 or AMX; ``default``:
    no AVX, FMA or AMX either)."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability == "AVX512":
        return hardware_flags()
    above = ("avx512", "amx") if capability == "AVX2" else ("avx", "fma", "amx")
    return frozenset(flag for flag in hardware_flags() if not flag.startswith(above))


def isa_ceilings() -> dict[str, str]:
    """The :data:`ISA_CEILINGS` set in this environment, by name."""
    return {name: os.environ[name] for name in ISA_CEILINGS if os.environ.get(name)}


def cache_dir() -> Path:
    """``$POSTTRAIN_CACHE_DIR``, else ``$XDG_CACHE_HOME/posttrain``, else ``~/.cache/posttrain``."""
    root = os.environ.get("POSTTRAIN_CACHE_DIR")
    return Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "posttrain"


def probe_file() -> Path:
    """Where this machine's measurements are kept (see the module docstring)."""
    from posttrain.models import native  # here: native imports this module

    cpu = [cpuinfo().get(k, "") for k in ("vendor_id", "cpu family", "model", "model name", "flags")]
    # A ceiling, or our kernels' absence, in the key only where there is one, so that machines without keep
    # their measurements.
    ceilings = isa_ceilings()
    without = ["without our kernels"] if native.kernels_unavailable() else []
    key = json.dumps([cpu, torch.__version__, torch.get_num_threads()] + ([ceilings] if ceilings else []) + without)
    return cache_dir() / f"cpu-probe-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):  # not written yet, or cut short: measure again
        return {}
    return data if isinstance(data, dict) else {}


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _fits(value: object, returns: object) -> bool:
    """Whether ``value``, read back from the file, has the type a measurement returns (``returns``: its
    annotation; our probes return a number or ``dict[str, float]``; other annotations are not checked)."""
    if returns in (float, int):
        return _is_number(value)
    if typing.get_origin(returns) is dict:
        return isinstance(value, dict) and all(isinstance(k, str) and _is_number(v) for k, v in value.items())
    return True


def stored_per_machine(measure: Callable[[], T] | None = None, *, depends_on: str = "") -> Callable[[], T]:
    """``measure()`` taken once per machine (see the module docstring) and once per process; used as
    ``@stored_per_machine``, or ``@stored_per_machine(depends_on=text)`` when what it measures is
    also defined elsewhere (``text``: that code, or a digest of it), so that changing it measures again."""
    if measure is None:
        return functools.partial(stored_per_machine, depends_on=depends_on)  # type: ignore[return-value]
    try:
        source = inspect.getsource(measure)
    except OSError:  # no source shipped: the name alone
        source = ""
    key = f"{measure.__name__} {hashlib.sha256((source + depends_on).encode()).hexdigest()[:12]}"
    try:
        returns = typing.get_type_hints(measure).get("return")
    except (NameError, TypeError):  # an annotation that does not resolve: the value is not checked
        returns = None

    @functools.cache
    @functools.wraps(measure)
    def stored() -> T:
        global _depth
        try:
            path = probe_file()
            path.parent.mkdir(parents=True, exist_ok=True)
            lock = open(path.with_suffix(".lock"), "w")
        except (OSError, RuntimeError):  # a read-only or no home directory: this process measures for itself
            return measure()
        with _measuring, lock:
            if _depth == 0:
                fcntl.flock(lock, fcntl.LOCK_EX)
            data = _read(path)
            if key in data and _fits(data[key], returns):
                return data[key]
            _depth += 1
            try:
                value = measure()
            finally:
                _depth -= 1
            data = _read(path)  # as a nested measurement may have left it
            data[key] = value
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            try:
                tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
                tmp.replace(path)  # readers never see half a file
            except OSError:  # a full disk: measured, not kept
                tmp.unlink(missing_ok=True)
            return value

    return stored
