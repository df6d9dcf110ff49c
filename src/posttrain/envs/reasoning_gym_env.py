"""reasoning-gym (PyPI ``reasoning-gym``) as a task source: procedural datasets with verifiers.

``env: {id: reasoning_gym, kwargs: {dataset: basic_arithmetic, size: 1000, config: {...}}}`` poses
the items of any of its datasets, single-turn, and scores the answer with the dataset's own
``score_answer`` (a float in [0, 1]; 1 is correct). The held-out split is a second dataset drawn
with another seed, with every question that also occurs in the training split removed, so the
splits never share an item.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from typing import Any

from posttrain.envs.base import Split, TextEnv
from posttrain.envs.contract import EnvError
from posttrain.types import Task

INSTRUCTION = "\n\nThink briefly, then give only the final answer on the last line, after 'Answer:'."
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_ANSWER_LINE = re.compile(r"answer\s*(?:is)?\s*:\s*(.+)", re.IGNORECASE)


def extract_answer(text: str) -> str:
    """The final answer in a model's text: the last ``<answer>...</answer>``, else what follows the
    last "Answer:", else the last non-empty line."""
    tagged = _ANSWER_TAG.findall(text)
    if tagged:
        return tagged[-1].strip()
    marked = _ANSWER_LINE.findall(text)
    if marked:
        return marked[-1].strip().rstrip(".")
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


class ReasoningGymEnv(TextEnv):
    """One reasoning-gym dataset; ``size`` training items and ``eval_size`` held-out ones.

    ``config`` holds the dataset's own options (its difficulty ranges, for example), passed to
    ``reasoning_gym.create_dataset``.
    """

    def __init__(self, dataset: str, size: int = 1000, eval_size: int = 200, seed: int = 0,
                 config: dict[str, Any] | None = None):
        super().__init__()
        try:
            import reasoning_gym
            from reasoning_gym.factory import DATASETS
        except ImportError:
            raise EnvError("env reasoning_gym needs the reasoning-gym package: pip install reasoning-gym") from None
        if dataset not in DATASETS:
            hint = difflib.get_close_matches(dataset, DATASETS, n=3)
            raise EnvError(f"reasoning_gym has no dataset {dataset!r}"
                           + (f" (did you mean {', '.join(map(repr, hint))}?)" if hint else
                              f" (expected one of {len(DATASETS)}, e.g. basic_arithmetic, chain_sum, leg_counting)"))
        try:
            train = reasoning_gym.create_dataset(dataset, size=size, seed=seed, **(config or {}))
            held_out = reasoning_gym.create_dataset(dataset, size=eval_size, seed=seed + 1_000_003, **(config or {}))
        except (TypeError, ValueError, AssertionError) as e:
            raise EnvError(f"reasoning_gym dataset {dataset!r} with config {config or {}}: {e}") from None
        self.name = dataset
        self._entries: dict[str, tuple[Any, dict]] = {}
        seen = set()
        train_tasks = [self._task(train, "train", i, entry, seen) for i, entry in enumerate(train)]
        eval_tasks = [self._task(held_out, "eval", i, entry, None) for i, entry in enumerate(held_out)]
        self._splits: dict[str, Sequence[Task]] = {
            "train": train_tasks, "eval": [t for t in eval_tasks if t.prompt not in seen]}

    def _task(self, source, split: Split, index: int, entry: dict, seen: set | None) -> Task:
        task = Task(id=f"{self.name}-{split}-{index}", prompt=entry["question"].strip() + INSTRUCTION,
                    answer=str(entry["answer"]), metadata={"dataset": self.name})
        self._entries[task.id] = (source, entry)
        if seen is not None:
            seen.add(task.prompt)
        return task

    def score(self, task: Task, action: str) -> tuple[float, dict[str, Any]]:
        source, entry = self._entries[task.id]
        answer = extract_answer(action)
        try:
            reward = float(source.score_answer(answer, entry))
        except Exception:  # noqa: BLE001 - a verifier choking on untrusted text scores it 0
            reward = 0.0
        return reward, {"correct": reward >= 1.0, "parsed_answer": answer[:200]}
