"""The environment contract, in one place: what posttrain needs from an env and what it reads back.

An environment is any ``gymnasium.Env`` whose observations and actions are text:

- ``reset(*, seed=None, options=None) -> (observation, info)``;
- ``step(action_text) -> (observation, reward, terminated, truncated, info)``;
- optionally ``tasks(split) -> Sequence[Task]`` for ``split`` in ``"train"`` and ``"eval"``: the
  episode then starts with ``reset(options={"task": task})``. Without it a task is a seed: the G
  samples of a group reset with the same seed, and training and held-out seeds are disjoint ranges
  (``env.train_seeds``, ``env.eval_seed_start``), so an unmodified gymnasium env trains as it is.

An observation is text, one chat message (``{"role", "content"}``) or a sequence of them. What
posttrain reads from ``info`` is :class:`StepInfo`; everything else is kept in the trajectory.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol, TypedDict, runtime_checkable

import gymnasium as gym
from gymnasium.spaces import Dict, Text
from gymnasium.spaces import Sequence as SequenceSpace

from posttrain.types import Task

Split = Literal["train", "eval"]

ErrorKind = Literal["reset", "step", "timeout", "bad_observation", "bad_return", "make_env", "too_long",
                   "worker_lost"]
"""Why an episode failed for a reason other than the agent's answer (``Trajectory.error_kind``):
the env raised in ``reset`` or ``step``, a call took longer than ``env.step_timeout``, it returned an
observation that is neither text nor chat messages, ``step`` did not return five values or its
reward was not a finite number, the episode's own instance could not be built (a constructor that
raises after the first), an observation did not fit in the context, or the env worker process
running it (``env.workers``) died."""


class EnvError(ValueError):
    """The configured environment cannot be found or built, or does not follow the contract above;
    the message says what is wrong and what was expected."""


class EnvWorkerLost(RuntimeError):
    """The env worker (a Ray actor, ``env.workers``) running the episode's env died or was replaced."""


class StepInfo(TypedDict, total=False):
    """The keys of ``info`` (from ``reset`` or ``step``) that posttrain reads; all optional.

    ``correct``: the episode was solved (success in metrics and evaluation; without it success is
    a return of at least ``env.success_reward``). ``is_success`` (gymnasium's robotics name) is read
    the same way. ``metrics``: numbers the env wants counted, summed over turns and trajectories and
    logged under their own names (the tool env reports ``tool_calls``, ``malformed_tool_calls`` and
    ``tool_errors`` this way). ``tools``: JSON schemas for the chat template's ``tools=``
    (``reset`` only).
    """

    correct: bool
    is_success: bool
    metrics: dict[str, float]
    tools: list[dict[str, Any]]


@runtime_checkable
class TextEnvironment(Protocol):
    """The shape of an environment posttrain trains; ``tasks`` is optional (see the module docstring)."""

    observation_space: gym.Space
    action_space: gym.Space

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]: ...

    def step(self, action: str) -> tuple[Any, float, bool, bool, dict]: ...


# ----------------------------------------------------------------------------- tasks


def seed_task(seed: int) -> Task:
    """A task that is only a seed: the episode starts with ``reset(seed=seed)``."""
    return Task(id=f"seed-{seed}", prompt="", metadata={"seed": seed})


def is_seed_task(task: Task) -> bool:
    return not task.prompt and "seed" in task.metadata


def has_tasks(env: gym.Env) -> bool:
    return callable(getattr(env.unwrapped, "tasks", None))


def env_tasks(env: gym.Env, split: Split, train_seeds: int, eval_seed_start: int, eval_seeds: int) -> list[Task]:
    """The tasks of ``split``: the env's own ``tasks(split)``, or disjoint seed ranges without it."""
    if not has_tasks(env):
        if split == "train":
            return [seed_task(s) for s in range(train_seeds)]
        return [seed_task(s) for s in range(eval_seed_start, eval_seed_start + eval_seeds)]
    try:
        tasks = env.unwrapped.tasks(split)
    except Exception as e:  # noqa: BLE001 - user code; the message names it
        raise EnvError(f"tasks({split!r}) raised {type(e).__name__}: {e}") from None
    if isinstance(tasks, (str, bytes)) or not isinstance(tasks, Sequence):
        raise EnvError(f"tasks({split!r}) returned a {type(tasks).__name__}; expected a list of "
                               "posttrain.types.Task")
    wrong = next((t for t in tasks if not isinstance(t, Task)), None)
    if wrong is not None:
        raise EnvError(f"tasks({split!r}) holds a {type(wrong).__name__} ({wrong!r:.60}); expected "
                               "posttrain.types.Task items")
    odd = next((t for t in tasks if not isinstance(t.id, str) or not isinstance(t.prompt, str)), None)
    if odd is not None:
        raise EnvError(f"tasks({split!r}) holds a Task whose id ({odd.id!r:.40}) or prompt ({odd.prompt!r:.40}) is "
                       "not a str")
    return list(tasks)


