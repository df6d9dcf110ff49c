"""Verifiable rewards: compare the answer in a model's text with the ground truth."""

from __future__ import annotations

import re
from fractions import Fraction

_MAX_DIGITS = 100
_NUMBER = r"-?\d[\d,]*(?:\.\d+)?"
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_ANSWER = re.compile(r"(?:answer\s*(?:is)?\s*[:=]?|=)\s*\$?\s*(" + _NUMBER + ")", re.IGNORECASE)
_ANY_NUMBER = re.compile(_NUMBER)


def parse_number(text: str) -> Fraction | None:
    """'1,234' -> 1234, '-3.50' -> -7/2; None when ``text`` is not a number."""
    cleaned = text.strip().replace(",", "").rstrip(".")
    # Model output is untrusted: a 5,000-digit "number" is not an answer (and int() refuses it).
    if len(cleaned) > _MAX_DIGITS or not re.fullmatch(r"-?\d+(?:\.\d+)?", cleaned):
        return None
    return Fraction(cleaned)


def extract_final_number(text: str) -> Fraction | None:
    """The number a model's text gives as its final answer, or None.

    In order of precedence: the last ``\\boxed{...}``; the number after the last
    "Answer:" / "answer is" / "="; the last number anywhere in the text.
    """
    boxed = _BOXED.findall(text)
    if boxed:
        inner = _ANY_NUMBER.findall(boxed[-1])
        return parse_number(inner[-1]) if inner else None
    marked = _ANSWER.findall(text)
    candidates = marked or _ANY_NUMBER.findall(text)
    for candidate in reversed(candidates):
        value = parse_number(candidate)
        if value is not None:
            return value
    return None


def exact_match_reward(text: str, answer: int | float | str | Fraction) -> float:
    """1.0 when the final number in ``text`` equals ``answer`` exactly, else 0.0."""
    predicted = extract_final_number(text)
    expected = answer if isinstance(answer, Fraction) else parse_number(str(answer))
    return float(predicted is not None and expected is not None and predicted == expected)


def exact_number_score(action: str, answer) -> tuple[float, dict]:
    """Reward 1 for the exact final number, with ``correct`` and the parsed answer as info."""
    reward = exact_match_reward(action, answer)
    parsed = extract_final_number(action)
    return reward, {"correct": reward == 1.0, "parsed_answer": None if parsed is None else str(parsed)}
