"""A Python tool: run a short program in the sandbox and return what it prints.

The program runs in posttrain's sandbox (``posttrain.sandbox``: bubblewrap, no network, a
read-only system, a private temp dir, its own PID namespace and uid, CPU/memory/process/file
limits), in the warm pool shared with the code environment.
"""

from __future__ import annotations

from posttrain.sandbox import Limits, SandboxUnavailable, shared_sandbox
from posttrain.tools.registry import ToolError

LIMITS = Limits(timeout=5.0, memory_mb=512, max_output_bytes=2000)


def python(code: str) -> str:
    """Run a Python program and return its printed output (use print to see values).

    Args:
        code: The complete program, e.g. "print(sum(range(10)))".
    """
    try:
        result = shared_sandbox().run(code, LIMITS)
    except SandboxUnavailable as e:
        raise ToolError(f"the Python sandbox is not available on this machine: {e}") from None
    if result.status == "timeout":
        raise ToolError(f"the program ran longer than {LIMITS.timeout:g} s and was stopped")
    if result.status == "memory":
        raise ToolError(f"the program ran out of memory ({LIMITS.memory_mb} MB): MemoryError")
    if result.status != "ok":
        lines = result.stderr.strip().splitlines()
        raise ToolError("the program failed: " + (lines[-1] if lines else result.message or result.status))
    text = result.stdout + ("\n[output truncated]" if result.truncated else "")
    return text.strip() or "(no output; use print to show a value)"
