"""Multi-turn environments in which the agent calls tools until it gives a final answer.

Each turn the agent either calls a tool (ReAct text or a JSON function call, see
``posttrain.rollout.tool_calls``) and gets the tool's result as the next observation, or gives
its final answer, which ends the episode and is scored by :meth:`TextEnv.score`. A malformed
call or a failing tool becomes an observation that says what was wrong (with an optional
penalty as the step reward); it never raises. ``info`` marks such turns (``malformed_call``,
``tool_error``), and ``info["metrics"]`` counts ``tool_calls``, ``malformed_tool_calls`` and
``tool_errors``, which training logs (see :class:`posttrain.envs.contract.StepInfo`).

Worked examples can be placed before the question as earlier turns of the conversation. Small
models copy the format of earlier assistant turns far more reliably than they follow written
instructions; the example tool results are produced by calling the real tools.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from posttrain.envs.base import TextEnv, chat_space, message
from posttrain.rollout.tool_calls import CallFormat, FinalAnswer, Malformed, ToolCall, parse_turn
from posttrain.tools.registry import ToolError, ToolRegistry
from posttrain.types import Task

Example = tuple[str, Sequence[ToolCall | FinalAnswer]]
"""A worked example: a question and the agent's turns (tool calls, then the final answer)."""


class ToolEnv(TextEnv):
    """Base class: subclasses provide the tools, the tasks, :meth:`score` and optional examples."""

    def __init__(
        self,
        tools: ToolRegistry,
        call_format: CallFormat = "react",
        max_tool_calls: int = 4,
        malformed_penalty: float = 0.0,
        examples: Sequence[Example] = (),
    ) -> None:
        super().__init__()
        if call_format not in ("react", "json"):
            raise ValueError(f"env.kwargs.call_format must be 'react' or 'json', got {call_format!r}")
        if max_tool_calls < 1:
            raise ValueError(f"env.kwargs.max_tool_calls must be at least 1, got {max_tool_calls}")
        if malformed_penalty < 0:
            raise ValueError(f"env.kwargs.malformed_penalty must be >= 0 (it is subtracted), got {malformed_penalty}")
        self.observation_space = chat_space()
        self.tools = tools
        self.call_format: CallFormat = call_format
        self.max_tool_calls = max_tool_calls
        self.malformed_penalty = malformed_penalty
        self._example_messages = [m for ex in examples for m in self._render_example(ex)]
        self.tool_calls = 0

    # ------------------------------------------------------------ prompt

    def instructions(self) -> str:
        """How to call the tools, listing each with its description."""
        if self.call_format == "react":
            listing = "\n".join(f"- {t}: {self.tools[t].description}" for t in self.tools.names)
            return (f"You can use these tools:\n{listing}\nTo use a tool, reply:\nAction: <tool name>\n"
                    "Action Input: <input>\nWhen you know the answer, reply:\nFinal Answer: <answer>")
        schemas = "\n".join(json.dumps(s["function"]) for s in self.tools.schemas())
        return (f"You can call these functions:\n{schemas}\nTo call one, reply with a JSON object "
                '{"name": <function name>, "arguments": {...}}. When you know the answer, reply with it as plain text.')

    def _render_call(self, call: ToolCall) -> str:
        if self.call_format == "react":
            given = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)
            return f"Action: {call.name}\nAction Input: {given}"
        return json.dumps({"name": call.name, "arguments": self.tools[call.name].bind(call.arguments)})

    def _render_final(self, answer: str) -> str:
        return f"Final Answer: {answer}" if self.call_format == "react" else answer

    def _observation(self, name: str | None, text: str) -> dict[str, str]:
        if self.call_format == "json" and name is not None:
            return message("tool", text)
        return message("user", f"Observation: {text}" if self.call_format == "react" else text)

    def _render_example(self, example: Example) -> list[dict[str, str]]:
        question, turns = example
        messages = [message("user", question)]
        for turn in turns:
            if isinstance(turn, FinalAnswer):
                messages.append(message("assistant", self._render_final(turn.text)))
                continue
            messages.append(message("assistant", self._render_call(turn)))
            messages.append(self._observation(turn.name, self.tools.call(turn.name, turn.arguments)))
        return messages

    def first_messages(self, task: Task) -> tuple[dict[str, str], ...]:
        """Instructions, the worked examples, then the task's question."""
        messages = [dict(m) for m in self._example_messages] + [message("user", task.prompt)]
        messages[0]["content"] = f"{self.instructions()}\n\n{messages[0]['content']}"
        return tuple(messages)

    # ------------------------------------------------------------ episode

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        _, info = super().reset(seed=seed, options=options)
        self.tool_calls = 0
        if self.call_format == "json":
            info["tools"] = self.tools.schemas()  # for chat templates that render tools=
        return self.first_messages(self.task), info

    def step(self, action: str):
        if self.task is None:
            raise RuntimeError("step() called before reset()")
        parsed = parse_turn(str(action), self.call_format)
        if isinstance(parsed, FinalAnswer):
            reward, info = self.score(self.task, parsed.text)
            return (), float(reward), True, False, {**info, "tool_calls": self.tool_calls}
        self.tool_calls += 1
        out_of_calls = self.tool_calls >= self.max_tool_calls
        if isinstance(parsed, Malformed):
            observation = self._observation(None, f"Error: {parsed.message}")
            penalty = -self.malformed_penalty if self.malformed_penalty else 0.0
            return (observation,), penalty, False, out_of_calls, {
                "correct": False, "malformed_call": True,
                "metrics": {"tool_calls": 1.0, "malformed_tool_calls": 1.0, "tool_errors": 0.0}}
        info: dict[str, Any] = {"correct": False, "tool": parsed.name}
        try:
            result = self.tools.call(parsed.name, parsed.arguments)
        except ToolError as e:
            info["tool_error"] = True
            result = f"Error: {e}"
        info["metrics"] = {"tool_calls": 1.0, "malformed_tool_calls": 0.0, "tool_errors": float("tool_error" in info)}
        return (self._observation(parsed.name, result),), 0.0, False, out_of_calls, info
