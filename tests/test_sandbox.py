"""The sandbox contains hostile programs: each attempt fails, the host is unchanged, nothing survives.

These tests need bubblewrap; without it they fail (never skip), since they are the evidence that
untrusted model code is contained.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from posttrain.sandbox import Limits, Sandbox

ROOT = Path(__file__).resolve().parents[1]
MARKER = f"posttrain-escape-{uuid.uuid4().hex}"
SECRET = f"secret-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def sandbox():
    os.environ["POSTTRAIN_TEST_SECRET"] = SECRET  # inherited by the workers' bwrap, unless cleared
    with Sandbox(workers=2).start() as sb:
        yield sb
    del os.environ["POSTTRAIN_TEST_SECRET"]


def host_processes(sandbox):
    """Host pids that are still alive and either carry MARKER or run under a sandbox uid."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        state = next(line.split()[1] for line in status.splitlines() if line.startswith("State:"))
        uid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:")))
        if state != "Z" and (MARKER in cmdline or uid in sandbox._uids):
            found.append((pid, cmdline))
    return found


def contained(sandbox, code, **limits):
    """Run ``code``; assert that it failed, that no process of it survives, and that the pool still works."""
    result = sandbox.run(textwrap.dedent(code), Limits(**{"timeout": 5.0, **limits}))
    assert result.status != "ok", result
    assert host_processes(sandbox) == []
    assert sandbox.run("print('alive')").stdout == "alive\n"
    return result


def test_socket_connect_to_host_loopback_is_refused(sandbox):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    result = contained(sandbox, f"""
        import socket
        socket.create_connection(("127.0.0.1", {port}), timeout=2).sendall(b"{MARKER}")
    """)
    assert "ConnectionRefusedError" in result.stderr or "OSError" in result.stderr
    listener.settimeout(0.5)
    with pytest.raises(socket.timeout):
        listener.accept()
    listener.close()


@pytest.mark.parametrize("target", ["tmp", "repo", "etc", "home"])
def test_writes_outside_the_private_temp_dir_fail(sandbox, tmp_path, target):
    path = {"tmp": tmp_path, "repo": ROOT, "etc": Path("/etc"), "home": Path.home()}[target] / f"{MARKER}.txt"
    result = contained(sandbox, f"open({str(path)!r}, 'w').write('escaped')")
    assert "Error" in result.stderr
    assert not path.exists()


def test_the_private_temp_dir_is_writable_and_fresh_each_run(sandbox):
    code = "import os; print(sorted(os.listdir('.'))); open('f.txt', 'w').write('x'); print(os.getcwd())"
    first, second = sandbox.run(code), sandbox.run(code)
    assert first.ok and second.ok
    assert first.stdout.startswith("[]") and second.stdout.startswith("[]")


def test_fork_bomb_is_bounded_and_killed(sandbox):
    result = contained(sandbox, """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """, timeout=2.0)
    assert result.status == "timeout"


def test_memory_bomb_stops_at_the_limit(sandbox):
    result = contained(sandbox, """
        chunks = []
        while True:
            chunks.append(bytearray(10 ** 7))
    """, memory_mb=256)
    assert result.status == "memory"


def test_infinite_loop_times_out(sandbox):
    result = contained(sandbox, "while True: pass", timeout=1.0)
    assert result.status == "timeout" and 0.9 < result.duration < 3.0


def test_sleeping_past_the_wall_limit_times_out(sandbox):
    result = contained(sandbox, "import time; time.sleep(60)", timeout=1.0)
    assert result.status == "timeout"


def test_setsid_double_forked_grandchild_does_not_outlive_the_run(sandbox):
    result = contained(sandbox, f"""
        import os, sys, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)  # {MARKER}"])
            os._exit(0)
        os.wait()
        time.sleep(0.5)  # the grandchild has exec'd and carries the marker by now
        print("parent done")
    """)
    assert result.status == "killed" and "outlived" in result.message
    assert result.stdout == "parent done\n"


