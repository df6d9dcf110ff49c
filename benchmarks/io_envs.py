"""Environments for benchmarks/scale.py, importable by Ray env workers (``env.id: io_envs:SleepEnv``).

``SleepEnv``'s step waits ``delay`` seconds, as a step that waits on a browser, a sandbox or an API;
``BusyEnv``'s step spins pure Python for ``delay`` seconds, holding the GIL, as an env whose own
work is CPU-bound (a game engine, a parser). Both give reward 1 and end after one step.
"""

import time

import gymnasium as gym
from gymnasium.spaces import Text

from posttrain.types import Task


class _OneStep(gym.Env):
    def __init__(self, delay: float = 0.2):
        self.observation_space = Text(max_length=256)
        self.action_space = Text(max_length=4096)
        self.delay = delay

    def tasks(self, split):
        return [Task(f"{split}-{i}", f"Say {i}.", str(i)) for i in range(64)]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return (options or {}).get("task", Task("t", "Say 0.", "0")).prompt, {}

    def work(self) -> None:
        raise NotImplementedError

    def step(self, action):
        self.work()
        return "", 1.0, True, False, {}


class SleepEnv(_OneStep):
    def work(self) -> None:
        time.sleep(self.delay)


class BusyEnv(_OneStep):
    def work(self) -> None:
        end = time.perf_counter() + self.delay
        n = 0
        while time.perf_counter() < end:
            n += 1
