"""Math answers: exact for plain numbers, math-verify for LaTeX, fractions and \\boxed{} (nested braces)."""

import subprocess
import sys
import time
from fractions import Fraction

import pytest

from posttrain.envs.arithmetic import ArithmeticEnv
from posttrain.envs.tool_math import ToolMathEnv
from posttrain.rewards import isolated
from posttrain.rewards.verifiable import (
    exact_match_reward,
    last_boxed,
    math_answer_correct,
    math_answer_score,
    math_verify_equal,
)


@pytest.mark.parametrize("text, answer, correct", [
    (r"so the answer is $\boxed{\frac{3}{4}}$", Fraction(3, 4), True),
    (r"\boxed{\dfrac{6}{8}}", "3/4", True),
    (r"The answer is \boxed{0.75}", r"\frac{3}{4}", True),
    ("Answer: 3/4", Fraction(3, 4), True),
    ("Answer: 3/4", 4, False),  # the plain reading ("last number: 4") would call this right
    (r"$\frac{1}{2} + \frac{1}{3} = \frac{5}{6}$", r"\frac{5}{6}", True),
    (r"\boxed{\frac{5}{7}}", r"\frac{5}{6}", False),
    (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", True),
    (r"We get $x = 12$.", 12, True),
    ("13 + 14 = 27", 27, True),
    ("Answer: 1,234", 1234, True),
    (r"\boxed{42} and then 7", 42, True),
    ("7 + 12 = 18", 19, False),
    ("no answer at all", 19, False),
])
def test_math_answers(text, answer, correct):
    assert math_answer_correct(text, answer) is correct


@pytest.mark.parametrize("text, answer", [
    ("13 + 14 = 27", 27), ("Answer: 1,234", 1234), ("The answer is -5.", -5), (r"so \boxed{42}", 42),
    ("It costs 3.50 dollars", Fraction(7, 2)), ("7 + 12 = 18", 19), ("Answer: 19.0", 19),
])
def test_exact_fast_path_agrees_with_math_verify(text, answer):
    """Where the exact check decides (a plain final number), math-verify gives the same verdict."""
    exact = bool(exact_match_reward(text, answer))
    assert math_answer_correct(text, answer) == exact == math_verify_equal(text, answer)


def test_nested_boxed():
    assert last_boxed(r"first \boxed{1}, then \boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert last_boxed(r"\boxed{unclosed") is None
    assert last_boxed("none") is None


def test_untrusted_text_never_raises():
    for text in ["\\boxed{}", "\\boxed{\\frac{", "\\" * 500, "$" * 1000, "\\frac{1}{0}", "1/0", "\x00\ufffd",
                 "\\boxed{" + "{" * 300 + "}" * 300 + "}"]:
        assert math_answer_correct(text, 1) in (True, False)


def test_math_envs_accept_latex_answers():
    arith = ArithmeticEnv(difficulty=1, num_train=10, num_eval=5)
    task = arith.tasks("eval")[0]
    assert arith.score(task, rf"The sum is $\boxed{{{task.answer}}}$")[0] == 1.0
    assert arith.score(task, rf"$\frac{{{2 * task.answer}}}{{2}}$")[0] == 1.0
    tool = ToolMathEnv(num_train=10, num_eval=5)
    task = tool.tasks("eval")[0]
    assert tool.score(task, rf"Final Answer: \boxed{{{task.answer}}}")[0] == 1.0
    assert tool.score(task, rf"Final Answer: \boxed{{{task.answer + 1}}}")[0] == 0.0


HOLDS_THE_GIL = r"\boxed{10^{10^{10^{10}}}}"  # SymPy would compute 10**(10**(10**10)) in one C loop


def test_an_answer_that_would_hold_the_gil_is_wrong_within_its_time_limit():
    """In the rollout's worker threads nothing stops a C loop that holds the GIL: the whole trainer would wait
    for it. In a process of its own (a script here, so that the old behaviour fails the test, not hangs it)."""
    script = f"""
import threading
from posttrain.envs.arithmetic import ArithmeticEnv
env = ArithmeticEnv(difficulty=1, num_train=10, num_eval=5)
env.reset(options={{"task": env.tasks("eval")[0]}})
steps = []
worker = threading.Thread(target=lambda: steps.append(env.step({HOLDS_THE_GIL!r})), daemon=True)
worker.start()
worker.join(60)
print(steps[0][1] if steps else "no answer within 60 s")
"""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "0.0", proc.stderr
    assert time.monotonic() - start < 30
    assert "Timeout" not in proc.stderr  # math-verify's warning: a timeout is a wrong answer, said nowhere


def test_a_verifier_past_its_time_limit_is_killed_and_the_next_call_gets_a_new_one():
    verifier = "posttrain.rewards.verifiable:math_verify_in_process"
    assert isolated.call(verifier, r"\boxed{\frac{14}{2}}", "7") is True  # a child that has started
    start = time.monotonic()
    with pytest.raises(isolated.NoVerdict, match="did not answer within 1 s"):
        isolated.call(verifier, r"\boxed{9^{9^{9}}}", "7", timeout=1.0)
    assert time.monotonic() - start < 3
    assert isolated.call(verifier, r"\boxed{\frac{14}{2}}", "7") is True
    with pytest.raises(RuntimeError, match="failed: AttributeError"):
        isolated.call("posttrain.rewards.verifiable:no_such_verifier", "7")


def test_an_answer_without_a_verdict_is_wrong_and_counted(monkeypatch):
    reward, info = math_answer_score(r"\boxed{\frac{14}{2}}", 7)
    assert (reward, info["correct"], info["parsed_answer"], "metrics" in info) == (1.0, True, r"\frac{14}{2}", False)
    monkeypatch.setattr(isolated, "ANSWER_TIMEOUT", 1.0)  # the child is killed before math-verify's own 5 s
    reward, info = math_answer_score(r"\boxed{9^{9^{9}}}", 7)
    assert (reward, info["correct"], info["metrics"]) == (0.0, False, {"unverified_answers": 1.0})


def test_a_module_in_the_working_directory_does_not_shadow_the_verifiers(tmp_path, monkeypatch):
    """``python -c`` puts its working directory first on sys.path: a project's own sympy.py, say."""
    (tmp_path / "sympy.py").write_text("raise SystemExit('the project folder shadowed sympy')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(isolated, "_pools", {})  # a child started from here
    assert math_answer_correct(r"\boxed{\frac{14}{2}}", 7) is True
