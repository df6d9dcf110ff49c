"""Verifiable rewards: compare the answer in a model's text with the ground truth.

Two checks, one answer: a plain number ("Answer: 1,234", "= 27", ``\\boxed{42}``) is compared
exactly as a fraction, which is fast and needs no parser; anything else (LaTeX such as
``\\boxed{\\frac{3}{4}}``, ``\\dfrac``, ``3/4``, a gold answer that is not a number) goes to
Hugging Face's ``math-verify``, which parses LaTeX and plain expressions with SymPy and compares
them symbolically and numerically. On a plain number both agree, so the fast path changes no
verdict (``tests/test_math_verify.py`` checks the two on the same cases).
"""

from __future__ import annotations

import logging
import re
from fractions import Fraction

from posttrain.rewards import isolated

_MAX_DIGITS = 100
_NUMBER = r"-?\d[\d,]*(?:\.\d+)?"
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
# No two runs of \s* side by side: "answer" and 400 spaces took 27 s when the engine tried every way
# to split the spaces between them (its backtracking is polynomial in the run's length, to the 4th power).
_ANSWER = re.compile(r"(?:answer(?:\s*is)?(?:\s*[:=])?|=)\s*(?:\$\s*)?(" + _NUMBER + ")", re.IGNORECASE)
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


# Text that a plain-number reading could misread: LaTeX commands, and fractions such as "3/4"
# (whose last number, 4, is not the answer).
_NOT_PLAIN = re.compile(r"\\|\d\s*/\s*\d")
# Long model output is cut to its tail, where the final answer is, so that parsing stays short.
_MAX_VERIFY_CHARS = 2000


def _plain_final_number(text: str) -> Fraction | None:
    """The final answer when it is a plain number that the exact check reads correctly, else None."""
    boxed = last_boxed(text)
    if boxed is not None:
        return parse_number(boxed.strip().strip("$"))
    if _NOT_PLAIN.search(text):
        return None
    return extract_final_number(text)


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}``, nested braces included, or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


def math_verify_equal(text: str, answer) -> bool:
    """math-verify's verdict: does the answer in ``text`` equal the gold ``answer``?

    Asked in a child process (:mod:`posttrain.rewards.isolated`): SymPy evaluates what the model wrote,
    and an answer such as ``\\boxed{10^{10^{10^{10}}}}`` would otherwise hold the trainer's GIL for good.
    Raises :class:`~posttrain.rewards.isolated.NoVerdict` when the check gave none (its time limit).
    """
    return isolated.call(f"{__name__}:math_verify_in_process", text[-_MAX_VERIFY_CHARS:], str(answer))


_VERIFY_TIMEOUT = 5  # math-verify's own limit, in seconds, for parsing each side and for the comparison


def math_verify_in_process(text: str, gold: str) -> bool:
    """math-verify's verdict in this process, with its own timeouts (SIGALRM: the main thread only).
    Untrusted text: a parser's failure is a wrong answer. Called by :func:`math_verify_equal`'s child."""
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # a timeout is a wrong answer, not a warning
    try:
        gold_parsed = parse(gold if "$" in gold else f"${gold}$", parsing_timeout=_VERIFY_TIMEOUT)
        predicted = parse(text, parsing_timeout=_VERIFY_TIMEOUT)
        return bool(gold_parsed and predicted and verify(gold_parsed, predicted, timeout_seconds=_VERIFY_TIMEOUT))
    except Exception:  # noqa: BLE001 - MemoryError included: the child's address space is capped
        return False


def math_answer_correct(text: str, answer) -> bool:
    """True when the final answer of ``text`` equals ``answer``: exact for plain numbers, else math-verify
    (:func:`math_verify_equal`, which may raise NoVerdict)."""
    expected = answer if isinstance(answer, Fraction) else parse_number(str(answer))
    predicted = _plain_final_number(text)
    if expected is not None and predicted is not None:
        return predicted == expected
    return math_verify_equal(text, answer)


def math_answer_score(action: str, answer) -> tuple[float, dict]:
    """Reward 1 when the final answer equals ``answer`` (:func:`math_answer_correct`), with info. An answer
    whose check gave no verdict is wrong, and counted in the ``unverified_answers`` metric."""
    try:
        correct, metrics = math_answer_correct(action, answer), {}
    except isolated.NoVerdict:
        correct, metrics = False, {"metrics": {"unverified_answers": 1.0}}
    # What was compared: the last \boxed{} as written (\frac{3}{4}, not its last number), else the final number.
    parsed = last_boxed(action)
    if parsed is not None:
        parsed = parsed.strip()[:200]
    elif (number := extract_final_number(action)) is not None:
        parsed = str(number)
    return float(correct), {"correct": correct, "parsed_answer": parsed, **metrics}
