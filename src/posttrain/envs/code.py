"""The code environment: write a function, run its unit tests in the sandbox, reward = share passed.

A task (see :mod:`posttrain.envs.code_tasks`) has a prompt, an entry point and tests. The agent's
answer is reduced to code (:func:`extract_code`: fenced blocks, an unclosed fence, or bare code),
appended to the task's header, and run with every test in one sandboxed program; each test runs on
its own with its own time limit, so a partial solution earns partial credit, as in the
functional-correctness evaluation of Chen et al. (2021).

With ``max_attempts`` > 1 the episode is multi-turn: after a failing attempt the agent sees the
failing tests and their messages and may revise. Each attempt's step reward is its progress (its
pass fraction minus the previous attempt's), so the episode's return, the sum of its step
rewards, is the pass fraction of the last attempt, wherever the episode stops. Set
``rollout.max_turns`` to ``max_attempts`` to allow every attempt.

Untrusted output never crashes training: anything the program does becomes a failed test.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from posttrain.envs.base import TextEnv
from posttrain.envs.code_tasks import load_code_tasks
from posttrain.sandbox import Limits, Sandbox, shared_sandbox
from posttrain.types import Task

_FENCE = "```"
_LANGUAGE = re.compile(r"[ \t]*([\w+-]*)")
_PYTHON = ("python", "py", "python3", "")
_CODE_START = re.compile(r"^(def |class |import |from |@)")
_MAX_FEEDBACK = 5


def extract_code(text: str, entry_point: str | None = None) -> str:
    """The code in a model's answer.

    Fenced blocks (a missing closing fence runs to the end): the last Python block that defines
    ``entry_point``, else all Python blocks joined. No fence: from the first line that starts
    code (def, class, import, from, a decorator), the longest run of lines that parses (trailing
    prose dropped); if nothing looks like code, the text itself (e.g. a bare function body).
    """
    blocks = [body for lang, body in _fenced_blocks(text) if lang.lower() in _PYTHON]
    if blocks:
        if entry_point:
            defining = [b for b in blocks if re.search(rf"def\s+{re.escape(entry_point)}\s*\(", b)]
            if defining:
                return defining[-1]
        return "\n".join(blocks)
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _CODE_START.match(line)), None)
    if start is None:
        return text
    lines = lines[start:]
    return _longest_parsing_prefix(lines) or "\n".join(lines)


def _fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced block in order; an unclosed fence runs to the end.

    A scan with ``str.find`` rather than one regex: a regex tried from each of n fences that have
    no newline after them reads to the end of the text every time, quadratic in a hostile reply
    (40,000 backticks took 0.9 s)."""
    blocks = []
    opening = text.find(_FENCE)
    while opening != -1:
        newline = text.find("\n", opening)
        if newline == -1:  # no fence after this one has a newline either
            break
        language = _LANGUAGE.match(text, opening + len(_FENCE), newline).group(1)
        closing = text.find(_FENCE, newline + 1)
        blocks.append((language, text[newline + 1 : len(text) if closing == -1 else closing]))
        if closing == -1:
            break
        opening = text.find(_FENCE, closing + len(_FENCE))
    return blocks


def _longest_parsing_prefix(lines: list[str]) -> str | None:
    """The longest run of leading ``lines`` that compiles, or None.

    A prefix that holds the line a syntax error is reported on fails as well (the parser never read
    past that line, or the construct it opened stays open), so the next try ends before that line
    instead of one line shorter: a hostile reply of thousands of lines after an unclosed bracket is
    a few compiles, not one per line (8,000 list items took 37 s that way, holding the GIL).
    """
    end = next((i for i, line in enumerate(lines) if "\0" in line), len(lines))  # compile refuses NUL
    while end > 0:
        candidate = "\n".join(lines[:end])
        try:
            compile(candidate, "answer", "exec")
            return candidate
        except (SyntaxError, ValueError) as error:
            reported = getattr(error, "lineno", None)
            end = min(end - 1, reported - 1) if reported and reported > 0 else end - 1
    return None


def join_solution(header: str, code: str) -> str:
    """The program under test: the task's header, then the agent's code. An answer that is only an
    indented body completes the header's last function (HumanEval's completion format)."""
    if not header:
        return code
    first = next((line for line in code.splitlines() if line.strip()), "")
    header = header if header.endswith("\n") else header + "\n"
    return header + code if first[:1].isspace() else f"{header}\n{code}"


