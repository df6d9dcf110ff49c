"""Question answering over a generated SQLite database, with a read-only SQL tool.

The database (a company's employees: name, department, city, salary, hiring year) is generated
from ``seed`` and written once to the cache directory. Each question comes with the SQL that
answers it; the reference answer is that query's result, so every answer is verifiable.
Train and eval splits are disjoint by question.
"""

from __future__ import annotations

import os
import random
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

from posttrain.envs.tool_env import ToolEnv
from posttrain.models.loading import cache_dir
from posttrain.rewards.verifiable import extract_final_number
from posttrain.rollout.tool_calls import CallFormat, FinalAnswer, ToolCall
from posttrain.tools import ToolRegistry, sql_tool
from posttrain.tools.sql import run_query
from posttrain.types import Task

SCHEMA = "employees(id INTEGER, name TEXT, department TEXT, city TEXT, salary INTEGER, hired_year INTEGER)"
_FIRST = ["Ada", "Ben", "Carla", "Dev", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Kira", "Liam", "Mei",
          "Nora", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tara", "Umar", "Vera", "Wen", "Yara", "Zane"]
_LAST = ["Adams", "Berg", "Costa", "Diaz", "Evans", "Fischer", "Garcia", "Hansen", "Ito", "Jensen", "Khan", "Lopez"]
_DEPARTMENTS = ["Sales", "Engineering", "Finance", "Support", "Marketing", "Legal"]
_CITIES = ["Lisbon", "Oslo", "Denver", "Osaka", "Nairobi", "Lima"]
_EXAMPLE = ("How many departments are there?", "SELECT COUNT(DISTINCT department) FROM employees")


def build_database(path: Path, seed: int, num_employees: int = 80) -> None:
    """Write the employees table to ``path`` (atomically: concurrent builders never see half a file)."""
    rng = random.Random(f"sqlqa-{seed}")
    names = rng.sample([f"{f} {l}" for f in _FIRST for l in _LAST], num_employees)
    salaries = rng.sample(range(3000, 12000, 10), num_employees)  # distinct, so "highest paid" is unique
    rows = [(i + 1, names[i], rng.choice(_DEPARTMENTS), rng.choice(_CITIES), salaries[i], rng.randint(2005, 2024))
            for i in range(num_employees)]
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".db")
    os.close(fd)
    with sqlite3.connect(tmp) as conn:
        conn.execute(f"CREATE TABLE {SCHEMA}")
        conn.executemany("INSERT INTO employees VALUES (?, ?, ?, ?, ?, ?)", rows)
    os.replace(tmp, path)


def _questions(db: Path, rng: random.Random) -> list[tuple[str, str]]:
    names = [r[0] for r in run_query(db, "SELECT name FROM employees", max_rows=10_000)]
    out = []
    for d in _DEPARTMENTS:
        out += [(f"How many employees work in the {d} department?",
                 f"SELECT COUNT(*) FROM employees WHERE department = '{d}'"),
                (f"What is the highest salary in the {d} department?",
                 f"SELECT MAX(salary) FROM employees WHERE department = '{d}'"),
                (f"What is the average salary in the {d} department, rounded to the nearest integer?",
                 f"SELECT CAST(ROUND(AVG(salary)) AS INTEGER) FROM employees WHERE department = '{d}'")]
    for c in _CITIES:
        out += [(f"What is the total salary of the employees in {c}?",
                 f"SELECT SUM(salary) FROM employees WHERE city = '{c}'"),
                (f"Who is the highest paid employee in {c}?",
                 f"SELECT name FROM employees WHERE city = '{c}' ORDER BY salary DESC LIMIT 1"),
                (f"How many employees in {c} were hired after 2015?",
                 f"SELECT COUNT(*) FROM employees WHERE city = '{c}' AND hired_year > 2015")]
    for n in names:
        out += [(f"In which city does {n} work?", f"SELECT city FROM employees WHERE name = '{n}'"),
                (f"Which department does {n} work in?", f"SELECT department FROM employees WHERE name = '{n}'"),
                (f"What is the salary of {n}?", f"SELECT salary FROM employees WHERE name = '{n}'")]
    for y in range(2006, 2024):
        out.append((f"How many employees were hired in {y}?", f"SELECT COUNT(*) FROM employees WHERE hired_year = {y}"))
    rng.shuffle(out)
    return out


def answers_match(given: str, expected: Any) -> bool:
    """Numbers compare by value (the last number in the answer); text case-insensitively."""
    if isinstance(expected, (int, float)):
        number = extract_final_number(given)
        return number is not None and number == expected
    return given.strip().strip(".").strip("'\"").strip().lower() == str(expected).lower()


class SQLQAEnv(ToolEnv):
    """Multi-turn: query the database with SQL, read the rows, answer the question."""

    def __init__(
        self,
        call_format: CallFormat = "react",
        examples: int = 1,
        max_tool_calls: int = 4,
        malformed_penalty: float = 0.0,
        num_eval: int = 60,
        seed: int = 0,
    ) -> None:
        self.db_path = cache_dir() / "data" / f"sqlqa-{seed}.db"
        if not self.db_path.exists():
            build_database(self.db_path, seed)
        worked = []
        if examples:
            answer = run_query(self.db_path, _EXAMPLE[1])[0][0]
            worked = [(_EXAMPLE[0], [ToolCall("sql", _EXAMPLE[1]), FinalAnswer(str(answer))])]
        super().__init__(ToolRegistry([sql_tool(self.db_path)]), call_format, max_tool_calls, malformed_penalty,
                         worked)
        questions = _questions(self.db_path, random.Random(f"sqlqa-questions-{seed}"))
        if not 0 < num_eval < len(questions):
            raise ValueError(f"env.kwargs.num_eval must be between 1 and {len(questions) - 1}, got {num_eval}")
        tasks = [Task(f"sqlqa-{seed}-{i}", q, run_query(self.db_path, sql)[0][0], {"sql": sql})
                 for i, (q, sql) in enumerate(questions)]
        self._splits = {"eval": tasks[:num_eval], "train": tasks[num_eval:]}

    def instructions(self) -> str:
        return f"{super().instructions()}\nThe SQLite database has one table: {SCHEMA}"

    def score(self, task: Task, action: str) -> tuple[float, dict[str, Any]]:
        correct = answers_match(action, task.answer)
        return float(correct), {"correct": correct}
