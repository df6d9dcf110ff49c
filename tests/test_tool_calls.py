"""Tool-call parsing: ReAct text and JSON function calls; malformed output never raises."""

import time

import pytest

from posttrain.rollout.tool_calls import FinalAnswer, Malformed, ToolCall, parse_json_call, parse_react


@pytest.mark.parametrize("text, expected", [
    ("Thought: I need the product\nAction: calculator\nAction Input: 37 * 48", ToolCall("calculator", "37 * 48")),
    ("Action: calculator\nAction Input: `12 + 3`\nObservation: 15\nFinal Answer: 15", ToolCall("calculator", "12 + 3")),
    ('action: sql\naction input: "SELECT 1"', ToolCall("sql", "SELECT 1")),
    ('Action: convert\nAction Input: {"amount": 2, "unit": "km"}', ToolCall("convert", {"amount": 2, "unit": "km"})),
    ("Action: python\nAction Input: x = 2\nprint(x * 3)", ToolCall("python", "x = 2\nprint(x * 3)")),
    ("Thought: easy\nFinal Answer: 1776", FinalAnswer("1776")),
    ("Final Answer: 7\nAction: calculator\nAction Input: 1", FinalAnswer("7\nAction: calculator\nAction Input: 1")),
    ("Action: calculator\n\n\t Action Input : 2 + 2", ToolCall("calculator", "2 + 2")),
    ("Action: calculator\nAction Input: 1\n  Observation: 1\nAction Input: 2", ToolCall("calculator", "1")),
])
def test_react_parses_calls_and_answers(text, expected):
    assert parse_react(text) == expected


@pytest.mark.parametrize("text, message", [
    ("The answer is probably 12.", "no action found"),
    ("Action: calculator", "has no 'Action Input:' line"),
    ("Action:\nAction Input: 3", "names no tool"),
    ("Final Answer:   ", "'Final Answer:' is empty"),
    ("", "no action found"),
    # An observation the model made up does not count as its action.
    ("Observation: 12\nAction: calculator\nAction Input: 1", "no action found"),
])
def test_react_malformed_turns_say_what_is_wrong(text, message):
    parsed = parse_react(text)
    assert isinstance(parsed, Malformed) and message in parsed.message
    assert "Final Answer: <answer>" in parsed.message  # and what is expected


@pytest.mark.parametrize("text, expected", [
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>',
     ToolCall("calculator", {"expression": "2+2"})),
    ('{"name": "calculator", "arguments": {"expression": "2+2"}}', ToolCall("calculator", {"expression": "2+2"})),
    ('```json\n{"name": "sql", "arguments": {"query": "SELECT 1"}}\n```', ToolCall("sql", {"query": "SELECT 1"})),
    ('{"name": "sql", "arguments": "{\\"query\\": \\"SELECT 1\\"}"}', ToolCall("sql", {"query": "SELECT 1"})),
    ('I will call it: {"name": "f", "parameters": {"x": 1}} now', ToolCall("f", {"x": 1})),
    ("The answer is 42.", FinalAnswer("The answer is 42.")),
    ("The set {1, 2} has two elements.", FinalAnswer("The set {1, 2} has two elements.")),
])
def test_json_calls_parse(text, expected):
    assert parse_json_call(text) == expected


@pytest.mark.parametrize("text, message", [
    ('{"name": "calculator", "arguments": {"expression": "2+2"}', "not valid JSON"),
    ('<tool_call>{"name": 3}</tool_call>', 'no "name" string'),
    ("<tool_call>calculator(2+2)</tool_call>", "holds no JSON object"),
    ('{"name": "f", "arguments": [1, 2]}', "must be a JSON object, got list"),
    ('{"name": "f", "arguments": "not json"}', "is not a JSON object"),
])
def test_json_malformed_calls_say_what_is_wrong(text, message):
    parsed = parse_json_call(text)
    assert isinstance(parsed, Malformed) and message in parsed.message


@pytest.mark.parametrize("parse", [parse_react, parse_json_call])
def test_a_reply_of_blank_lines_is_parsed_at_once(parse):
    """A parse holds the GIL, so a pattern that is quadratic in a reply's blank lines stalls every thread of the
    trainer: before, parse_react took 39 s on 100,000 newlines and 92 s with an Action line before them."""
    for reply in ["\n" * 100_000, "Action: calculator" + "\n" * 100_000, "```json\n{" + " " * 100_000 + "x"]:
        start = time.monotonic()
        assert isinstance(parse(reply), (Malformed, FinalAnswer))
        assert time.monotonic() - start < 2
