"""Chain arithmetic: a sum of several terms, solved one operation per line.

"Compute 12 + 7 - 5 one step at a time." A solution has one line per operation, the running
value first ("12 + 7 = 19", "19 - 5 = 14"), then "Answer: 14". Its steps are its lines, which is
what process rewards and process reward models score: :func:`check_steps` marks each line right
or wrong (a line is right when it and every line before it are: after a slip no later line is on
a path to the answer, Math-Shepherd's notion of a correct step), and the reward is 1 for the right
final answer. ``info["step_correct"]`` carries the marks, the ground truth that process reward
models are measured against. Train and eval splits are disjoint by expression.
"""

from __future__ import annotations

import random
import re
from typing import Any

from posttrain.envs.base import TextEnv, chat_space, message
from posttrain.rewards.verifiable import math_answer_score, parse_number
from posttrain.types import Task

# A step's numbers have at most 18 digits (int() refuses more than 4,300, and no task needs 19).
_LINE = re.compile(r"^\s*(-?\d{1,18})\s*([+\-])\s*(-?\d{1,18})\s*=\s*(-?\d{1,18})\s*(?:\.\s*)?$")
_ANSWER_LINE = re.compile(r"answer", re.IGNORECASE)
# Worked examples shown as earlier turns of the conversation, which a small model copies far more
# reliably than an instruction; their expressions are never drawn as tasks.
_EXAMPLES = [("5 + 3 - 2", "5 + 3 = 8\n8 - 2 = 6\nAnswer: 6"), ("4 + 9 + 6", "4 + 9 = 13\n13 + 6 = 19\nAnswer: 19")]

_EXAMPLE_EXPRESSIONS = {expr for expr, _ in _EXAMPLES}


def solution_lines(text: str) -> list[str]:
    """The steps of a solution: its non-empty lines, in order."""
    return [line for line in text.split("\n") if line.strip()]


def check_steps(terms: list[int], ops: list[str], text: str) -> list[bool]:
    """One mark per line of ``text``: True while every line so far is a right step.

    An operation line is right when it applies the next operation to the running value
    ("19 - 5 = 14" after "12 + 7 = 19"); the answer line is right when it gives the true value
    after all operations were done. Any other line (prose, a skipped or invented step) is wrong.
    """
    value, done, ok, marks = terms[0], 0, True, []
    for line in solution_lines(text):
        if ok and _ANSWER_LINE.search(line):
            number = re.findall(r"-?\d+", line)
            ok = done == len(ops) and bool(number) and parse_number(number[-1]) == value
        elif ok:
            m = _LINE.match(line)
            ok = bool(m) and done < len(ops)
            if ok:
                a, op, b, c = int(m[1]), m[2], int(m[3]), int(m[4])
                expected = value + b if op == "+" else value - b
                ok = a == value and op == ops[done] and b == terms[done + 1] and c == expected
                value, done = expected, done + 1
        marks.append(ok)
    return marks


def _question(expr: str) -> str:
    return f"Compute {expr} one step per line, then give the answer."


def example_messages(count: int) -> list[dict[str, str]]:
    """The first ``count`` worked examples as user/assistant turns."""
    return [m for expr, solution in _EXAMPLES[:count]
            for m in (message("user", _question(expr)), message("assistant", solution))]


class ChainArithmeticEnv(TextEnv):
    """Single-turn: sums of ``num_terms`` numbers up to ``max_number``, solved line by line."""

    def __init__(self, num_terms: int = 3, max_number: int = 10, examples: int = 2, num_train: int = 2000,
                 num_eval: int = 100, seed: int = 0) -> None:
        super().__init__()
        self.observation_space = chat_space()
        if not 0 <= examples <= len(_EXAMPLES):
            raise ValueError(f"env.kwargs.examples must be 0-{len(_EXAMPLES)}, got {examples!r}")
        self.examples = examples
        if not 2 <= num_terms <= 6:
            raise ValueError(f"env.kwargs.num_terms must be 2-6, got {num_terms!r}")
        if max_number < 2:
            raise ValueError(f"env.kwargs.max_number must be at least 2, got {max_number!r}")
        rng = random.Random(f"chain-{seed}-{num_terms}-{max_number}")
        seen: dict[str, Task] = {}
        for _ in range(20 * (num_train + num_eval)):
            if len(seen) == num_train + num_eval:
                break
            task = self._draw(rng, num_terms, max_number)
            if task.metadata["expression"] not in _EXAMPLE_EXPRESSIONS:
                seen.setdefault(task.id, task)
        tasks = list(seen.values())
        if len(tasks) <= num_eval:
            raise ValueError(f"only {len(tasks)} distinct problems; env.kwargs.num_eval ({num_eval}) must be smaller")
        self._splits = {"eval": tasks[:num_eval], "train": tasks[num_eval:]}

    @staticmethod
    def _draw(rng: random.Random, num_terms: int, max_number: int) -> Task:
        terms = [rng.randint(1, max_number) for _ in range(num_terms)]
        ops, value = [], terms[0]
        for b in terms[1:]:
            op = rng.choice("+-") if value - b >= 0 else "+"  # the running value never goes negative
            ops.append(op)
            value = value + b if op == "+" else value - b
        expr = " ".join([str(terms[0])] + [f"{op} {b}" for op, b in zip(ops, terms[1:])])
        prompt = _question(expr)
        return Task(f"chain-{expr.replace(' ', '')}", prompt, value, {"expression": expr, "terms": terms, "ops": ops})

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        prompt, info = super().reset(seed=seed, options=options)
        return tuple(example_messages(self.examples) + [message("user", prompt)]), info

    def step(self, action: str):
        _, reward, terminated, truncated, info = super().step(action)
        return (), reward, terminated, truncated, info

    def score(self, task: Task, action: str) -> tuple[float, dict[str, Any]]:
        reward, info = math_answer_score(action, task.answer)
        info["step_correct"] = check_steps(task.metadata["terms"], task.metadata["ops"], action)
        return reward, info
