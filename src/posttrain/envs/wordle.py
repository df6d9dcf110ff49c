"""Wordle: guess a five-letter word in six tries, with letter-by-letter feedback after each guess.

Feedback marks each letter of the guess as ``G`` (right letter, right place), ``Y`` (in the word,
elsewhere) or ``-`` (not in the word, or not as many times as guessed), with the usual rule
for repeated letters. Reward 1 when the word is found. With ``progress_reward`` > 0 each guess
also earns that much times the number of newly found green positions / 5, a process signal.
Train and eval splits are disjoint by target word.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from typing import Any

from posttrain.envs.base import TextEnv
from posttrain.envs.wordle_words import WORDS
from posttrain.types import Task

RULES = ("Let's play Wordle. Guess the secret five-letter English word in {tries} tries. After each guess "
         "you get feedback for every letter: G = right letter in the right place, Y = in the word but "
         "elsewhere, - = not in the word. Reply with your guess as 'Guess: <word>'.")
_GUESS = re.compile(r"guess\s*:\s*([a-z]{5})\b", re.IGNORECASE)
_WORD5 = re.compile(r"\b([a-zA-Z]{5})\b")


def feedback(guess: str, target: str) -> str:
    """'G', 'Y' or '-' per letter of ``guess``; a letter is yellow only as often as it is unmatched in ``target``."""
    marks = ["-"] * 5
    unmatched = Counter(t for g, t in zip(guess, target) if g != t)
    for i, (g, t) in enumerate(zip(guess, target)):
        if g == t:
            marks[i] = "G"
        elif unmatched[g] > 0:
            marks[i] = "Y"
            unmatched[g] -= 1
    return "".join(marks)


def parse_guess(text: str) -> str | None:
    """The word after 'Guess:', else the last five-letter word in the text; lower-case."""
    found = _GUESS.findall(text) or _WORD5.findall(text)
    return found[-1].lower() if found else None


class WordleEnv(TextEnv):
    """Multi-turn text game: one guess per turn."""

    def __init__(self, max_guesses: int = 6, progress_reward: float = 0.0, num_eval: int = 100, seed: int = 0):
        super().__init__()
        if max_guesses < 1:
            raise ValueError(f"env.kwargs.max_guesses must be at least 1, got {max_guesses}")
        if not 0 < num_eval < len(WORDS):
            raise ValueError(f"env.kwargs.num_eval must be between 1 and {len(WORDS) - 1}, got {num_eval}")
        self.max_guesses = max_guesses
        self.progress_reward = progress_reward
        words = list(WORDS)
        random.Random(f"wordle-{seed}").shuffle(words)
        prompt = RULES.format(tries=max_guesses)
        tasks = [Task(f"wordle-{w}", prompt, w) for w in words]
        self._splits = {"eval": tasks[:num_eval], "train": tasks[num_eval:]}
        self.guesses = 0
        self.greens: set[int] = set()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        observation, info = super().reset(seed=seed, options=options)
        self.guesses = 0
        self.greens = set()
        return observation, info

    def step(self, action: str):
        if self.task is None:
            raise RuntimeError("step() called before reset()")
        self.guesses += 1
        left = self.max_guesses - self.guesses
        out_of_guesses = left == 0
        guess = parse_guess(str(action))
        if guess is None:
            return (f"No five-letter word found. Reply as 'Guess: <word>'. {left} tries left.", 0.0, False,
                    out_of_guesses, {"correct": False, "invalid_guess": True})
        if guess == self.task.answer:
            return "", 1.0, True, False, {"correct": True, "guesses": self.guesses}
        marks = feedback(guess, self.task.answer)
        new = {i for i, m in enumerate(marks) if m == "G"} - self.greens
        self.greens |= new
        reward = self.progress_reward * len(new) / 5
        text = f"{guess.upper()}: {' '.join(marks)}. {left} tries left." if left else f"{guess.upper()}: {' '.join(marks)}. Out of tries; the word was {self.task.answer.upper()}."
        return text, reward, False, out_of_guesses, {"correct": False, "guesses": self.guesses}