_HARNESS = '''
import json as _json, os as _os, signal as _signal, sys as _sys
_sys.stdout = _sys.stderr = open(_os.devnull, "w")  # the program's own prints cannot spoof reports


class _TestTimeout(BaseException):
    pass


def _alarm(*_):
    raise _TestTimeout()


def _report(index, passed, message):
    _os.write(1, ({mark!r} + _json.dumps([index, passed, message[:300]]) + "\\n").encode())


def _got(test, namespace):
    """For a failing `assert X == Y`: what X was."""
    import ast
    try:
        node = ast.parse(test).body
        if len(node) == 1 and isinstance(node[0], ast.Assert) and isinstance(node[0].test, ast.Compare):
            return " (got " + repr(eval(ast.unparse(node[0].test.left), namespace))[:100] + ")"
    except BaseException:
        pass
    return ""


def _plain_results(fn, _type=type, _id=id, _len=len, _TypeError=TypeError):
    """``fn`` whose return values must be plain data: an object of the solution's own class (one
    whose == is always true, whose __bool__ lies, ...) never reaches a test's comparison. Types
    are compared by identity, so a metaclass's __eq__ cannot fool the check either."""
    scalars = (int, float, complex, str, bytes, bool, _type(None))
    sequences = (list, tuple, set, frozenset)

    def check(value):
        stack, seen = [value], 0
        while stack:
            v = stack.pop()
            seen += 1
            t = _type(v)
            if any(t is s for s in scalars):
                continue
            if seen > 1000000:
                raise _TypeError("the returned value is too large to check")
            if any(t is s for s in sequences):
                stack.extend(v)
            elif t is dict:
                stack.extend(v.keys())
                stack.extend(v.values())
            else:
                raise _TypeError(f"the function returned a {{t.__name__}} object; expected plain data (numbers, "
                                 "strings, bytes, None, and lists, tuples, sets or dicts of them)")

    def called(*args, **kwargs):
        result = fn(*args, **kwargs)
        check(result)
        return result

    return called


_signal.signal(_signal.SIGALRM, _alarm)
import builtins as _builtins_module
_clean_builtins = dict(_builtins_module.__dict__)  # before the solution runs: it cannot rebind what tests use
_header_ns = {{"__name__": "solution", "__builtins__": dict(_clean_builtins)}}
_ns = {{"__name__": "solution"}}
_setup_error = None
try:
    _signal.setitimer(_signal.ITIMER_REAL, {per_test})
    exec(compile({header!r}, "header.py", "exec"), _header_ns)
    exec(compile({solution!r}, "solution.py", "exec"), _ns)
    _signal.setitimer(_signal.ITIMER_REAL, 0)
    if not callable(_ns.get({entry!r})):
        _setup_error = "no function named " + {entry!r}
except BaseException as _e:
    _signal.setitimer(_signal.ITIMER_REAL, 0)
    _setup_error = "the code did not run: " + type(_e).__name__ + ": " + str(_e)
for _i, _test in enumerate({tests!r}):
    if _setup_error:
        _report(_i, False, _setup_error)
        continue
    # Tests see the task's header and the checked entry point, not the solution's other names
    # (a solution defining its own `abs` or `isclose` must not change what the test computes).
    _g = dict(_header_ns, __builtins__=dict(_clean_builtins))
    _g[{entry!r}] = _g["candidate"] = _plain_results(_ns[{entry!r}])
    try:
        _signal.setitimer(_signal.ITIMER_REAL, {per_test})
        exec(compile(_test, "test", "exec"), _g)
        _signal.setitimer(_signal.ITIMER_REAL, 0)
        _report(_i, True, "")
    except BaseException as _e:
        _signal.setitimer(_signal.ITIMER_REAL, 0)
        _message = "timed out" if isinstance(_e, _TestTimeout) else type(_e).__name__ + (": " + str(_e) if str(_e) else "")
        if isinstance(_e, AssertionError):
            _signal.setitimer(_signal.ITIMER_REAL, {per_test})
            _message += _got(_test, _g)
            _signal.setitimer(_signal.ITIMER_REAL, 0)
        _report(_i, False, _message)
'''


@dataclass
class TestReport:
    """Per-test outcome of one solution."""

    passed: list[bool]
    messages: list[str]
    sandbox_status: str
    failures: list[tuple[str, str]] = field(default_factory=list)  # (test, message) of failing tests

    @property
    def fraction(self) -> float:
        return sum(self.passed) / max(len(self.passed), 1)