def reset_episode(env: gym.Env, task: Task):
    """Start an episode of ``task``: by its seed for a seed task, else with ``options={"task": task}``."""
    if is_seed_task(task):
        return env.reset(seed=int(task.metadata["seed"]))
    return env.reset(options={"task": task})


# ----------------------------------------------------------------------------- observations and info


def as_messages(observation: Any) -> list[dict[str, Any]]:
    """An observation as chat messages: text is a user message; messages pass through.

    Raises :class:`EnvError` for anything else (a number, ``{"foo": 1}``, ``[1, 2]``).
    """
    if isinstance(observation, str):
        return [{"role": "user", "content": observation}]
    items = [observation] if isinstance(observation, Mapping) else observation
    if isinstance(items, (list, tuple)):
        for m in items:
            if not (isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise EnvError(f"observation {observation!r:.80} is neither text nor chat messages "
                                       "({'role': str, 'content': str})")
        return [dict(m) for m in items]
    raise EnvError(f"observation of type {type(observation).__name__} is neither text nor chat messages")


def observation_text(observation: Any) -> str:
    """What the environment said, as plain text (for logs and :class:`posttrain.types.Step`)."""
    if isinstance(observation, str):
        return observation
    return "\n".join(m["content"] for m in as_messages(observation))


def success(info: Mapping[str, Any]) -> bool | None:
    """The env's own verdict on the episode from one step's info, or None when it gives none."""
    for key in ("correct", "is_success"):
        if key in info:
            return bool(info[key])
    return None


def step_metrics(info: Mapping[str, Any]) -> dict[str, float]:
    """The env-specific counters of one step (``info["metrics"]``), numbers only."""
    raw = info.get("metrics")
    if not isinstance(raw, Mapping):
        return {}
    return {str(k): float(v) for k, v in raw.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


# ----------------------------------------------------------------------------- checks at make time


def _is_text_space(space: gym.Space) -> bool:
    if isinstance(space, Text):
        return True
    # chat messages: a Sequence of Dict({"role": Text, "content": Text})
    return (isinstance(space, SequenceSpace) and isinstance(space.feature_space, Dict)
            and isinstance(space.feature_space.spaces.get("content"), Text))


def check_text_env(env: gym.Env, env_id: str) -> None:
    """Raise :class:`EnvError` naming what is wrong when ``env`` cannot be trained as a text env."""
    if not isinstance(env, gym.Env):
        raise EnvError(f"env {env_id!r} built a {type(env).__name__}, expected a gymnasium.Env")
    for name in ("observation_space", "action_space"):
        space = getattr(env, name, None)
        if space is None or not _is_text_space(space):
            raise EnvError(f"env {env_id!r}: its {name} is {space!r}; posttrain trains text environments "
                                   "(gymnasium.spaces.Text, or a Sequence of chat-message Dicts)")
    reset_params = inspect.signature(env.unwrapped.reset).parameters
    missing = [p for p in ("seed", "options") if p not in reset_params
               and not any(q.kind is inspect.Parameter.VAR_KEYWORD for q in reset_params.values())]
    if missing:
        raise EnvError(f"env {env_id!r}: reset() takes no {' or '.join(missing)} keyword; expected "
                               "reset(*, seed=None, options=None) as in gymnasium.Env")
    step_params = [p for p in inspect.signature(env.unwrapped.step).parameters.values()
                   if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(step_params) != 1 and not any(p.kind is p.VAR_POSITIONAL
                                         for p in inspect.signature(env.unwrapped.step).parameters.values()):
        raise EnvError(f"env {env_id!r}: step() takes {len(step_params)} positional arguments; expected "
                               "step(action) with the action text")
