"""Every parser of a model's reply reads it in time about linear in its length, and never raises.

A parser runs in the trainer's process and holds the GIL while it runs, so one that is quadratic (or worse) in a
reply stalls every thread of training. Before: "The answer" and 300 spaces took 14 s in the math answer's regex
(backtracking of the 4th power in the run of spaces), 40,000 newlines 6.8 s in the tester's, 4,000 unclosed
"click(\\'" 4.7 s in the web action's; a step with a 5,000-digit number raised int()'s ValueError in chain
arithmetic, and JSON nested 20,000 deep a RecursionError in the tool-call parsers.
"""

import time

import pytest

from posttrain.envs.chain_arithmetic import check_steps
from posttrain.envs.code import extract_code
from posttrain.envs.games.coder_tester import CoderTester
from posttrain.envs.reasoning_gym_env import extract_answer
from posttrain.envs.web.actions import ActionError, parse_action
from posttrain.envs.wordle import parse_guess
from posttrain.rewards.judge import parse_group_scores, parse_score
from posttrain.rewards.verifiable import exact_match_reward, extract_final_number
from posttrain.rollout.tool_calls import parse_json_call, parse_react


def web_action(text):
    try:
        return parse_action(text)
    except ActionError as e:  # what the agent is told, by design
        return str(e)


N = 20_000
REPLIES = {
    "answer-then-spaces": "The answer" + " " * 300,
    "answer-spaces": "answer" + " " * 2 * N + "x",
    "equals-spaces": "=" + " " * N + "$" + " " * N,
    "newlines": "\n" * 2 * N + "x",
    "opening-tags": "<answer>" * N,
    "digits-then-slash": "1" * N + " /",
    "score-spaces": "score" + " " * N + "** x",
    "answer-number-spaces": "Answer #1" + " " * N + "*" + " " * N,
    "step-spaces": "1 + 2 = 3" + " " * N + "x",
    "huge-step": "9" * 5_000 + " + 1 = 2\nAnswer: 2",
    "guess-spaces": "guess" + " " * N + ": x",
    "deep-call": '{"name": "calculator", "arguments": ' + "[" * N + "]" * N + "}",
    "deep-string-arguments": '{"name": "calculator", "arguments": "' + "[" * N + '"}',
    "deep-input": "Action: calculator\nAction Input: " + '{"a": ' * N + "1" + "}" * N,
    "deep-object": '{"score": ' * N + "1" + "}" * N,
    "unclosed-actions": "click(\\'" * (N // 4),
}
PARSERS = {
    "math-number": extract_final_number,
    "math-reward": lambda text: exact_match_reward(text, 3),
    "reasoning-gym": extract_answer,
    "judge-score": parse_score,
    "judge-group": lambda text: parse_group_scores(text, 4),
    "tester": lambda text: CoderTester().parse("tester", text),
    "chain-steps": lambda text: check_steps([1, 2, 3], ["+", "-"], text),
    "code": lambda text: extract_code(text, "f"),
    "react": parse_react,
    "json-call": parse_json_call,
    "wordle": parse_guess,
    "web-action": web_action,
}


@pytest.mark.parametrize("reply", list(REPLIES.values()), ids=list(REPLIES))
@pytest.mark.parametrize("parse", list(PARSERS.values()), ids=list(PARSERS))
def test_a_hostile_reply_is_read_at_once(parse, reply):
    start = time.monotonic()
    parse(reply)
    assert time.monotonic() - start < 1


def test_a_step_of_thousands_of_digits_is_a_wrong_step():
    assert check_steps([1, 2], ["+"], "9" * 5_000 + " + 2 = 3\nAnswer: 3") == [False, False]
    assert check_steps([1, 2], ["+"], "1 + 2 = 3 .  \nAnswer: 3") == [True, True]
