"""The fork server that runs untrusted programs; started by the pool, inside the sandbox.

Standard library only, started with ``python -I``: it must not import posttrain or anything from
the caller's environment. It reads one JSON request per line on stdin and answers one JSON line
on stdout. Each request forks a child that

1. starts a new session (so it has no controlling terminal and its own process group),
2. sets its resource limits (address space, CPU seconds, processes, file size, no core dumps),
3. makes and enters a fresh private directory, and drops to the run's unprivileged uid when the
   server runs as root (RLIMIT_NPROC is per uid and root ignores it, so a fork bomb is only
   bounded under a uid of its own),
4. executes the program in a fresh ``__main__`` namespace: the modules imported below are already
   in memory, so a run costs a fork, not an interpreter start.

Cleanup depends on the mode (argv[1]). ``isolated``: the server is inside its own PID namespace
(bwrap's init is pid 1, the server pid 2), so after every run it SIGKILLs every other process in
the namespace with ``kill(-1)``; a double-forked, setsid'd grandchild dies there too, and a run
that leaves processes behind is reported as ``killed``. ``plain`` (the opt-in rlimit backend): no
namespace, so only the child's process group is killed, and a process that left it escapes.
"""

import builtins
import json
import os
import resource
import select
import shutil
import signal
import sys
import time
import traceback

# Pre-imported so that programs using them start instantly after fork.
# isort: off
import collections, functools, hashlib, heapq, itertools, math, random, re, string, typing  # noqa: E401,F401
# isort: on

EXIT_MEMORY = 86  # the child's exit code when the program raised MemoryError
READ_CHUNK = 65536


def _set_limits(req):
    mem = req["memory_bytes"]
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    cpu = max(1, int(req["cpu_seconds"] + 0.999))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_NPROC, (req["max_processes"], req["max_processes"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (req["max_file_bytes"], req["max_file_bytes"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _child(req, workdir, out_w, err_w):
    """Runs in the forked child; never returns."""
    try:
        os.setsid()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.closerange(3, 1 << 16)
        os.chdir(workdir)
        uid = req.get("uid")
        if uid is not None and os.geteuid() == 0:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        _set_limits(req)
        os.environ.clear()
        os.environ.update({"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"})
        sys.argv = ["main.py"]
        sys.stdin = open(0, closefd=False)
    except BaseException:
        traceback.print_exc()
        os._exit(125)
    code = 0
    try:
        exec(compile(req["code"], "main.py", "exec"), {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except MemoryError as e:
        _print_program_traceback(e)
        code = EXIT_MEMORY
    except BaseException as e:
        _print_program_traceback(e)
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    os._exit(code & 0xFF)


def _print_program_traceback(e):
    """The traceback from the program's frames on, without this server's frame."""
    traceback.print_exception(type(e), e, e.__traceback__.tb_next)


def _other_processes():
    """Live (non-zombie) processes in this PID namespace other than pid 1 and ourselves."""
    me, alive = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (1, me):
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in (b"Z", b"X"):
            alive.append(int(name))
    return alive


def _kill_all_others():
    """SIGKILL everything else in the namespace and wait until it is gone (or 2 s passed)."""
    deadline = time.monotonic() + 2.0
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if not _other_processes() or time.monotonic() > deadline:
            return
        time.sleep(0.001)


class _Capture:
    """The first ``limit`` bytes of a pipe; the rest is read and dropped so the writer never blocks."""

    def __init__(self, fd, limit):
        self.fd, self.limit, self.data, self.truncated = fd, limit, bytearray(), False

    def read(self):
        try:
            chunk = os.read(self.fd, READ_CHUNK)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        room = self.limit - len(self.data)
        self.data += chunk[:max(room, 0)]
        self.truncated |= len(chunk) > room
        return True

    def text(self):
        return self.data.decode("utf-8", "replace")


def run(req, isolated, counter):
    workdir = os.path.join(req["tmp_root"], f"run-{os.getpid()}-{counter}")
    os.mkdir(workdir, 0o700)
    uid = req.get("uid")
    if uid is not None and os.geteuid() == 0:
        os.chown(workdir, uid, uid)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(out_r)
        os.close(err_r)
        _child(req, workdir, out_w, err_w)
    os.close(out_w)
    os.close(err_w)
    pidfd = os.pidfd_open(pid)
    captures = {out_r: _Capture(out_r, req["max_output_bytes"]), err_r: _Capture(err_r, req["max_output_bytes"])}
    for fd in captures:
        os.set_blocking(fd, False)
    open_fds = set(captures)
    deadline = start + req["timeout"]
    timed_out = False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        ready, _, _ = select.select([pidfd, *open_fds], [], [], left)
        for fd in ready:
            if fd != pidfd and not captures[fd].read():
                open_fds.discard(fd)
        if pidfd in ready:
            break
    if timed_out:
        if isolated:
            _kill_all_others()
        else:
            _kill_group(pid)
    _, status = os.waitpid(pid, 0)
    duration = time.monotonic() - start
    survivors = 0
    if isolated:
        survivors = len(_other_processes())
        if survivors:
            _kill_all_others()
    else:
        _kill_group(pid)
    # Every writer is dead now (or, in plain mode, may have escaped): drain what is left.
    for fd in list(open_fds):
        while captures[fd].read() and select.select([fd], [], [], 0.05)[0]:
            pass
    for fd in (pidfd, out_r, err_r):
        os.close(fd)
    shutil.rmtree(workdir, ignore_errors=True)
    return {
        "timed_out": timed_out,
        "exit_code": os.waitstatus_to_exitcode(status),
        "survivors": survivors,
        "stdout": captures[out_r].text(),
        "stderr": captures[err_r].text(),
        "truncated": captures[out_r].truncated or captures[err_r].truncated,
        "duration": duration,
    }


def _kill_group(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def main():
    isolated = sys.argv[1] == "isolated"
    # Keep the protocol pipes away from fds 0 and 1, which the children overwrite.
    requests = os.fdopen(os.dup(0), "rb")
    answers = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    answers.write(b'{"ready": true}\n')
    answers.flush()
    counter = 0
    for line in requests:
        counter += 1
        try:
            reply = run(json.loads(line), isolated, counter)
        except Exception as e:  # a server fault is reported, and the pool replaces the worker
            reply = {"server_error": f"{type(e).__name__}: {e}"}
        answers.write(json.dumps(reply).encode() + b"\n")
        answers.flush()


if __name__ == "__main__":
    main()
