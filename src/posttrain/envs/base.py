"""The environment contract: a gymnasium.Env whose observations and actions are text.

``reset(seed=None, options={"task": Task})`` starts an episode on that task (with no task it
draws one from the training split) and returns the first observation: the prompt.
``step(action_text)`` returns ``(observation, step_reward, terminated, truncated, info)``;
``info["correct"]`` says whether the episode was solved, when the environment knows.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any, Literal

import gymnasium as gym
from gymnasium.spaces import Dict, Text
from gymnasium.spaces import Sequence as SequenceSpace

from posttrain.types import Task

Split = Literal["train", "eval"]
# gymnasium's Text space defaults to alphanumerics only; agents and observations use all of
# printable ASCII. Model output outside it is still accepted by step() (it is never validated
# against the space, which would crash training on untrusted text).
CHARSET = string.printable
MAX_TEXT = 16384


def chat_space(max_length: int = MAX_TEXT) -> SequenceSpace:
    """The space of observations given as chat messages: a tuple of {"role", "content"} dicts."""
    return SequenceSpace(Dict({
        "role": Text(max_length=16, min_length=1, charset=string.ascii_lowercase),
        "content": Text(max_length=max_length, min_length=0, charset=CHARSET),
    }))


def message(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


def task_for_reset(env: gym.Env, options: dict[str, Any] | None) -> Task:
    """The task ``reset`` was given in ``options["task"]``, else one drawn from ``env.tasks("train")``
    with the env's ``np_random``; TypeError for anything that is not a Task."""
    task = (options or {}).get("task")
    if task is None:
        pool = env.tasks("train")
        task = pool[int(env.np_random.integers(len(pool)))]
    if not isinstance(task, Task):
        raise TypeError(f"options['task'] must be a posttrain.types.Task, got {type(task).__name__}")
    return task


class TextEnv(gym.Env):
    """Base class for posttrain's environments; user environments need not inherit from it.

    Subclasses implement :meth:`tasks` and :meth:`score`, and may override :meth:`step` for
    multi-turn episodes.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self) -> None:
        self.observation_space = Text(max_length=MAX_TEXT, min_length=0, charset=CHARSET)
        self.action_space = Text(max_length=MAX_TEXT, min_length=0, charset=CHARSET)
        self.task: Task | None = None

    def tasks(self, split: Split) -> Sequence[Task]:
        """Every task of ``split``; the train and eval splits never share a task.

        Subclasses either set ``self._splits`` ({"train": [...], "eval": [...]}) or override this.
        """
        splits: dict[str, Sequence[Task]] | None = getattr(self, "_splits", None)
        if splits is None:
            raise NotImplementedError(f"{type(self).__name__} sets no self._splits and does not override tasks()")
        if split not in splits:
            raise ValueError(f"unknown split {split!r}; expected 'train' or 'eval'")
        return splits[split]

    def score(self, task: Task, action: str) -> tuple[float, dict[str, Any]]:
        """Reward and info for a final answer ``action`` to ``task``."""
        raise NotImplementedError

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        task = self.task = task_for_reset(self, options)
        return task.prompt, {"task_id": task.id}

    def step(self, action: str):
        if self.task is None:
            raise RuntimeError("step() called before reset()")
        reward, info = self.score(self.task, str(action))
        return "", float(reward), True, False, info
