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
