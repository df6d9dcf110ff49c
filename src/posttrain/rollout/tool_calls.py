"""Parse an agent's turn into a tool call, a final answer, or a description of what is malformed.

Two formats:

- ReAct text (Yao et al., 2023, "ReAct: Synergizing Reasoning and Acting in Language Models")::

      Thought: I need the product
      Action: calculator
      Action Input: 37 * 48

  and, to finish, ``Final Answer: 1776``. Anything the model wrote after ``Observation:`` is its
  own invention and is ignored (generation normally stops there).
- JSON function calls, as chat templates with ``tools=`` ask for them: a JSON object
  ``{"name": ..., "arguments": {...}}``, bare or inside ``<tool_call>...</tool_call>``. A turn
  with no call is the final answer.

Parsing never raises: untrusted model output becomes a :class:`Malformed` whose message is shown
to the agent as the observation.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

CallFormat = Literal["react", "json"]


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] | str


@dataclass(frozen=True)
class FinalAnswer:
    text: str


@dataclass(frozen=True)
class Malformed:
    message: str


Parsed = ToolCall | FinalAnswer | Malformed

_FINAL = re.compile(r"final answer\s*:\s*(.*)", re.IGNORECASE | re.DOTALL)
_ACTION = re.compile(r"^[ \t]*action[ \t]*:[ \t]*(.*)$", re.IGNORECASE | re.MULTILINE)
# A line's own indent is [ \t]*, never \s*: from each of n blank lines \s* would run over all the others
# (n^2 steps, in one call that holds the GIL: 40,000 newlines of a reply took 6 s).
_ACTION_INPUT = re.compile(r"^[ \t]*action input[ \t]*:\s*(.*)", re.IGNORECASE | re.MULTILINE | re.DOTALL)
_OBSERVATION = re.compile(r"^[ \t]*observation[ \t]*:", re.IGNORECASE | re.MULTILINE)
_TAGGED = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)

REACT_HINT = "reply with 'Action: <tool name>' and 'Action Input: <input>' lines, or 'Final Answer: <answer>'"
JSON_HINT = 'reply with {"name": <tool name>, "arguments": {...}} to call a tool, or with your answer as plain text'


def parse_react(text: str) -> Parsed:
    # Only what comes before a made-up observation counts.
    text = _OBSERVATION.split(text, maxsplit=1)[0]
    action = _ACTION.search(text)
    final = _FINAL.search(text)
    if final and (action is None or final.start() < action.start()):
        answer = final.group(1).strip()
        return FinalAnswer(answer) if answer else Malformed(f"'Final Answer:' is empty; {REACT_HINT}")
    if action is None:
        return Malformed(f"no action found; {REACT_HINT}")
    name = action.group(1).strip().strip("`'\"[]").strip()
    if not name:
        return Malformed(f"'Action:' names no tool; {REACT_HINT}")
    given = _ACTION_INPUT.search(text, action.end())
    if given is None:
        return Malformed(f"'Action: {name}' has no 'Action Input:' line after it; {REACT_HINT}")
    raw = given.group(1).strip().strip("`").strip()
    if raw.startswith("{"):
        try:
            parsed = json.loads(raw)
        except (json.JSONDecodeError, RecursionError):  # nested past the interpreter's recursion limit
            parsed = raw
        if isinstance(parsed, dict):
            return ToolCall(name, parsed)
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
        raw = raw[1:-1]
    return ToolCall(name, raw)


def _unfenced(text: str) -> str:
    """``text`` without the Markdown fence around it (```json ... ```), if any."""
    text = text.strip()
    if text.startswith("```"):
        text = text[3:].removeprefix("json")
    return text.removesuffix("```").strip()


def parse_json_call(text: str) -> Parsed:
    tagged = _TAGGED.search(text)
    candidate = tagged.group(1).strip() if tagged else _unfenced(text)
    start = candidate.find("{")
    if start < 0:
        if tagged:
            return Malformed(f"<tool_call> holds no JSON object; {JSON_HINT}")
        return FinalAnswer(text.strip())
    if not tagged and ('"name"' not in candidate and "'name'" not in candidate):
        return FinalAnswer(text.strip())  # braces in a plain answer are not a call
    try:
        call, _ = json.JSONDecoder().raw_decode(candidate[start:])
    except json.JSONDecodeError as e:
        return Malformed(f"the tool call is not valid JSON ({e.msg} at character {e.pos}); {JSON_HINT}")
    except RecursionError:
        return Malformed(f"the tool call is nested too deeply to read; {JSON_HINT}")
    if not isinstance(call, dict):
        return Malformed(f"the tool call must be a JSON object, got {type(call).__name__}; {JSON_HINT}")
    name = call.get("name")
    if not isinstance(name, str) or not name:
        return Malformed(f"the tool call has no \"name\" string; {JSON_HINT}")
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):  # some models double-encode the arguments
        try:
            arguments = json.loads(arguments)
        except (json.JSONDecodeError, RecursionError):
            return Malformed(f"\"arguments\" of {name} is not a JSON object; {JSON_HINT}")
    if not isinstance(arguments, dict):
        return Malformed(f"\"arguments\" of {name} must be a JSON object, got {type(arguments).__name__}")
    return ToolCall(name, arguments)


def parse_turn(text: str, call_format: CallFormat) -> Parsed:
    return parse_react(text) if call_format == "react" else parse_json_call(text)
