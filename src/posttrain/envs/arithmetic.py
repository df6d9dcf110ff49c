"""Arithmetic word problems with exact-match reward, generated from a seed.

Difficulty levels (``difficulty``):
    1. a + b, with 1 <= a, b <= 20
    2. a + b or a - b, with 1 <= a, b <= 100
    3. a + b, a - b or a x b (the product with a factor up to 12)
    4. two operations: a op b op c, numbers up to 50
    5. two operations, numbers up to 999

``difficulty`` may also be a list of levels, e.g. ``[1, 3, 5]``: a mixed-difficulty env with
``num_train`` and ``num_eval`` problems per level (the eval split interleaves the levels, so its
first N tasks cover them all). Every task records its level in ``metadata["difficulty"]``, which
the curriculum and the per-difficulty evaluation read.

Each problem is a plain question ("What is 7 + 12?") or, with ``word_problems=True``, phrased as
a short story. The train and eval splits are disjoint by problem (the expression), not only by
wording: an expression in the eval split never appears in training under any phrasing.
"""

from __future__ import annotations

import random
from itertools import zip_longest
from typing import Any

from posttrain.envs.base import TextEnv
from posttrain.rewards.verifiable import math_answer_score
from posttrain.types import Task

_WORD_TEMPLATES = {
    "+": [
        "{name} has {a} {item}. {pronoun} gets {b} more. How many {item} does {name} have now?",
        "A box holds {a} {item} and another holds {b}. How many {item} are there in total?",
    ],
    "-": [
        "{name} has {a} {item} and gives away {b}. How many {item} does {name} have left?",
        "There were {a} {item} on a shelf. {b} were sold. How many {item} are on the shelf now?",
    ],
    "*": [
        "{name} buys {a} bags with {b} {item} in each. How many {item} does {name} buy?",
        "A shelf has {a} rows of {b} {item}. How many {item} are on the shelf?",
    ],
}
_NAMES = [("Ana", "She"), ("Ben", "He"), ("Chen", "He"), ("Dina", "She"), ("Eli", "He"), ("Fatima", "She")]
_ITEMS = ["apples", "books", "coins", "pencils", "stickers", "marbles"]


def _render(numbers: list[int], ops: list[str]) -> str:
    """[7, 12], ['+'] -> '7 + 12'."""
    parts = [str(numbers[0])]
    for op, num in zip(ops, numbers[1:]):
        parts += [op, str(num)]
    return " ".join(parts)


def eval_expression(expr: str) -> int:
    """Integer value of 'a op b [op c]' with the usual precedence (* before + and -)."""
    tokens = expr.split()
    # Fold multiplications first, then additions/subtractions left to right.
    folded: list[str] = [tokens[0]]
    for op, num in zip(tokens[1::2], tokens[2::2]):
        if op == "*":
            folded[-1] = str(int(folded[-1]) * int(num))
        else:
            folded += [op, num]
    total = int(folded[0])
    for op, num in zip(folded[1::2], folded[2::2]):
        total = total + int(num) if op == "+" else total - int(num)
    return total


_EXHAUSTED = 10_000


def _draw(rng: random.Random, difficulty: int) -> tuple[list[int], list[str]]:
    if difficulty == 1:
        return [rng.randint(1, 20), rng.randint(1, 20)], ["+"]
    if difficulty == 2:
        op = rng.choice("+-")
        a, b = rng.randint(1, 100), rng.randint(1, 100)
        return ([max(a, b), min(a, b)] if op == "-" else [a, b]), [op]
    if difficulty == 3:
        op = rng.choice("+-*")
        if op == "*":
            return [rng.randint(2, 12), rng.randint(2, 20)], [op]
        a, b = rng.randint(1, 100), rng.randint(1, 100)
        return ([max(a, b), min(a, b)] if op == "-" else [a, b]), [op]
    top = 50 if difficulty == 4 else 999
    ops = [rng.choice("+-*"), rng.choice("+-")]
    nums = [rng.randint(1, top) for _ in range(3)]
    if ops[0] == "*":
        nums[1] = rng.randint(2, 12)
    return nums, ops


class ArithmeticEnv(TextEnv):
    """Single-turn arithmetic problems; reward 1 for the exact answer, else 0."""

    def __init__(
        self,
        difficulty: int | list[int] = 1,
        word_problems: bool = False,
        num_eval: int = 100,
        num_train: int = 5000,
        instruction: str = "",
        seed: int = 0,
    ) -> None:
        super().__init__()
        levels = list(difficulty) if isinstance(difficulty, (list, tuple)) else [difficulty]
        if not levels or any(level not in (1, 2, 3, 4, 5) for level in levels) or len(set(levels)) < len(levels):
            raise ValueError(f"env.kwargs.difficulty must be 1-5 or a list of distinct levels 1-5, got {difficulty!r}")
        if num_eval < 1 or num_train < 1:
            raise ValueError("env.kwargs.num_eval and num_train must be at least 1")
        self.difficulty = difficulty
        self.word_problems = word_problems
        self.instruction = instruction
        per_level = [self._generate(seed, level, num_train, num_eval) for level in levels]
        # Round-robin over levels, so that any prefix of a split mixes them.
        self._splits = {split: [t for group in zip_longest(*(s[split] for s in per_level)) for t in group if t]
                        for split in ("train", "eval")}

    def _generate(self, seed: int, level: int, num_train: int, num_eval: int) -> dict[str, list[Task]]:
        rng = random.Random(f"arithmetic-{seed}-{level}")
        seen: dict[str, tuple[list[int], list[str]]] = {}
        attempts = misses = 0
        # A level with fewer distinct problems than asked for (level 1 has 400) is exhausted long
        # before 50 draws per problem: stop after _EXHAUSTED draws in a row found nothing new (the
        # last unseen one of 400 is missed that long with probability e^-25), not 255,000 draws later.
        while (len(seen) < num_train + num_eval and attempts < 50 * (num_train + num_eval)
               and misses < _EXHAUSTED):
            attempts += 1
            nums, ops = _draw(rng, level)
            expr = _render(nums, ops)
            misses = misses + 1 if expr in seen else 0
            seen.setdefault(expr, (nums, ops))
        exprs = list(seen)
        if len(exprs) <= num_eval:
            raise ValueError(
                f"difficulty {level} has only {len(exprs)} distinct problems; "
                f"env.kwargs.num_eval ({num_eval}) must be smaller"
            )
        # Eval first, so the eval split stays the same whatever num_train is.
        tasks = [self._make_task(e, *seen[e], level, rng) for e in exprs]
        return {"eval": tasks[:num_eval], "train": tasks[num_eval : num_eval + num_train]}

    def _make_task(self, expr: str, nums: list[int], ops: list[str], level: int, rng: random.Random) -> Task:
        answer = eval_expression(expr)
        if self.word_problems and len(ops) == 1:
            name, pronoun = rng.choice(_NAMES)
            template = rng.choice(_WORD_TEMPLATES[ops[0]])
            question = template.format(a=nums[0], b=nums[1], name=name, pronoun=pronoun, item=rng.choice(_ITEMS))
        else:
            question = f"What is {expr}?"
        prompt = f"{question} {self.instruction}".strip()
        return Task(id=f"arith-{level}-{expr.replace(' ', '')}", prompt=prompt, answer=answer,
                    metadata={"expression": expr, "difficulty": level})

    def score(self, task: Task, action: str) -> tuple[float, dict[str, Any]]:
        return math_answer_score(action, task.answer)
