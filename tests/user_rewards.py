"""User reward functions named in configs as 'user_rewards:NAME' (tests put tests/ on sys.path)."""


def answer_length_bonus(trajectory, per_char: float = 0.01) -> float:
    return per_char * len(trajectory.steps[-1].action)


def fails_on_long_answers(trajectory) -> float:
    """Raises for answers over 5 characters, as user code on untrusted text may."""
    if len(trajectory.steps[-1].action) > 5:
        raise ValueError("cannot score this")
    return 1.0


def not_a_number(trajectory):
    return float("nan")


def first_turn_bonus(trajectory, index, step, bonus: float = 1.0) -> float:
    return bonus if index == 0 else 0.0


from posttrain.envs.base import TextEnv  # noqa: E402
from posttrain.types import Task  # noqa: E402


class KeywordEnv(TextEnv):
    """Solved when the answer has a line 'good'; marks each line right while no line says 'bad'."""

    def __init__(self):
        super().__init__()
        tasks = [Task(f"kw-{i}", f"Say something {i}.") for i in range(12)]
        self._splits = {"train": tasks[:8], "eval": tasks[8:]}

    def score(self, task, action):
        lines = [line for line in action.split("\n") if line.strip()]
        marks, ok = [], True
        for line in lines:
            ok = ok and "bad" not in line
            marks.append(ok)
        good = any(line.strip() == "good" for line in lines)
        return float(good), {"correct": good, "step_correct": marks}
