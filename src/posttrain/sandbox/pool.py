"""A warm pool of fork servers: many short isolated runs per second.

Starting bubblewrap and a Python interpreter costs tens of milliseconds; forking a warm
interpreter costs one or two. Each worker is one long-lived sandbox holding one fork server
(``server.py``) that runs one program at a time, so a worker's PID namespace and uid belong to
one run at a time: after each run the server kills whatever is left in the namespace. A worker
that dies or stops answering is replaced, and its run is reported as ``killed``.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

from posttrain.sandbox.backends import SandboxUnavailable, bwrap_command, rlimit_command
from posttrain.sandbox.json_lines import JsonLineReader
from posttrain.sandbox.result import ExecResult, Limits

Backend = Literal["bwrap", "rlimit"]
EXIT_MEMORY = 86  # server.py's exit code for a MemoryError
START_TIMEOUT = 30.0
# Beyond a run's own timeout, how long the server may take to clean up and answer.
ANSWER_MARGIN = 5.0
# Each pool draws a block of uids for its workers, far above any account's uid.
_UID_BASE = 1_000_000


class _Worker:
    def __init__(self, backend: Backend, index: int, uid: int | None, tmp_mb: int):
        cmd, self.tmp_root = bwrap_command(tmp_mb) if backend == "bwrap" else rlimit_command()
        self.index, self.uid = index, uid
        self._log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     start_new_session=True)
        self._lines = JsonLineReader(self.proc.stdout.fileno())
        if self._lines.read(time.monotonic() + START_TIMEOUT) != {"ready": True}:
            self._log.seek(0)
            log = self._log.read().decode(errors="replace").strip()[-2000:]
            self.close()
            raise SandboxUnavailable(f"sandbox worker {index} did not start: {log}")

    def run(self, code: str, limits: Limits) -> dict | None:
        request = {**limits.request(), "code": code, "uid": self.uid, "tmp_root": self.tmp_root}
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        return self._lines.read(time.monotonic() + limits.timeout + ANSWER_MARGIN)

    def close(self) -> None:
        if self.proc.poll() is None:
            # bwrap's session: the sandbox's pid 1 and everything under it.
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self._log):
            try:
                stream.close()
            except OSError:  # a request still buffered for a server that died: nothing to deliver
                pass


def _result(reply: dict | None) -> ExecResult:
    if reply is None:
        return ExecResult("killed", None, "", "", 0.0, message="the sandbox worker died or stopped answering")
    if "server_error" in reply:
        return ExecResult("error", None, "", "", 0.0, message=f"sandbox fault: {reply['server_error']}")
    code = reply["exit_code"]
    fields = dict(exit_code=code, stdout=reply["stdout"], stderr=reply["stderr"], duration=reply["duration"],
                  truncated=reply["truncated"])
    if reply["timed_out"]:
        return ExecResult("timeout", **fields, message="wall-clock limit reached")
    if code in (-signal.SIGXCPU, -signal.SIGKILL) and reply["duration"] >= 0.9:
        # The CPU limit: SIGXCPU at the soft limit, SIGKILL at the hard one.
        return ExecResult("timeout", **fields, message="CPU time limit reached")
    if code < 0:
        return ExecResult("killed", **fields, message=f"killed by {signal.Signals(-code).name}")
    if reply["survivors"]:
        return ExecResult("killed", **fields,
                          message=f"{reply['survivors']} process(es) outlived the program and were killed")
    if code == EXIT_MEMORY:
        return ExecResult("memory", **fields, message="memory limit reached (MemoryError)")
    return ExecResult("ok" if code == 0 else "error", **fields)


class Sandbox:
    """Runs untrusted Python programs in a pool of ``workers`` warm sandboxes.

    ``backend="bwrap"`` (the default) isolates each program as described in
    :mod:`posttrain.sandbox.backends`; ``backend="rlimit"`` only limits resources and warns.
    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, workers: int | None = None, backend: Backend = "bwrap", tmp_mb: int = 64):
        if backend not in ("bwrap", "rlimit"):
            raise ValueError(f"sandbox backend must be 'bwrap' or 'rlimit', got {backend!r}")
        self.backend = backend
        self.size = workers or os.cpu_count() or 1
        self.tmp_mb = tmp_mb
        # A uid per worker, distinct from every host account, so RLIMIT_NPROC counts one run only.
        base = _UID_BASE + (os.getpid() % 100_000) * 64
        self._uids = [base + i for i in range(self.size)] if os.geteuid() == 0 else [None] * self.size
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._all: list[_Worker] = []
        self._lock = threading.Lock()
        self._started = 0
        self._closed = False
        # bwrap's --die-with-parent fires when the *thread* that started it ends, so every worker
        # is started from this one long-lived thread, whichever thread asked for it.
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="sandbox-spawner")

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _spawn(self, index: int) -> _Worker:
        worker = self._spawner.submit(_Worker, self.backend, index, self._uids[index], self.tmp_mb).result()
        with self._lock:
            self._all.append(worker)
        return worker

    def _take(self) -> _Worker:
        with self._lock:
            index = self._started if self._started < self.size and self._idle.empty() else None
            if index is not None:
                self._started += 1
        return self._spawn(index) if index is not None else self._idle.get()

    def start(self) -> "Sandbox":
        """Start every worker now rather than on first use."""
        workers = [self._take() for _ in range(self.size - self._started)]
        for w in workers:
            self._idle.put(w)
        return self

    def run(self, code: str, limits: Limits | None = None) -> ExecResult:
        """Run one program; never raises for anything the program does."""
        if self._closed:
            raise RuntimeError("the sandbox is closed")
        worker = self._take()
        reply = worker.run(code, limits or Limits())
        if reply is None or "server_error" in reply:
            worker = self._replace(worker)
        self._idle.put(worker)
        return _result(reply)

    def _replace(self, worker: _Worker) -> _Worker:
        worker.close()
        with self._lock:
            self._all.remove(worker)
        return self._spawn(worker.index)

    def run_many(self, codes: Sequence[str], limits: Limits | None = None) -> list[ExecResult]:
        """Run programs concurrently, one per worker at a time; results in input order."""
        with ThreadPoolExecutor(self.size) as pool:
            return list(pool.map(lambda c: self.run(c, limits), codes))

    def close(self) -> None:
        self._closed = True
        with self._lock:
            workers, self._all = self._all, []
        for w in workers:
            w.close()
        self._spawner.shutdown()


_SANDBOXES: dict[tuple[str, int], Sandbox] = {}
_SANDBOX_LOCK = threading.Lock()


def shared_sandbox(backend: str = "bwrap", workers: int = 0) -> Sandbox:
    """One warm pool per process, shared by every environment instance (one per episode)."""
    with _SANDBOX_LOCK:
        key = (backend, workers)
        if key not in _SANDBOXES:
            _SANDBOXES[key] = Sandbox(workers or None, backend=backend)
            atexit.register(_SANDBOXES[key].close)
        return _SANDBOXES[key]
