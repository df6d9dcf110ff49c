"""reasoning-gym (PyPI ``reasoning-gym``) as a task source: procedural datasets with verifiers.

``env: {id: reasoning_gym, kwargs: {dataset: basic_arithmetic, size: 1000, config: {...}}}`` poses
the items of any of its datasets, single-turn, and scores the answer with the dataset's own
``score_answer`` (a float in [0, 1]; 1 is correct) on the answer the text gives (see
:func:`extract_answer`; when the dataset's answers are numbers, a sentence's final number). The held-out split is a second dataset drawn
with another seed, with every question that also occurs in the training split removed, so the
splits never share an item.

Some of those verifiers read the answer with ``eval`` or SymPy's ``parse_expr`` (``countdown``,
``puzzle24``), so the answer is scored in a sandboxed child process (:mod:`posttrain.rewards.isolated`):
there ``__import__('os').system(...)`` meets a read-only filesystem without network, and an answer whose
check never ends scores 0 when the child's time is up.
"""

from __future__ import annotations

import base64
import difflib
import functools
import json
import pickle
import re
from collections.abc import Sequence
from typing import Any

from posttrain.envs.base import Split, TextEnv
from posttrain.envs.contract import EnvError
from posttrain.rewards import isolated
from posttrain.rewards.verifiable import extract_final_number, parse_number
from posttrain.sandbox import SandboxUnavailable
from posttrain.types import Task

INSTRUCTION = "\n\nThink briefly, then give only the final answer on the last line, after 'Answer:'."
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_CLOSING_TAG = re.compile(r"</answer>", re.IGNORECASE)
_ANSWER_LINE = re.compile(r"answer(?:\s*is)?\s*:\s*(.+)", re.IGNORECASE)  # one \s* between words: see verifiable


def extract_answer(text: str) -> str:
    """The final answer in a model's text: the last ``<answer>...</answer>``, else what follows the
    last "Answer:", else the last non-empty line."""
    # Searched up to the last closing tag only: from each opening tag with no closing one after it, the lazy
    # match would read to the end of the text (quadratic in a reply of many opening tags).
    closings = [match.end() for match in _CLOSING_TAG.finditer(text)]
    tagged = _ANSWER_TAG.findall(text, 0, closings[-1]) if closings else []
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
    ``reasoning_gym.create_dataset``. ``backend``: where the verifier reads answers, ``"bwrap"`` (the
    sandbox) or ``"rlimit"`` (a plain child process: time and memory limits only, for machines where
    bubblewrap cannot run).
    """

    def __init__(self, dataset: str, size: int = 1000, eval_size: int = 200, seed: int = 0,
                 config: dict[str, Any] | None = None, backend: str = "bwrap"):
        super().__init__()
        if backend not in ("bwrap", "rlimit"):
            raise EnvError(f"reasoning_gym backend must be 'bwrap' or 'rlimit', got {backend!r}")
        self.backend = backend
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
        self.name, self.config = dataset, config or {}
        self._entries: dict[str, tuple[tuple[int, int], dict]] = {}
        seen = set()
        train_tasks = [self._task((seed, size), "train", i, entry, seen) for i, entry in enumerate(train)]
        eval_tasks = [self._task((seed + 1_000_003, eval_size), "eval", i, entry, None)
                      for i, entry in enumerate(held_out)]
        self._splits: dict[str, Sequence[Task]] = {
            "train": train_tasks, "eval": [t for t in eval_tasks if t.prompt not in seen]}

    def _task(self, source: tuple[int, int], split: Split, index: int, entry: dict, seen: set | None) -> Task:
        task = Task(id=f"{self.name}-{split}-{index}", prompt=entry["question"].strip() + INSTRUCTION,
                    answer=str(entry["answer"]), metadata={"dataset": self.name})
        self._entries[task.id] = (source, entry)
        if seen is not None:
            seen.add(task.prompt)
        return task

    def score(self, task: Task, action: str) -> tuple[float, dict[str, Any]]:
        source, entry = self._entries[task.id]
        answer = extract_answer(action)
        # A numeric answer given in a sentence ("the answer to the problem is 12."): its final number.
        if parse_number(str(entry["answer"])) is not None and parse_number(answer) is None:
            number = extract_final_number(action)
            if number is not None:
                answer = str(number) if number.denominator != 1 else str(number.numerator)
        seed, size = source
        info: dict[str, Any] = {"parsed_answer": answer[:200]}
        try:
            reward = isolated.call(f"{__name__}:score_in_child", self.name, seed, size, self.config,
                                   base64.b64encode(pickle.dumps(entry)).decode(), answer,
                                   sandboxed=self.backend == "bwrap")
        except isolated.NoVerdict:  # a wrong answer, counted
            reward, info["metrics"] = 0.0, {"unverified_answers": 1.0}
        except (SandboxUnavailable, isolated.CannotStart) as e:
            if self.backend != "bwrap":
                raise
            raise RuntimeError(f"the sandbox of reasoning_gym's verifier: {e}; backend: rlimit in the env's kwargs "
                               "runs it without bubblewrap (time and memory limits, no filesystem isolation)") from None
        return reward, {"correct": reward >= 1.0, **info}


@functools.lru_cache(maxsize=8)
def _dataset(name: str, seed: int, size: int, config_json: str):
    import reasoning_gym

    return reasoning_gym.create_dataset(name, size=size, seed=seed, **json.loads(config_json))


def score_in_child(name: str, seed: int, size: int, config: dict, entry: str, answer: str) -> float:
    """The dataset's own ``score_answer`` on ``answer``, in :mod:`posttrain.rewards.isolated`'s child: the
    dataset is built there as the env built it, the entry comes pickled from the env (as it was generated).
    A verifier choking on untrusted text scores it 0."""
    dataset = _dataset(name, seed, size, json.dumps(config, sort_keys=True))
    try:
        return float(dataset.score_answer(answer, pickle.loads(base64.b64decode(entry))))
    except Exception:  # noqa: BLE001
        return 0.0