def run_tests(sandbox: Sandbox, solution: str, entry_point: str, tests: Sequence[str], limits: Limits,
              test_timeout: float, header: str = "") -> TestReport:
    """Run ``tests`` against ``solution`` in one sandboxed program; a test not reported failed.

    The tests run in a namespace built from ``header`` alone (the task's own code, run apart from
    the solution), with the entry point wrapped so that it may only return plain data."""
    mark = f"@@posttrain-{secrets.token_hex(8)}@@"
    program = _HARNESS.format(mark=mark, per_test=test_timeout, solution=solution, entry=entry_point,
                              tests=list(tests), header=header)
    result = sandbox.run(program, limits)
    passed, messages = [False] * len(tests), [f"not run: the program ended with status {result.status}"] * len(tests)
    for line in result.stdout.splitlines():
        if line.startswith(mark):
            try:
                index, ok, message = json.loads(line[len(mark):])
                passed[index], messages[index] = bool(ok), str(message)
            except (ValueError, TypeError, IndexError):
                continue
    failures = [(t, m) for t, ok, m in zip(tests, passed, messages) if not ok]
    return TestReport(passed, messages, result.status, failures)


@lru_cache(maxsize=8)
def _cached_tasks(source: str, seed: int, num_eval: int) -> dict[str, list[Task]]:
    return load_code_tasks(source, seed, num_eval)


class CodeEnv(TextEnv):
    """Write a Python function; reward = fraction of its unit tests passed in the sandbox.

    ``source``: "generated" (easy function-writing tasks), "humaneval" (eval split only) or a
    JSONL path. ``max_attempts``: attempts per episode (1: single-turn). ``timeout``: seconds for
    the whole test program (keep timeout x group size / workers under ``env.step_timeout``, since
    the programs of one step queue for the pool); ``test_timeout``: seconds per test; ``memory_mb``: address-space
    limit; ``workers``: sandbox pool size (0: one per CPU); ``backend``: "bwrap" or the opt-in
    "rlimit".
    """

    def __init__(self, source: str = "generated", max_attempts: int = 1, num_eval: int = 40, seed: int = 0,
                 timeout: float = 6.0, test_timeout: float = 2.0, memory_mb: int = 512, workers: int = 0,
                 backend: str = "bwrap") -> None:
        super().__init__()
        if max_attempts < 1:
            raise ValueError(f"env.kwargs.max_attempts must be at least 1, got {max_attempts}")
        self._splits = _cached_tasks(str(source), seed, num_eval)
        self.max_attempts = max_attempts
        self.test_timeout = test_timeout
        self.limits = Limits(timeout=timeout, memory_mb=memory_mb)
        self.sandbox = shared_sandbox(backend, workers)
        self.attempt = 0
        self.last_fraction = 0.0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.attempt, self.last_fraction = 0, 0.0
        return super().reset(seed=seed, options=options)

    def check(self, task: Task, action: str) -> TestReport:
        meta = task.metadata
        solution = join_solution(meta["header"], extract_code(action, meta["entry_point"]))
        return run_tests(self.sandbox, solution, meta["entry_point"], meta["tests"], self.limits, self.test_timeout,
                         meta["header"])

    def score(self, task: Task, action: str) -> tuple[float, dict[str, Any]]:
        report = self.check(task, action)
        return report.fraction, self._info(report)

    def _info(self, report: TestReport) -> dict[str, Any]:
        return {"correct": report.fraction == 1.0, "pass_fraction": report.fraction, "passed": sum(report.passed),
                "total": len(report.passed), "sandbox_status": report.sandbox_status}

    def step(self, action: str):
        if self.task is None:
            raise RuntimeError("step() called before reset()")
        report = self.check(self.task, str(action))
        self.attempt += 1
        progress, self.last_fraction = report.fraction - self.last_fraction, report.fraction
        info = {**self._info(report), "attempt": self.attempt, "progress": progress}
        if report.fraction == 1.0 or self.attempt >= self.max_attempts:
            return "", progress, True, False, info
        return self._feedback(report), progress, False, False, info

    def _feedback(self, report: TestReport) -> str:
        lines = [f"{test.strip().splitlines()[-1][:200]}  ->  {message}" for test, message in
                 report.failures[:_MAX_FEEDBACK]]
        return (f"Your function passed {sum(report.passed)} of {len(report.passed)} tests. Failing:\n"
                + "\n".join(lines) + "\nFix the function. Answer with the complete function in a ```python code block.")
