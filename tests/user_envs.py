"""Environments defined outside the package, as a user would write them (not in posttrain)."""

import gymnasium as gym
from gymnasium.spaces import Text

from posttrain.types import Task


class Capitals(gym.Env):
    """The README's example: a plain gymnasium.Env with a tasks(split) method."""

    def __init__(self, bonus_for_length: bool = True):
        self.observation_space = Text(max_length=4096)
        self.action_space = Text(max_length=4096)
        self.bonus_for_length = bonus_for_length
        self._data = {
            "train": [Task("fr", "Capital of France?", "Paris"), Task("de", "Capital of Germany?", "Berlin")],
            "eval": [Task("it", "Capital of Italy?", "Rome")],
        }

    def tasks(self, split):
        return self._data[split]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.task = (options or {}).get("task") or self._data["train"][0]
        return self.task.prompt, {}

    def step(self, action):
        correct = self.task.answer.lower() in action.lower()
        # A graded signal (shorter is better) so that even a random policy's groups have variance.
        reward = float(correct) + (1.0 / (1 + len(action)) if self.bonus_for_length else 0.0)
        return "", reward, True, False, {"correct": correct}


class NoisyCapitals(Capitals):
    """Capitals whose reward carries a little noise from the env's own np_random (gymnasium's RNG)."""

    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        return observation, reward + 0.1 * float(self.np_random.random()), terminated, truncated, info


class Exploding(Capitals):
    """Raises on every other step: training must go on and count the errors."""

    calls = 0

    def step(self, action):
        Exploding.calls += 1
        if Exploding.calls % 2:
            raise RuntimeError("environment crashed")
        return super().step(action)


class GuessNumber(gym.Env):
    """Multi-turn: guess a number from 1 to 9; the environment answers "higher" or "lower"."""

    def __init__(self, max_guesses: int = 4):
        self.observation_space = Text(max_length=4096)
        self.action_space = Text(max_length=4096)
        self.max_guesses = max_guesses
        self._tasks = [Task(f"n{i}", "Guess my number from 1 to 9. Answer with one digit.", i) for i in range(1, 10)]

    def tasks(self, split):
        return self._tasks[:6] if split == "train" else self._tasks[6:]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.task = (options or {}).get("task") or self._tasks[0]
        self.guesses = 0
        return self.task.prompt, {}

    def step(self, action):
        self.guesses += 1
        digits = [int(c) for c in action if c.isdigit()]
        if digits and digits[0] == self.task.answer:
            return "Correct!", 1.0, True, False, {"correct": True}
        hint = "No digit found." if not digits else ("Higher." if digits[0] < self.task.answer else "Lower.")
        # A small step reward for any well-formed guess: a process signal per turn.
        return hint, 0.1 if digits else 0.0, False, self.guesses >= self.max_guesses, {"correct": False}


class Hanging(Capitals):
    """Every third step hangs far past any sensible timeout."""

    calls = 0

    def step(self, action):
        Hanging.calls += 1
        if Hanging.calls % 3 == 0:
            import time

            time.sleep(600)
        return super().step(action)


class SeededSum(gym.Env):
    """A plain gymnasium env with no tasks(): the seed alone picks the problem (as most gymnasium envs do)."""

    def __init__(self):
        self.observation_space = Text(max_length=4096)
        self.action_space = Text(max_length=4096)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.a, self.b = (int(x) for x in self.np_random.integers(1, 10, size=2))
        return f"What is {self.a} + {self.b}? Answer with the number.", {"seed": seed}

    def step(self, action):
        digits = "".join(c for c in action if c.isdigit())
        reward = float(digits == str(self.a + self.b)) + 1.0 / (1 + len(action))  # graded: groups have variance
        return "", reward, True, False, {}


class NumericObservations(gym.Env):
    """Not a text env: its observations are numbers."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(2,))
        self.action_space = Text(max_length=64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, True, False, {}


class OldStyleReset(gym.Env):
    """reset() without gymnasium's seed/options keywords."""

    def __init__(self):
        self.observation_space = Text(max_length=64)
        self.action_space = Text(max_length=64)

    def reset(self):  # noqa: D102 - deliberately the wrong signature
        return "hi", {}

    def step(self, action):
        return "", 0.0, True, False, {}


class AlwaysFailing(Capitals):
    """Every step raises: nothing can be learnt or measured."""

    def step(self, action):
        raise RuntimeError("the environment's backend is down")


class FailingReplacement(Capitals):
    """The first instance works; every later one fails in its constructor (a resource ran out)."""

    built = 0

    def __init__(self, **kwargs):
        FailingReplacement.built += 1
        if FailingReplacement.built > 1:
            raise RuntimeError("no more licences for the simulator")
        super().__init__(**kwargs)


class BadObservation(Capitals):
    """Multi-turn, but its second observation is neither text nor chat messages."""

    def __init__(self, observation="dict"):
        super().__init__(bonus_for_length=False)
        self.observation = {"dict": {"foo": 1}, "ints": [1, 2, 3], "number": 7}[observation]

    def step(self, action):
        return self.observation, 0.0, False, False, {"correct": False}


class BadTasks(Capitals):
    """tasks() returns something other than a list of Tasks."""

    def __init__(self, kind="strings"):
        super().__init__()
        self.kind = kind

    def tasks(self, split):
        if self.kind == "raises":
            raise KeyError(split)
        return {"strings": ["fr", "de"], "none": None, "text": "fr", "ids": [Task(1, "Capital?")]}[self.kind]


class BusyLoop(Capitals):
    """Every step spins in pure Python, forever."""

    def step(self, action):
        while True:
            pass


class HugePrompt(Capitals):
    """The first observation is far longer than any context."""

    def __init__(self, chars=1_000_000):
        super().__init__()
        self.chars = chars

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        return "lorem ipsum " * (self.chars // 12), {}


class NonFiniteReward(Capitals):
    """Rewards NaN, +inf and -inf, and a finite one, in turn."""

    calls = 0

    def step(self, action):
        NonFiniteReward.calls += 1
        reward = (float("nan"), float("inf"), float("-inf"), 1.0)[NonFiniteReward.calls % 4]
        return "", reward, True, False, {"correct": False}
