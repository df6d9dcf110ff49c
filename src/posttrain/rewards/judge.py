"""LLM-as-judge rewards: a local model grades answers against a rubric.

``judge`` grades each answer alone and replies "Score: N" (0 to 10); ``group_judge`` sees the G
answers to one task in a single prompt and scores them relative to each other, one line per
answer (as ART's RULER does: relative judgements are easier than absolute ones, and GRPO only
uses differences within a group anyway). Replies are untrusted text: :func:`parse_score` and
:func:`parse_group_scores` accept the usual shapes (``Score: 7``, ``7/10``, ``**8**``, JSON
``{"score": 7}``, ``Answer 2: 6``) and an answer whose score cannot be read gets 0, counted in
``reward/<name>/unparsed``. Scores are divided by the scale, so rewards lie in [0, 1].
"""

from __future__ import annotations

import json
import re

from posttrain.models.loading import load_model, load_tokenizer
from posttrain.rollout import HFBackend, SamplingParams
from posttrain.rollout.episodes import encode_prompt
from posttrain.types import Trajectory

DEFAULT_RUBRIC = "A good answer is correct, complete and says its final answer clearly."
# A number starts where a run of digits does: tried from inside a run of n digits as well, "NUMBER / 10" took
# 22 s on 20,000 digits (each start reads the run to its end).
_NUMBER = r"(-?(?<!\d)\d+(?:\.\d+)?)"
_SCORE_PATTERNS = [
    # No two runs of \s* side by side (see verifiable._ANSWER: polynomial backtracking on a run of spaces).
    re.compile(r"score(?:\s*(?:is|of|=|:))?\s*(?:\*+\s*)?" + _NUMBER, re.IGNORECASE),
    re.compile(_NUMBER + r"\s*(?:/|out of)\s*\d+", re.IGNORECASE),
    re.compile(r"\*\*\s*" + _NUMBER + r"\s*\*\*"),
]
_GROUP_LINE = re.compile(
    r"answer\s*(?:#\s*)?(\d+)\s*(?:\*+\s*)?[:=\-]\s*(?:\*+\s*)?(?:score\s*(?:[:=]\s*)?)?" + _NUMBER, re.IGNORECASE
)


def _clamped(value: float, scale: float) -> float:
    return min(max(value, 0.0), scale) / scale


def parse_score(text: str, scale: float = 10.0) -> float | None:
    """A judge's score for one answer in [0, 1], or None when the reply holds none."""
    try:
        data = json.loads(text.strip().strip("`").removeprefix("json").strip())
        if isinstance(data, dict) and isinstance(data.get("score"), (int, float)):
            return _clamped(float(data["score"]), scale)
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
        pass
    for pattern in _SCORE_PATTERNS:
        found = pattern.findall(text)
        if found:
            return _clamped(float(found[-1]), scale)
    numbers = re.findall(_NUMBER, text)
    in_range = [float(n) for n in numbers if 0 <= float(n) <= scale]
    return _clamped(in_range[-1], scale) if len(numbers) == 1 and in_range else None


def parse_group_scores(text: str, count: int, scale: float = 10.0) -> list[float | None]:
    """Scores of answers 1..count from lines such as "Answer 2: 7" (the last line for an answer wins)."""
    out: list[float | None] = [None] * count
    for index, value in _GROUP_LINE.findall(text):
        k = int(index) - 1
        if 0 <= k < count:
            out[k] = _clamped(float(value), scale)
    return out


def answer_text(trajectory: Trajectory, max_chars: int) -> str:
    """What the agent said, turn by turn, cut to its last ``max_chars`` characters."""
    return "\n".join(s.action for s in trajectory.steps)[-max_chars:]


class _LocalJudge:
    """A local causal LM answering judging prompts greedily."""

    def __init__(self, model: str = "smollm2-135m-instruct", rubric: str = DEFAULT_RUBRIC, scale: float = 10.0,
                 max_new_tokens: int = 32, max_answer_chars: int = 2000, batch_size: int = 16):
        self.tokenizer = load_tokenizer(model)
        self.backend = HFBackend(load_model(model).eval().requires_grad_(False), self.tokenizer, batch_size)
        self.params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
        self.rubric, self.scale, self.max_answer_chars = rubric, scale, max_answer_chars
        self.last_metrics: dict[str, float] = {}

    def _ask(self, prompts: list[str]) -> list[str]:
        ids = [encode_prompt(self.tokenizer, p) for p in prompts]
        replies = self.backend.generate(ids, self.params)
        return [self.tokenizer.decode(g.token_ids, skip_special_tokens=True) for g in replies]


class Judge(_LocalJudge):
    """``reward.components: [{name: judge, kwargs: {model, rubric}}]``: each answer graded on its own."""

    def prompt(self, trajectory: Trajectory) -> str:
        return (f"Grade the answer to the question.\nRubric: {self.rubric}\n\nQuestion: {trajectory.task.prompt}\n\n"
                f"Answer: {answer_text(trajectory, self.max_answer_chars)}\n\n"
                f"Reply with 'Score: N', N from 0 (worst) to {self.scale:g} (best).")

    def score(self, trajectories: list[Trajectory], group_size: int = 1) -> list[float]:
        parsed = [parse_score(r, self.scale) for r in self._ask([self.prompt(t) for t in trajectories])]
        self.last_metrics = {"unparsed": float(sum(p is None for p in parsed))}
        return [p or 0.0 for p in parsed]


class GroupJudge(_LocalJudge):
    """``reward.components: [{name: group_judge, ...}]``: the G answers of a task scored together, one call."""

    def prompt(self, group: list[Trajectory]) -> str:
        answers = "\n\n".join(f"Answer {k + 1}: {answer_text(t, self.max_answer_chars)}" for k, t in enumerate(group))
        return (f"Compare {len(group)} answers to one question and score each relative to the others.\n"
                f"Rubric: {self.rubric}\n\nQuestion: {group[0].task.prompt}\n\n{answers}\n\n"
                f"Reply with one line per answer, 'Answer K: N', N from 0 (worst) to {self.scale:g} (best).")

    def score(self, trajectories: list[Trajectory], group_size: int = 1) -> list[float]:
        groups = [trajectories[s : s + group_size] for s in range(0, len(trajectories), group_size)]
        replies = self._ask([self.prompt(g) for g in groups])
        parsed = [p for g, r in zip(groups, replies) for p in parse_group_scores(r, len(g), self.scale)]
        self.last_metrics = {"unparsed": float(sum(p is None for p in parsed)), "calls": float(len(groups))}
        return [p or 0.0 for p in parsed]
