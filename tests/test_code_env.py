"""The code environment: code extraction, test-fraction rewards in the sandbox, revisions, task sources."""

import json
import time

import pytest

from posttrain.envs import make_env
from posttrain.envs.code import CodeEnv, extract_code, join_solution
from posttrain.envs.code_tasks import code_task, generated_tasks, humaneval_problems
from posttrain.types import Task

ADD = code_task("add", "Write `add(a, b)` that returns a + b.", "add",
                ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(0, 5) == 5", "assert add(2, 2) == 4"])


@pytest.fixture(scope="module")
def env():
    return CodeEnv()


@pytest.mark.parametrize(
    "answer, expected",
    [
        ("Here:\n```python\ndef f(x):\n    return x\n```\nDone.", "def f(x):\n    return x\n"),
        ("```py\nimport math\n```\nthen\n```python\ndef f(x):\n    return 1\n```", "def f(x):\n    return 1\n"),
        ("```python\ndef g():\n    pass\n```\n```python\nprint(g())\n```", "def g():\n    pass\n\nprint(g())\n"),
        ("```python\ndef f(x):\n    return 2 * x", "def f(x):\n    return 2 * x"),  # unclosed fence
        ("Sure! Here it is:\ndef f(x):\n    return x + 1\nThis adds one.", "def f(x):\n    return x + 1"),
        ("    return x + 1\n", "    return x + 1\n"),  # a bare body, for header completion
        ("```\ndef f(x):\n    return 3\n```", "def f(x):\n    return 3\n"),  # fence without a language
        ("def f(x):\n    return x\nnums = [\n1,\n2,", "def f(x):\n    return x"),  # a bracket left open
        ("def f(x):\n    return x\nx = 1\0\ny = 2", "def f(x):\n    return x"),  # compile refuses NUL
        ("Use ``` for code: def f", "Use ``` for code: def f"),  # a fence with no line after it
    ],
)
def test_extract_code(answer, expected):
    assert extract_code(answer, "f") == expected


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("def f(x):\n    return x\nnums = [\n" + "1,\n" * 8_000, "def f(x):\n    return x"),
        ("def f(x):\n    return x\n" + "and this is why.\n" * 8_000, "def f(x):\n    return x"),
        ("def \n" * 8_000, ("def \n" * 8_000).rstrip("\n")),
        ("`" * 40_000, "`" * 40_000),
        ("``` " * 10_000, "``` " * 10_000),
    ],
    ids=["open-list", "prose", "def-lines", "backticks", "fences"],
)
def test_a_long_hostile_reply_is_reduced_to_code_at_once(reply, expected):
    """Extraction holds the GIL, so work quadratic in a reply's length stalls every thread of the trainer: before,
    an unclosed list of 8,000 items after the code took 37 s (one compile per dropped line), 40,000 backticks 0.9 s."""
    start = time.monotonic()
    assert extract_code(reply, "f") == expected
    assert time.monotonic() - start < 1


def test_join_solution_completes_a_header_or_appends_a_full_function():
    header = "def f(x):\n    \"\"\"Double x.\"\"\"\n"
    assert join_solution(header, "    return 2 * x\n") == header + "    return 2 * x\n"
    assert join_solution(header, "def f(x):\n    return 2 * x") == header + "\ndef f(x):\n    return 2 * x"
    assert join_solution("", "x = 1") == "x = 1"


@pytest.mark.parametrize(
    "body, reward",
    [
        ("return a + b", 1.0),
        ("return a + b if a > 0 else -1", 0.5),  # passes add(1, 2) and add(2, 2) only
        ("return 4", 0.25),
        ("return None", 0.0),
        ("while True: pass", 0.0),  # every test hits its own time limit
        ("import os; os._exit(0)", 0.0),  # ends the program before any report
        ("raise SystemExit(0)", 0.0),
    ],
)
def test_reward_is_the_fraction_of_tests_passed(env, body, reward):
    got, info = env.score(ADD, f"```python\ndef add(a, b):\n    {body}\n```")
    assert got == reward
    assert info["correct"] == (reward == 1.0) and info["total"] == 4


