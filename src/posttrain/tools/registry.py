"""Tools an agent can call, built from typed Python functions.

A tool is a plain function with type hints and a Google-style docstring; its JSON schema (the
OpenAI / Hugging Face chat-template ``tools=`` format) is read from the signature and docstring
by ``transformers.utils.get_json_schema``. Calling a tool validates the arguments against the
signature first, so a model that passes a wrong name, a missing argument or a wrong type gets a
message saying so instead of an exception.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from transformers.utils import get_json_schema

_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list, "object": dict}


class ToolError(Exception):
    """A tool call that cannot be carried out; the message is shown to the agent as its observation."""


@dataclass(frozen=True)
class Tool:
    name: str
    function: Callable[..., Any]
    schema: dict[str, Any]

    @property
    def description(self) -> str:
        return self.schema["function"]["description"]

    @property
    def parameters(self) -> dict[str, Any]:
        return self.schema["function"]["parameters"]

    def call(self, arguments: dict[str, Any] | str) -> str:
        """Run the tool; bad arguments and failures inside the tool raise :class:`ToolError`."""
        kwargs = self.bind(arguments)
        try:
            result = self.function(**kwargs)
        except ToolError:
            raise
        except Exception as e:  # noqa: BLE001 - the agent's input made the tool fail; tell the agent
            raise ToolError(f"{self.name} failed: {type(e).__name__}: {e}") from None
        return result if isinstance(result, str) else json.dumps(result, default=str)

    def bind(self, arguments: dict[str, Any] | str) -> dict[str, Any]:
        """Keyword arguments for the function, checked against its schema.

        A single-argument tool may be given its argument as plain text (ReAct's Action Input),
        and a number where text is expected is taken as its text.
        """
        props = self.parameters.get("properties", {})
        if isinstance(arguments, str):
            required = self.parameters.get("required", [])
            if len(props) == 1 or len(required) == 1:
                key = required[0] if len(required) == 1 else next(iter(props))
                arguments = {key: arguments.strip()}
            else:
                raise ToolError(f"{self.name} takes {len(props)} arguments ({', '.join(props)}); "
                                f"give them as a JSON object")
        if not isinstance(arguments, dict):
            raise ToolError(f"arguments of {self.name} must be a JSON object, got {type(arguments).__name__}")
        unknown = sorted(set(arguments) - set(props))
        if unknown:
            raise ToolError(f"{self.name} has no argument {', '.join(map(repr, unknown))} "
                            f"(expected: {', '.join(props) or 'none'})")
        missing = [k for k in self.parameters.get("required", []) if k not in arguments]
        if missing:
            raise ToolError(f"{self.name} is missing required argument {', '.join(map(repr, missing))}")
        bound = {}
        for key, value in arguments.items():
            kind = props[key].get("type")
            if kind == "string" and isinstance(value, (int, float)) and not isinstance(value, bool):
                value = str(value)
            elif kind in ("integer", "number") and isinstance(value, str):
                value = _number(value, kind)
            expected = _JSON_TYPES.get(kind)
            if expected and (not isinstance(value, expected) or (isinstance(value, bool) and kind != "boolean")):
                raise ToolError(f"argument {key!r} of {self.name} must be {kind}, got {type(value).__name__}")
            bound[key] = value
        return bound


def _number(text: str, kind: str) -> int | float | str:
    """'12' -> 12 for an integer argument given as text; anything unparsable stays text (and fails the check)."""
    try:
        return int(text) if kind == "integer" else float(text)
    except ValueError:
        return text


def tool(function: Callable[..., Any]) -> Tool:
    """Wrap a typed, documented function as a :class:`Tool` (its name is the function's name)."""
    if not inspect.isfunction(function) and not inspect.ismethod(function):
        raise TypeError(f"a tool must be a function, got {type(function).__name__}")
    schema = get_json_schema(function)
    return Tool(schema["function"]["name"], function, schema)


class ToolRegistry:
    """The tools available in one environment, by name."""

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] = ()):
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.add(t)

    def add(self, t: Tool | Callable[..., Any]) -> Tool:
        t = t if isinstance(t, Tool) else tool(t)
        if t.name in self._tools:
            raise ValueError(f"two tools are named {t.name!r}")
        self._tools[t.name] = t
        return t

    def __contains__(self, name: str) -> bool:
        return name in self._tools

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        """The ``tools=`` argument of ``tokenizer.apply_chat_template``."""
        return [t.schema for t in self._tools.values()]

    def call(self, name: str, arguments: dict[str, Any] | str) -> str:
        if name not in self._tools:
            raise ToolError(f"unknown tool {name!r}; available tools: {', '.join(self._tools) or 'none'}")
        return self._tools[name].call(arguments)
