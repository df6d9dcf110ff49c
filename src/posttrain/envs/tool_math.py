"""Arithmetic too hard to do in one's head, solved with a calculator tool over several turns.

Difficulty levels (``difficulty``):
    1. a x b, two-digit factors
    2. a x b + c or a x b - c, with a, b two-digit and c up to 999
    3. a x b x c, two-digit factors

With ``word_problems=True`` the question is a short story (difficulty 1 and 2), so the agent must
also find the expression to compute. The agent calls ``calculator`` (ReAct text or JSON function
calls) and then gives the final answer; reward 1 for the right number (exact, or math-verify for
LaTeX and fractions; see rewards.verifiable). Train and eval splits are disjoint by expression.
"""

from __future__ import annotations

import random
from typing import Any

from posttrain.envs.tool_env import ToolEnv
from posttrain.rewards.verifiable import math_answer_score
from posttrain.rollout.tool_calls import CallFormat, FinalAnswer, ToolCall
from posttrain.tools import ToolRegistry, calculator
from posttrain.tools.calculator import evaluate_expression
from posttrain.types import Task

# Worked examples shown before the question (their numbers never occur in any split: 10 is
# outside the two-digit range the generator draws from).
_EXAMPLES = [("What is 10 * 73?", "10 * 73"), ("What is 10 * 58 + 117?", "10 * 58 + 117")]
_WORD_EXAMPLES = [
    ("A farm has 10 fields with 73 trees in each. How many trees are there?", "10 * 73"),
    ("A shop gets 10 boxes of 58 cups, and 117 loose cups. How many cups does it get?", "10 * 58 + 117"),
]
_STORIES = {
    "": "A library has {a} shelves with {b} books on each. How many books does it have?",
    "+": "A school orders {a} packs of {b} pencils, and {c} single pencils. How many pencils does it order?",
    "-": "A baker makes {a} trays of {b} rolls and sells {c} of them. How many rolls are left?",
}


def _question(expr: str, word_problems: bool) -> str:
    if not word_problems:
        return f"What is {expr}?"
    numbers = expr.split()[::2]
    op = expr.split()[3] if len(numbers) == 3 else ""
    return _STORIES[op].format(a=numbers[0], b=numbers[1], c=numbers[2] if op else "")


def _expression(rng: random.Random, difficulty: int) -> str:
    a, b = rng.randint(11, 99), rng.randint(11, 99)
    if difficulty == 1:
        return f"{a} * {b}"
    if difficulty == 2:
        op = rng.choice("+-")
        return f"{a} * {b} {op} {rng.randint(100, 999 if op == '+' else min(999, a * b - 1))}"  # never negative
    return f"{a} * {b} * {rng.randint(11, 99)}"


class ToolMathEnv(ToolEnv):
    """Multi-turn: call the calculator, read the observation, answer."""

    def __init__(
        self,
        difficulty: int = 1,
        word_problems: bool = False,
        call_format: CallFormat = "react",
        examples: int = 2,
        max_tool_calls: int = 3,
        malformed_penalty: float = 0.0,
        num_train: int = 2000,
        num_eval: int = 100,
        seed: int = 0,
    ) -> None:
        if difficulty not in (1, 2, 3):
            raise ValueError(f"env.kwargs.difficulty must be 1, 2 or 3, got {difficulty!r}")
        if word_problems and difficulty == 3:
            raise ValueError("env.kwargs.word_problems is available for difficulty 1 and 2")
        if not 0 <= examples <= len(_EXAMPLES):
            raise ValueError(f"env.kwargs.examples must be 0-{len(_EXAMPLES)}, got {examples!r}")
        worked = [(q, [ToolCall("calculator", e), FinalAnswer(str(evaluate_expression(e)))])
                  for q, e in (_WORD_EXAMPLES if word_problems else _EXAMPLES)[:examples]]
        super().__init__(ToolRegistry([calculator]), call_format, max_tool_calls, malformed_penalty, worked)
        rng = random.Random(f"tool-math-{seed}-{difficulty}")
        exprs: dict[str, None] = {}
        for _ in range(20 * (num_train + num_eval)):
            if len(exprs) == num_train + num_eval:
                break
            exprs.setdefault(_expression(rng, difficulty))
        tasks = [Task(f"toolmath-{difficulty}-{e.replace(' ', '')}", _question(e, word_problems),
                      int(evaluate_expression(e)), {"expression": e, "difficulty": difficulty}) for e in exprs]
        self._splits = {"eval": tasks[:num_eval], "train": tasks[num_eval:]}

    def score(self, task: Task, action: str) -> tuple[float, dict[str, Any]]:
        return math_answer_score(action, task.answer)
