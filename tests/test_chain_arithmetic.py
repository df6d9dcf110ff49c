from gymnasium.utils.env_checker import check_env

from posttrain.envs import make_env
from posttrain.envs.chain_arithmetic import ChainArithmeticEnv, check_steps, solution_lines

TERMS, OPS = [12, 7, 5], ["+", "-"]  # 12 + 7 - 5 = 14


def test_check_steps_marks_each_line():
    assert check_steps(TERMS, OPS, "12 + 7 = 19\n19 - 5 = 14\nAnswer: 14") == [True, True, True]
    # A slip in line 2: it and everything after are off the path, even a lucky final number.
    assert check_steps(TERMS, OPS, "12 + 7 = 19\n19 - 5 = 13\nAnswer: 14") == [True, False, False]
    assert check_steps(TERMS, OPS, "12 + 7 = 20\n20 - 5 = 15\nAnswer: 15") == [False, False, False]
    # Wrong operand, answer given too early, prose.
    assert check_steps(TERMS, OPS, "12 + 5 = 17\n17 - 7 = 10") == [False, False]
    assert check_steps(TERMS, OPS, "12 + 7 = 19\nAnswer: 19") == [True, False]
    assert check_steps(TERMS, OPS, "Let me think.\n12 + 7 = 19") == [False, False]
    assert solution_lines("a\n\n  \nb\n") == ["a", "b"]


def test_env_scores_answers_and_steps():
    env = make_env("chain_arithmetic", {"num_train": 50, "num_eval": 10})
    check_env(env, skip_render_check=True)
    assert not {t.id for t in env.tasks("train")} & {t.id for t in env.tasks("eval")}
    obs, _ = env.reset(options={"task": env.tasks("eval")[0]})
    assert [m["role"] for m in obs] == ["user", "assistant", "user", "assistant", "user"]
    task = env.tasks("eval")[0]
    terms, ops = task.metadata["terms"], task.metadata["ops"]
    value, lines = terms[0], []
    for op, b in zip(ops, terms[1:]):
        new = value + b if op == "+" else value - b
        lines.append(f"{value} {op} {b} = {new}")
        value = new
    good = "\n".join(lines + [f"Answer: {value}"])
    _, reward, terminated, _, info = env.step(good)
    assert (reward, terminated, info["correct"], info["step_correct"]) == (1.0, True, True, [True] * len(terms))
    env.reset(options={"task": task})
    assert env.step(f"Answer: {value + 1}")[1] == 0.0
    bare = ChainArithmeticEnv(examples=0).reset(options={"task": task})[0]
    assert bare == ({"role": "user", "content": task.prompt},)
