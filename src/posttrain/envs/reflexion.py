"""Reflexion (Shinn et al., 2023): after a failed attempt the agent reflects, then tries again.

Wraps any environment. An episode is up to ``max_attempts`` attempts at the same task. When an
attempt fails (``info["correct"]`` is false, or, for environments that do not say, its reward is
below ``success_reward``) and attempts remain, the agent is asked to reflect on what went wrong;
its reflection stays in the conversation and the task is posed again. In RL this trains both the
first attempt and the use of one's own feedback.

Rewards: the inner environment's step rewards pass through, except that a failed attempt's final
reward is replaced by 0 (kept in ``info["attempt_reward"]``), so the episode's return is that of
its last attempt plus any process rewards along the way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
from gymnasium.spaces import Text

from posttrain.envs.base import CHARSET, MAX_TEXT, Split, chat_space, message
from posttrain.types import Task

REFLECT = ("That attempt failed. In one or two sentences, reflect on what went wrong and what you will do "
           "differently next time. Do not answer yet.")
RETRY = "Keep your reflection in mind and try again."


def _as_messages(observation: Any) -> tuple[dict[str, str], ...]:
    if isinstance(observation, (list, tuple)):
        return tuple({"role": str(m["role"]), "content": str(m["content"])} for m in observation)
    if isinstance(observation, dict):
        return ({"role": str(observation["role"]), "content": str(observation["content"])},)
    return (message("user", str(observation)),) if str(observation) else ()


class ReflexionEnv(gym.Env):
    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, env: str = "arithmetic", env_kwargs: dict[str, Any] | None = None, max_attempts: int = 2,
                 success_reward: float = 1.0) -> None:
        from posttrain.envs.registry import make_env  # the registry imports this module

        if max_attempts < 1:
            raise ValueError(f"env.kwargs.max_attempts must be at least 1, got {max_attempts}")
        self.inner = make_env(env, env_kwargs or {})
        self.max_attempts = max_attempts
        self.success_reward = success_reward
        self.observation_space = chat_space()
        self.action_space = Text(max_length=MAX_TEXT, min_length=0, charset=CHARSET)
        self.task: Task | None = None
        self.attempt = 0
        self.reflecting = False

    def tasks(self, split: Split) -> Sequence[Task]:
        return self.inner.tasks(split)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        observation, info = self.inner.reset(seed=seed, options=options)
        self.task = getattr(self.inner, "task", None) or (options or {}).get("task")
        self.attempt = 1
        self.reflecting = False
        return _as_messages(observation), dict(info)

    def step(self, action: str):
        if self.reflecting:
            self.reflecting = False
            self.attempt += 1
            observation, _ = self.inner.reset(options={"task": self.task})
            # Pose only the question again (not any instructions or examples before it).
            question = _as_messages(observation)[-1:]
            retry = tuple(message(m["role"], f"{RETRY}\n\n{m['content']}") for m in question)
            return retry, 0.0, False, False, {"correct": False, "reflection": str(action)}
        observation, reward, terminated, truncated, info = self.inner.step(action)
        info = {**info, "attempt": self.attempt}
        if not (terminated or truncated):
            return _as_messages(observation), float(reward), False, False, info
        succeeded = bool(info.get("correct", reward >= self.success_reward))
        if succeeded or self.attempt >= self.max_attempts:
            return (), float(reward), terminated, truncated, info
        self.reflecting = True
        info.update(correct=False, attempt_reward=float(reward))
        return (message("user", REFLECT),), 0.0, False, False, info