def test_broken_and_hostile_answers_score_zero_without_raising(env):
    for answer in ["", "no code at all", "```python\ndef add(a, b)\n    return\n```", "```python\nimport socket\n"
                   "socket.create_connection(('127.0.0.1', 22))\n```", "```python\nprint('@@posttrain-fake@@[0, true, \"\"]')\n"
                   "def add(a, b):\n    return -7\n```"]:
        reward, info = env.score(ADD, answer)
        assert reward == 0.0, answer


_ALWAYS_EQUAL = "class Liar{base}:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"


@pytest.mark.parametrize("answer", [
    _ALWAYS_EQUAL.format(base="") + "def add(a, b):\n    return Liar()",
    _ALWAYS_EQUAL.format(base="(int)") + "def add(a, b):\n    return Liar(0)",  # a subclass of int
    _ALWAYS_EQUAL.format(base="") + "def add(a, b):\n    return (Liar(),)[0]",
    # A metaclass whose == says "I am int", for a check that compares types with ==.
    "class Meta(type):\n    def __eq__(cls, other):\n        return True\n    __hash__ = type.__hash__\n"
    + _ALWAYS_EQUAL.format(base="(metaclass=Meta)") + "def add(a, b):\n    return Liar()",
    "class Truthy:\n    def __bool__(self):\n        return True\ndef add(a, b):\n    return Truthy()",
], ids=["eq-always-true", "int-subclass", "via-tuple", "metaclass-eq", "bool-always-true"])
def test_objects_that_lie_about_comparisons_earn_nothing(env, answer):
    task = code_task("add", "Write `add(a, b)`.", "add", ["assert add(1, 2) == 3", "assert candidate(2, 2) == 4",
                                                          "assert add(1, 1)"])
    reward, info = env.score(task, f"```python\n{answer}\n```")
    assert reward == 0.0 and info["passed"] == 0
    assert "expected plain data" in env.check(task, answer).messages[0]


def test_a_solution_shadowing_what_the_tests_use_earns_nothing(env):
    """Tests run beside the task's header, not the solution's names: its own `abs` changes nothing."""
    task = code_task("half", "Write `half(x)`.", "half", ["assert abs(half(1) - 0.5) < 1e-9"])
    hack = "def abs(x):\n    return 0\ndef half(x):\n    return 99.0"
    assert env.score(task, hack)[0] == 0.0
    assert env.score(task, "def half(x):\n    return x / 2")[0] == 1.0


def test_one_looping_test_does_not_lose_the_others(env):
    task = code_task("loop", "", "f", ["assert f(1) == 1", "assert f(-1) == 0", "assert f(2) == 2"])
    reward, _ = env.score(task, "def f(x):\n    while x < 0:\n        pass\n    return x\n")
    assert reward == pytest.approx(2 / 3)


def test_multi_turn_revision_shows_failures_and_records_progress():
    env = CodeEnv(max_attempts=3)
    prompt, _ = env.reset(options={"task": ADD})
    assert "add(a, b)" in prompt and "```python" in prompt
    obs, reward, terminated, truncated, info = env.step("```python\ndef add(a, b):\n    return 4\n```")
    assert not terminated and reward == 0.25 and info["progress"] == 0.25 and info["attempt"] == 1
    assert "passed 1 of 4" in obs and "assert add(1, 2) == 3" in obs and "got 4" in obs
    obs, reward, terminated, _, info = env.step("```python\ndef add(a, b):\n    return a + b if a > 0 else -1\n```")
    assert not terminated and reward == 0.25 and info["pass_fraction"] == 0.5  # progress: 0.5 - 0.25
    obs, reward, terminated, _, info = env.step("```python\ndef add(a, b):\n    return a + b\n```")
    assert terminated and reward == 0.5 and info["correct"] and info["pass_fraction"] == 1.0
    # Step rewards sum to the last attempt's pass fraction: the episode's return, solved or not.
    env.reset(options={"task": ADD})
    _, reward, terminated, _, _ = env.step("```python\ndef add(a, b):\n    return a + b\n```")
    assert terminated and reward == 1.0  # solved at the first attempt
    env.reset(options={"task": ADD})
    rewards = [env.step(f"```python\ndef add(a, b):\n    {body}\n```")[1] for body in ("return 4", "return None", "return 4")]
    assert rewards == [0.25, -0.25, 0.25] and sum(rewards) == 0.25


