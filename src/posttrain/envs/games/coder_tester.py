"""Two cooperating agents: a tester writes unit tests, a coder writes the function.

Turns cycle tester, coder (for ``rounds`` rounds). The tester reads the specification and writes
``assert`` tests; the coder reads the specification and the tester's tests and writes the
function; the tester's tests then run against it in the sandbox and, when a round is left, both
see which of them fail and go again. The shared reward of both agents is the share of the task's
hidden reference tests that the coder's last function passes, run in the sandbox as in the
``code`` env; neither agent ever sees those tests. Tasks are the ``code`` env's (``source``).

A tester reply without a single ``assert`` line is an invalid move (penalty, and the coder is told
there are no tests); a coder reply is always run, and code that does not work scores 0.
"""

from __future__ import annotations

import re
from typing import Any

from posttrain.envs.code import TestReport, extract_code, join_solution, run_tests
from posttrain.envs.code_tasks import ANSWER_FORMAT, load_code_tasks
from posttrain.envs.games.base import TextGame
from posttrain.sandbox import Limits, shared_sandbox
from posttrain.types import Task

_ASSERT = re.compile(r"^[ \t]*(assert\b.+)$", re.M)  # not ^\s*: from each blank line it would run over all the others


class CoderTester(TextGame):
    """Agents ``tester`` and ``coder``; rewards are shared (a cooperative game)."""

    metadata = {**TextGame.metadata, "name": "coder_tester"}
    game = "coder_tester"
    possible_agents = ["tester", "coder"]
    fixed_players = False  # no random or scripted tester or coder

    def __init__(self, source: str = "generated", rounds: int = 1, max_tests: int = 5, num_eval: int = 40,
                 seed: int = 0, timeout: float = 6.0, test_timeout: float = 2.0, memory_mb: int = 512,
                 workers: int = 0, backend: str = "bwrap", invalid_penalty: float = 0.1, **kwargs):
        super().__init__(invalid_penalty=invalid_penalty, max_invalid=rounds + 1, **kwargs)
        if rounds < 1 or max_tests < 1:
            raise ValueError(f"rounds and max_tests must be at least 1, got {rounds} and {max_tests}")
        self._splits = load_code_tasks(str(source), seed, num_eval)
        self.rounds, self.max_tests = rounds, max_tests
        self.limits, self.test_timeout = Limits(timeout=timeout, memory_mb=memory_mb), test_timeout
        self.sandbox = shared_sandbox(backend, workers)
        self.task: Task | None = None

    def tasks(self, split: str) -> list[Task]:
        if split not in self._splits:
            raise ValueError(f"split must be one of {sorted(self._splits)}, got {split!r}")
        return list(self._splits[split])

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        task = (options or {}).get("task")
        self.task = task if isinstance(task, Task) else self._splits["train"][0]
        super().reset(seed=seed, options=options)

    def _start(self) -> None:
        self.round, self.tests, self.code = 0, [], ""
        spec = self.task.prompt.replace(ANSWER_FORMAT, "").strip()
        entry = self.task.metadata["entry_point"]
        self.tell("tester", f"You are the tester in a team of two. A coder will write this function:\n{spec}\n"
                  f"Write up to {self.max_tests} unit tests for it, one per line, each an assert statement that "
                  f"calls {entry}, for example: assert {entry}(...) == ...")
        self.tell("coder", f"You are the coder in a team of two. {self.task.prompt}")

    def state_text(self, agent: str) -> str:
        return ""

    def legal_hint(self, agent: str) -> str:
        return "write assert statements, one per line"

    def parse(self, agent: str, text: str) -> Any:
        if agent == "coder":
            return text
        tests = [t.strip() for t in _ASSERT.findall(text)][: self.max_tests]
        return tests or None

    def is_legal(self, agent: str, move: Any) -> bool:
        return True

    def pass_turn(self, agent: str) -> None:
        self.tests = []
        self.tell("coder", "The tester wrote no tests this round.")

    def _play(self, agent: str, move: Any) -> None:
        if agent == "tester":
            self.tests = move
            self.tell("coder", "The tester's tests:\n" + "\n".join(move)
                      + "\nWrite the function. Answer with the complete function in a ```python code block.")
            return
        self.round += 1
        entry = self.task.metadata["entry_point"]
        self.code = join_solution(self.task.metadata["header"], extract_code(move, entry))
        hidden = self._run(self.task.metadata["tests"])
        visible = self._run(self.tests) if self.tests else None
        for a in self.agents:
            self.infos[a].update(hidden_pass_fraction=hidden.fraction, tester_tests=len(self.tests),
                                 tester_tests_passed=sum(visible.passed) if visible else 0)
        if hidden.fraction == 1.0 or self.round >= self.rounds:
            self.finish({a: hidden.fraction for a in self.agents}, {a: None for a in self.agents})
            self.infos["coder"]["correct"] = self.infos["tester"]["correct"] = hidden.fraction == 1.0
            return
        report = _report(visible) if visible else "There were no tests to run."
        self.tell_all(f"Round {self.round}: the coder's function against the tester's tests: {report}")
        self.tell("tester", "Write new or better tests.")

    def _run(self, tests: list[str]) -> TestReport:
        return run_tests(self.sandbox, self.code, self.task.metadata["entry_point"], tests, self.limits,
                         self.test_timeout)

    def forfeit(self, agent: str) -> None:
        self.finish({a: 0.0 for a in self.agents}, {a: None for a in self.agents})


def _report(report: TestReport) -> str:
    lines = [f"{test}  ->  {message}" for test, message in report.failures[:5]]
    return f"{sum(report.passed)} of {len(report.passed)} pass." + ("\nFailing:\n" + "\n".join(lines) if lines else "")
