"""Verifiers of untrusted answers run in child processes, so that an answer cannot hang or harm the trainer.

Two kinds of verifier read model output in ways the trainer's process cannot survive:

- **math-verify** hands the answer to SymPy, which evaluates it: ``\\boxed{10^{10^{10^{10}}}}`` asks
  CPython for an integer of 10**(10**10) digits, a C loop that holds the GIL. Environments are stepped
  in worker threads, where nothing stops it (math-verify's timeouts are SIGALRM, which only the main
  thread may set; the rollout's per-step timeout raises its exception at the next bytecode, which never
  comes), so every thread of the trainer waits with it.
- **reasoning-gym**'s verifiers read some answers with ``eval`` or SymPy's ``parse_expr`` (``countdown``,
  ``puzzle24``): ``__import__('os').system(...)`` as an answer runs as the trainer.

:func:`call` runs a verifier in a child process, a Python interpreter running :func:`serve`: one JSON
line in, one out, in the child's main thread (so math-verify's own timeouts work there), its address
space capped at :data:`MEMORY_BYTES`. A child that misses ``timeout`` is killed, and one that dies on an
answer is gone (:class:`NoVerdict`; the callers count the answer wrong); the next call starts another.
``sandboxed`` children run in bubblewrap as the code sandbox's programs do (:mod:`posttrain.sandbox.backends`:
a read-only filesystem, no network, root's home hidden, no capabilities); where bubblewrap is missing or
cannot run, the first call raises :class:`~posttrain.sandbox.SandboxUnavailable` or :class:`CannotStart`.
At most :data:`MAX_CHILDREN` of a kind run at once; idle ones are kept for the next call and end with the
trainer (their stdin closes).
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from posttrain.sandbox.backends import PACKAGE_ROOT, bwrap_prefix
from posttrain.sandbox.json_lines import JsonLineReader

# The time a child has to answer (math-verify's own limits inside it are 5 s apiece for parsing each
# side and for the comparison).
ANSWER_TIMEOUT = 20.0
# What a child's first call may take besides: the verifier's imports and, for reasoning-gym, its dataset.
START_TIMEOUT = 60.0
LOG_BYTES = 1 << 20
MEMORY_BYTES = 4 << 30
MAX_CHILDREN = max(1, min(4, os.cpu_count() or 1))
SANDBOX_TMP_MB = 64
_CHILD_MAIN = "from posttrain.rewards.isolated import serve; serve()"


class CannotStart(RuntimeError):
    """The child ended before its first answer: the set-up's fault (bubblewrap that cannot run here, say)."""


class NoVerdict(Exception):
    """The verifier gave no verdict on this answer: it ran past its time limit (its process was killed), or
    its process died on it (after answering before, so the answer's doing, not the set-up's)."""


def serve() -> None:
    """The child's loop: ``{"function": "module:name", "args": [...]}`` lines in, ``{"value": ...}`` or
    ``{"error": ...}`` lines out, until stdin closes."""
    try:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
        # Its log is a file: past LOG_BYTES a write fails (EFBIG) instead of filling the disk or killing it.
        resource.setrlimit(resource.RLIMIT_FSIZE, (LOG_BYTES, LOG_BYTES))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    except (ValueError, OSError):  # a system that refuses a limit (macOS, on RLIMIT_AS): the time limit stays
        pass
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever a verifier prints goes to stderr, not into the replies
    for line in sys.stdin:
        request = json.loads(line)
        try:
            module, name = request["function"].split(":")
            reply = json.dumps({"value": getattr(importlib.import_module(module), name)(*request["args"])})
        except Exception as e:  # noqa: BLE001 - reported to the caller, which raises it
            reply = json.dumps({"error": f"{type(e).__name__}: {e}"})
        print(reply, file=replies, flush=True)


def _command(sandboxed: bool) -> list[str]:
    python = [sys.executable, "-c", _CHILD_MAIN]
    if not sandboxed:
        return python
    prefix = bwrap_prefix(SANDBOX_TMP_MB) + ["--setenv", "PYTHONPATH", str(PACKAGE_ROOT)]
    return prefix + (["--cap-drop", "ALL"] if os.geteuid() == 0 else []) + python