def test_generated_tasks_are_deterministic_disjoint_and_solvable(env):
    a, b = generated_tasks(seed=0), generated_tasks(seed=0)
    assert [t.id for t in a["eval"]] == [t.id for t in b["eval"]]
    assert not {t.id for t in a["train"]} & {t.id for t in a["eval"]}
    assert len(a["eval"]) == 40 and len(a["train"]) > 40
    for task in a["eval"][:5]:
        assert len(task.metadata["tests"]) == 4
        assert env.score(task, "")[0] == 0.0


def test_user_jsonl_tasks(tmp_path):
    rows = [
        {"prompt": "Write `double(x)` returning 2 * x.", "entry_point": "double",
         "tests": ["assert double(2) == 4", "assert double(0) == 0"], "split": "train"},
        {"prompt": "def triple(x):\n    \"\"\"Return 3 * x.\"\"\"\n", "entry_point": "triple",
         "tests": "assert candidate(3) == 9", "split": "eval", "id": "t3"},
    ]
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    env = make_env("code", {"source": str(path)})
    [train], [held_out] = env.tasks("train"), env.tasks("eval")
    assert held_out.id == "t3" and "def triple(x):" in held_out.prompt
    assert env.score(train, "```python\ndef double(x):\n    return x + x\n```")[0] == 1.0
    assert env.score(held_out, "    return 3 * x\n")[0] == 1.0  # a body completing the header
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        make_env("code", {"source": str(bad)})


def test_humaneval_canonical_solutions_all_pass_and_bare_prompts_fail():
    """All 164 problems, run in the sandbox as the environment runs them."""
    from concurrent.futures import ThreadPoolExecutor

    env = make_env("code", {"source": "humaneval"})
    tasks, problems = env.tasks("eval"), {p["task_id"]: p for p in humaneval_problems()}
    assert len(tasks) == 164 and env.tasks("train") == []
    with ThreadPoolExecutor(4) as pool:
        canonical = list(pool.map(lambda t: env.score(t, problems[t.id]["canonical_solution"])[0], tasks))
        bare = list(pool.map(lambda t: env.score(t, "")[0], tasks))
    assert [t.id for t, r in zip(tasks, canonical) if r != 1.0] == []
    assert [t.id for t, r in zip(tasks, bare) if r != 0.0] == []


def test_unknown_source_is_a_config_error():
    from posttrain.envs import EnvError

    with pytest.raises(EnvError, match="source"):
        make_env("code", {"source": "leetcode"})
    with pytest.raises(EnvError, match="max_attempts"):
        make_env("code", {"max_attempts": 0})


def test_task_type():
    assert isinstance(ADD, Task) and ADD.metadata["entry_point"] == "add"


@pytest.mark.slow
def test_train_and_eval_pass_at_k_on_the_code_env_through_the_cli(tmp_path):
    """Two GRPO steps of the tiny model on generated code tasks, then `posttrain eval` with pass@k."""
    from test_train_e2e import run_cli, tiny_config

    config = tiny_config(tmp_path, env={"id": "code", "kwargs": {"source": "generated", "num_eval": 4}},
                         algorithm={"beta": 0.0}, eval={"num_tasks": 2}, rollout={"max_new_tokens": 24})
    proc = run_cli("train", config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2] and all(r["errors"] == 0 for r in train)
    assert all("pass@1" in r for r in records if r["split"] == "eval")
    proc = run_cli("eval", config, "--json", "--set", "eval.samples_per_task=3", "--set", "eval.pass_k=2",
                   "--set", "eval.temperature=1.0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["num_tasks"] == 2 and 0.0 <= result["pass@1"] <= result["pass@2"] <= 1.0
    proc = run_cli("eval", config, "--set", "eval.samples_per_task=2", "--set", "eval.pass_k=3")
    assert proc.returncode == 2 and "eval.pass_k" in proc.stderr and "Traceback" not in proc.stderr
