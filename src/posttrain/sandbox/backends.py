"""How a fork server is started: inside bubblewrap (the default) or as a plain process (opt-in).

The bubblewrap sandbox gives the server, and so every program it forks: a read-only view of the
whole filesystem (``--ro-bind / /``), a private size-limited tmpfs on /tmp, a fresh /dev and
/proc, no network (its own network namespace holds only a loopback device that nothing outside
shares), its own PID namespace (the host's processes are invisible and unsignalable, and every
descendant dies with the sandbox), an empty environment (``--clearenv``), a new terminal session,
and death with its parent. When posttrain runs as root, programs run under a uid of their own
(set by the server); otherwise bwrap's user namespace maps the caller's uid.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

SERVER = Path(__file__).with_name("server.py")


class SandboxUnavailable(RuntimeError):
    """The requested backend cannot run here; the message says what to install."""


def find_bwrap() -> str:
    """Path of the bwrap binary: $POSTTRAIN_BWRAP, else bwrap on PATH."""
    path = os.environ.get("POSTTRAIN_BWRAP") or shutil.which("bwrap")
    if not path:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is not installed: `apt-get install bubblewrap` (or set POSTTRAIN_BWRAP); "
            "the plain rlimit backend (backend='rlimit') runs without it but isolates much less"
        )
    return path


def bwrap_command(tmp_mb: int) -> tuple[list[str], str]:
    """The command that starts an isolated fork server, and the server's scratch root."""
    cmd = [
        find_bwrap(),
        "--ro-bind", "/", "/",
        "--dev", "/dev",
        "--proc", "/proc",
        "--size", str(tmp_mb << 20), "--tmpfs", "/tmp",
        "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        "--die-with-parent", "--new-session",
        "--clearenv", "--setenv", "PATH", "/usr/bin:/bin",
        "--chdir", "/tmp",
    ]
    if os.geteuid() != 0:
        # Without root, a user namespace is how bwrap gets the rights to build the others.
        cmd.append("--unshare-user")
    return cmd + [sys.executable, "-I", str(SERVER), "isolated"], "/tmp"


def rlimit_command() -> tuple[list[str], str]:
    """A fork server with resource limits only: no namespaces, the host filesystem writable
    wherever the run's uid may write, the network reachable, and a process that leaves the
    run's process group outliving it. Use it only where bubblewrap cannot run."""
    warnings.warn(
        "posttrain.sandbox backend 'rlimit' isolates much less than bubblewrap: programs can reach the "
        "network, write wherever their uid may, and a setsid'd grandchild can outlive the run",
        RuntimeWarning,
        stacklevel=3,
    )
    scratch = tempfile.mkdtemp(prefix="posttrain-sandbox-")
    os.chmod(scratch, 0o711)
    return [sys.executable, "-I", str(SERVER), "plain"], scratch
