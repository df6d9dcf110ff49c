"""A Python tool: run a short program and return what it prints.

Runs in a separate interpreter (isolated mode, empty environment, a private temporary working
directory, its own session) with limits on CPU time, memory, file size and wall time. This is a
restricted subprocess, not an isolating sandbox: it limits resources but can still see the file
system and the network, so only give it to models you would let run code on this machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

from posttrain.tools.registry import ToolError

TIMEOUT_S = 5.0
MEMORY_BYTES = 512 * 2**20
MAX_OUTPUT = 2000

# The limits are set by the child itself before it runs the program (read from stdin): a
# preexec_fn would not be safe here, because environments are stepped from several threads.
_BOOTSTRAP = f"""
import resource, sys
resource.setrlimit(resource.RLIMIT_CPU, ({int(TIMEOUT_S) + 1}, {int(TIMEOUT_S) + 1}))
resource.setrlimit(resource.RLIMIT_AS, ({MEMORY_BYTES}, {MEMORY_BYTES}))
resource.setrlimit(resource.RLIMIT_FSIZE, ({2**20}, {2**20}))
source = sys.stdin.read()
sys.stdin = open('/dev/null')
exec(compile(source, '<agent>', 'exec'), {{'__name__': '__main__'}})
"""


def python(code: str) -> str:
    """Run a Python program and return its printed output (use print to see values).

    Args:
        code: The complete program, e.g. "print(sum(range(10)))".
    """
    with tempfile.TemporaryDirectory(prefix="posttrain-py-") as tmp:
        proc = subprocess.Popen([sys.executable, "-I", "-c", _BOOTSTRAP], cwd=tmp, env={}, start_new_session=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = proc.communicate(code.encode(errors="replace"), timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise ToolError(f"the program ran longer than {TIMEOUT_S:g} s and was stopped") from None
        finally:
            # The whole session, so that processes the program started die with it.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    if proc.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines()
        raise ToolError("the program failed: " + (lines[-1] if lines else f"exit code {proc.returncode}"))
    text = out.decode(errors="replace")
    text = text if len(text) <= MAX_OUTPUT else text[:MAX_OUTPUT] + "\n[output truncated]"
    return text.strip() or "(no output; use print to show a value)"