class _Child:
    """One child process running :func:`serve`; what it prints goes to a file of its own (the reason, when
    it dies), capped at :data:`LOG_BYTES`."""

    def __init__(self, command: list[str]) -> None:
        path = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")]))
        self.log = tempfile.TemporaryFile()
        try:
            # Started in posttrain's own folder: ``python -c`` puts its working directory first on sys.path,
            # and the trainer's may hold a module that shadows one the verifier imports.
            self.proc = subprocess.Popen(command, env={**os.environ, "PYTHONPATH": path}, cwd=PACKAGE_ROOT,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                         start_new_session=True)
        except OSError as e:  # no such program
            self.log.close()
            raise CannotStart(f"cannot run {command[0]}: {e.strerror}") from None
        self.answers = 0
        self._lines = JsonLineReader(self.proc.stdout.fileno())

    def ask(self, request: dict, timeout: float) -> dict | None:
        """The child's reply, or None when it ended or missed ``timeout`` (plus :data:`START_TIMEOUT` until its
        first answer, which imports the verifier and builds what it needs)."""
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:  # it ended
            self._lines.ended = True
            return None
        reply = self._lines.read(time.monotonic() + timeout + (0.0 if self.answers else START_TIMEOUT))
        self.answers += reply is not None
        return reply

    def exit_status(self) -> int | None:
        """Its exit status once it has ended, None while it runs (it missed its time limit). An ended pipe
        comes a moment before the exit status can be read: that moment is waited for."""
        if self._lines.ended:
            try:
                return self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        return self.proc.poll()

    def last_words(self) -> str:
        self.log.seek(0)
        lines = self.log.read().decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else "it printed nothing"

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # bwrap and what runs in it
        except ProcessLookupError:
            pass
        self.proc.wait()
        for file in (self.proc.stdin, self.proc.stdout, self.log):
            try:
                file.close()
            except OSError:  # what was left to flush into a pipe that no one reads any more
                pass


class _Pool:
    """The children of one kind in one process: idle ones are reused; at most :data:`MAX_CHILDREN` at once."""

    def __init__(self, sandboxed: bool) -> None:
        self.command = _command(sandboxed)  # SandboxUnavailable where bwrap is missing: no pool is kept
        self.pid = os.getpid()
        self.idle: list[_Child] = []
        self.lock = threading.Lock()
        self.slots = threading.BoundedSemaphore(MAX_CHILDREN)
        # bwrap's --die-with-parent fires when the *thread* that started it ends, and callers are the rollout's
        # short-lived env threads: children are started from this one long-lived thread instead.
        self.spawner = ThreadPoolExecutor(1, thread_name_prefix="verifier-spawner")
        atexit.register(self.close)

    def close(self) -> None:
        """Ends the idle children (at exit: they would end on their own, and warn of it)."""
        if os.getpid() != self.pid:  # a forked copy's exit: the children are its parent's
            return
        with self.lock:
            idle, self.idle = self.idle, []
        for child in idle:
            child.close()

    def call(self, request: dict, timeout: float) -> Any:
        with self.slots:
            with self.lock:
                child = self.idle.pop() if self.idle else None
            if child is None:  # started outside the lock: other calls may take and return idle children meanwhile
                child = self.spawner.submit(_Child, self.command).result()
            try:
                reply = child.ask(request, timeout)
            except BaseException:  # the caller gave up on it (the rollout's step timeout): so does the pool
                child.close()
                raise
            if reply is None:
                ended = child.exit_status()
                what = (f"{request['function']} did not answer within {timeout:g} s" if ended is None else
                        f"the process of {request['function']} ended (exit status {ended}): {child.last_words()}")
                child.close()
                # A death before any answer is the set-up's (it cannot start); a later one, the answer's doing.
                raise NoVerdict(what) if ended is None or child.answers else CannotStart(what)
            with self.lock:
                self.idle.append(child)
        if "error" in reply:
            raise RuntimeError(f"{request['function']} failed: {reply['error']}")
        return reply["value"]


_pools: dict[bool, _Pool] = {}
_pools_lock = threading.Lock()


def call(function: str, *args: Any, sandboxed: bool = False, timeout: float | None = None) -> Any:
    """``function`` (``"package.module:name"``) called with ``args`` (JSON values) in a child process, and
    its JSON value. Raises :class:`NoVerdict` when it takes longer than ``timeout`` seconds (default
    :data:`ANSWER_TIMEOUT`) or its process dies on these arguments, :class:`CannotStart` when its process
    ends before a first answer, and RuntimeError when the function raises."""
    with _pools_lock:
        pool = _pools.get(sandboxed)
        if pool is None or pool.pid != os.getpid():  # a forked process starts its own children
            pool = _pools[sandboxed] = _Pool(sandboxed)
    return pool.call({"function": function, "args": list(args)}, ANSWER_TIMEOUT if timeout is None else timeout)
