"""Built-in reward components and step scorers: pure functions of one trajectory.

A component maps a trajectory to a score (the composed reward is their weighted sum, see
:mod:`posttrain.rewards.composition`); a step scorer maps one agent turn to a value added to that
turn's step reward, which is what per-turn credit (``algorithm.credit: turn``, PPO's
``gae_level: turn``) assigns.
"""

from __future__ import annotations

# `regex` rather than `re`: the same patterns, with a time limit per search. A user's pattern runs on untrusted
# replies inside the trainer; one that backtracks badly on some reply must cost that reply, not stall training.
import regex

from posttrain.types import Step, Trajectory

# A final answer the reader can find: "Answer: 12", "answer is 12", "= 12" at the end, "\boxed{12}".
DEFAULT_FORMAT = r"(?i)(answer\s*(is|:)|\\boxed\{|final answer)"
# Seconds a ``format`` search may take on one reply; past it the reply scores 0 and counts as the component's error.
FORMAT_SECONDS = 0.05


def correctness(trajectory: Trajectory) -> float:
    """The environment's return: the sum of its step rewards (its verifier's verdict, for math envs)."""
    return float(trajectory.reward)


def answer_format(trajectory: Trajectory, pattern: str = DEFAULT_FORMAT) -> float:
    """1 when the last turn's text matches the regular expression ``pattern``, else 0 (a search that takes longer
    than :data:`FORMAT_SECONDS` raises TimeoutError)."""
    last = trajectory.steps[-1].action if trajectory.steps else ""
    return float(regex.search(pattern, last, timeout=FORMAT_SECONDS) is not None)


def _valid_call(step: Step) -> bool:
    return "tool" in step.info and not step.info.get("tool_error") and not step.info.get("malformed_call")


def _attempted_call(step: Step) -> bool:
    # Tool environments mark a turn that used (or tried to use) a tool in its info (envs/tool_env.py).
    return "tool" in step.info or bool(step.info.get("malformed_call"))


def tool_call_validity(trajectory: Trajectory) -> float:
    """Share of the turns that tried to call a tool whose call parsed and ran; 0 without any call."""
    attempted = [s for s in trajectory.steps if _attempted_call(s)]
    return sum(_valid_call(s) for s in attempted) / len(attempted) if attempted else 0.0


def length_penalty(trajectory: Trajectory, max_tokens: int = 256, free_tokens: int = 0) -> float:
    """-(tokens - free_tokens) / (max_tokens - free_tokens), clamped to [-1, 0]: tokens past a free budget cost."""
    if max_tokens <= free_tokens:
        raise ValueError(f"length penalty needs max_tokens > free_tokens, got {max_tokens} and {free_tokens}")
    over = (trajectory.num_sampled_tokens - free_tokens) / (max_tokens - free_tokens)
    return -min(max(over, 0.0), 1.0)


def tool_call_step(trajectory: Trajectory, index: int, step: Step) -> float:
    """Step scorer: +1 for a turn whose tool call parsed and ran, -1 for a malformed call, else 0."""
    if step.info.get("malformed_call"):
        return -1.0
    return 1.0 if _valid_call(step) else 0.0


COMPONENTS = {"correctness": correctness, "format": answer_format, "tool_calls": tool_call_validity,
              "length": length_penalty}
STEP_SCORERS = {"tool_call": tool_call_step}
