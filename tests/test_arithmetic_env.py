import re

import pytest
from gymnasium.utils.env_checker import check_env

from posttrain.envs import EnvError, make_env, registered
from posttrain.envs.arithmetic import ArithmeticEnv, eval_expression


def test_passes_gymnasium_check_env():
    check_env(ArithmeticEnv(), skip_render_check=True)


@pytest.mark.parametrize("difficulty", [1, 2, 3, 4, 5])
def test_splits_are_disjoint_and_answers_correct(difficulty):
    env = ArithmeticEnv(difficulty=difficulty, num_eval=50, num_train=200, word_problems=True)
    train, held_out = env.tasks("train"), env.tasks("eval")
    assert len(held_out) == 50 and len(train) > 0
    train_exprs = {t.metadata["expression"] for t in train}
    assert not train_exprs & {t.metadata["expression"] for t in held_out}
    for task in list(train) + list(held_out):
        assert task.answer == eval_expression(task.metadata["expression"])
        # Python's own arithmetic agrees (the expressions use + - * only).
        assert task.answer == eval(task.metadata["expression"])  # noqa: S307 - our own generated text


def test_same_seed_same_tasks_other_seed_other_tasks():
    a = [t.id for t in ArithmeticEnv(seed=1).tasks("eval")]
    assert a == [t.id for t in ArithmeticEnv(seed=1).tasks("eval")]
    assert a != [t.id for t in ArithmeticEnv(seed=2).tasks("eval")]


def test_difficulty_1_is_additions_of_1_to_20():
    for task in ArithmeticEnv(difficulty=1).tasks("train"):
        a, b = map(int, re.fullmatch(r"(\d+) \+ (\d+)", task.metadata["expression"]).groups())
        assert 1 <= a <= 20 and 1 <= b <= 20


def test_episode_rewards_exact_answer():
    env = ArithmeticEnv()
    task = env.tasks("eval")[0]
    obs, info = env.reset(options={"task": task})
    assert obs == task.prompt and info["task_id"] == task.id
    _, reward, terminated, truncated, info = env.step(f"The result is {task.answer}.")
    assert (reward, terminated, truncated, info["correct"]) == (1.0, True, False, True)
    env.reset(options={"task": task})
    _, reward, *_ , info = env.step(f"{task.answer + 1}")
    assert reward == 0.0 and info["correct"] is False


def test_registry_and_errors():
    assert "arithmetic" in {s.id for s in registered()}
    assert isinstance(make_env("posttrain.envs.arithmetic:ArithmeticEnv", {"difficulty": 2}), ArithmeticEnv)
    with pytest.raises(EnvError, match="not registered"):
        make_env("arithmatic")
    with pytest.raises(EnvError, match="difficulty must be 1-5"):
        make_env("arithmetic", {"difficulty": 9})
    with pytest.raises(EnvError, match="unexpected keyword"):
        make_env("arithmetic", {"dificulty": 2})
    with pytest.raises(EnvError, match="cannot import"):
        make_env("no_such_pkg.mod:Env")


def test_mixed_difficulty_interleaves_levels_and_labels_tasks():
    env = ArithmeticEnv(difficulty=[1, 3, 5], num_eval=20, num_train=300)
    held_out, train = env.tasks("eval"), env.tasks("train")
    assert [t.metadata["difficulty"] for t in held_out[:6]] == [1, 3, 5, 1, 3, 5]
    assert {t.metadata["difficulty"] for t in train} == {1, 3, 5} and len(train) == 900
    assert not {t.id for t in train} & {t.id for t in held_out}
    single = ArithmeticEnv(difficulty=3, num_eval=20, num_train=300)
    assert [t.id for t in single.tasks("eval")] == [t.id for t in held_out if t.metadata["difficulty"] == 3]
    with pytest.raises(ValueError, match="list of distinct levels"):
        ArithmeticEnv(difficulty=[1, 1])