def test_parent_environment_is_invisible(sandbox):
    result = contained(sandbox, f"""
        import os, sys
        seen = repr(dict(os.environ))
        for pid in os.listdir("/proc"):
            try:
                seen += open(f"/proc/{{pid}}/environ", "rb").read().decode(errors="replace")
            except OSError:
                pass
        sys.exit(0 if {SECRET!r} in seen else 1)
    """)
    assert result.exit_code == 1
    assert SECRET not in result.stdout + result.stderr


def test_signals_to_the_parent_fail(sandbox):
    before = [w.proc.pid for w in sandbox._all]
    result = contained(sandbox, f"""
        import os, signal
        for target in (os.getppid(), 1, {os.getpid()}):
            try:
                os.kill(target, signal.SIGKILL)
            except OSError:
                pass
        os.kill(os.getppid(), signal.SIGKILL)
    """)
    assert "PermissionError" in result.stderr
    assert [w.proc.pid for w in sandbox._all] == before and all(w.proc.poll() is None for w in sandbox._all)


def test_results_report_status_exit_code_and_output(sandbox):
    ok = sandbox.run("import sys; print('out'); print('err', file=sys.stderr)")
    assert (ok.status, ok.exit_code, ok.stdout, ok.stderr) == ("ok", 0, "out\n", "err\n")
    assert ok.duration > 0
    error = sandbox.run("raise ValueError('boom')")
    assert error.status == "error" and error.exit_code == 1 and "ValueError: boom" in error.stderr
    assert sandbox.run("import sys; sys.exit(3)").exit_code == 3
    assert sandbox.run("syntax error here").status == "error"
    killed = sandbox.run("import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    assert killed.status == "killed" and killed.exit_code == -signal.SIGTERM


def test_output_is_truncated_to_the_limit(sandbox):
    result = sandbox.run("print('x' * 100000)", Limits(max_output_bytes=1000))
    assert result.ok and result.truncated and len(result.stdout) == 1000


def test_cpu_and_file_size_limits(sandbox):
    cpu = sandbox.run("while True: pass", Limits(timeout=5.0, cpu_seconds=1))
    assert cpu.status == "timeout" and cpu.duration < 4.0
    big = sandbox.run("open('big', 'wb').write(b'x' * (3 << 20))", Limits(max_file_mb=1))
    # Python ignores SIGXFSZ, so the write fails with EFBIG instead of killing the program.
    assert big.status == "error" and "File too large" in big.stderr


def test_a_dead_worker_is_replaced(sandbox):
    victim = sandbox._all[0]
    os.killpg(victim.proc.pid, signal.SIGKILL)
    results = [sandbox.run("print(1)") for _ in range(4)]
    assert all(r.ok for r in results[1:]) and results[0].status in ("ok", "killed")
    assert victim not in sandbox._all and len(sandbox._all) == 2


def test_rlimit_backend_is_an_opt_in_that_warns():
    with pytest.warns(RuntimeWarning, match="isolates much less"):
        with Sandbox(workers=1, backend="rlimit") as sb:
            assert sb.run("print(6 * 7)").stdout == "42\n"
            assert sb.run("while True: pass", Limits(timeout=0.5)).status == "timeout"


def test_cli_sandbox_exec_json(tmp_path):
    program = tmp_path / "prog.py"
    program.write_text("print('hello from the sandbox')\nraise SystemExit(4)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-m", "posttrain.cli", "sandbox", "exec", str(program), "--json",
                           "--timeout", "5", "--memory", "256"], capture_output=True, text=True, env=env)
    result = json.loads(proc.stdout)
    assert proc.returncode == 1
    assert result["status"] == "error" and result["exit_code"] == 4
    assert result["stdout"] == "hello from the sandbox\n"
    missing = subprocess.run([sys.executable, "-m", "posttrain.cli", "sandbox", "exec", str(tmp_path / "nope.py")],
                             capture_output=True, text=True, env=env)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr and "nope.py" in missing.stderr


def test_workers_started_by_short_lived_threads_survive_them():
    """bwrap's --die-with-parent is per thread: workers must outlive the thread that needed them."""
    import threading

    with Sandbox(workers=2) as sb:
        results = {}
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, sb.run(f"print({i})"))) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [results[i].stdout for i in range(8)] == [f"{i}\n" for i in range(8)]
