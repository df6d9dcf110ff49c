from fractions import Fraction

import pytest

from posttrain.rewards import exact_match_reward, extract_final_number


@pytest.mark.parametrize(
    "text, expected",
    [
        ("13 + 14 = 27", 27),
        ("13 + 10 = 13 + 10 = 23", 23),
        ("2 + 9 = 11\n\nThis is like the 3 examples from 1999.", 11),
        ("The answer is -5.", -5),
        ("Answer: 1,234", 1234),
        ("so we get \\boxed{42} and 7 more words", 42),
        ("It costs 3.50 dollars", Fraction(7, 2)),
        ("Let me think... 12", 12),
        ("no digits here", None),
        ("", None),
    ],
)
def test_extract_final_number(text, expected):
    assert extract_final_number(text) == (None if expected is None else Fraction(expected))


def test_exact_match_reward():
    assert exact_match_reward("7 + 12 = 19", 19) == 1.0
    assert exact_match_reward("7 + 12 = 18", 19) == 0.0
    assert exact_match_reward("nothing", 19) == 0.0
    assert exact_match_reward("Answer: 19.0", 19) == 1.0


def test_untrusted_text_never_raises():
    for text in ["\\boxed{}", "\\boxed{abc}", "=" * 1000, "Answer: ", "-", "1" * 5000, "\x00\ufffd"]:
        assert exact_match_reward(text, 1) in (0.0, 1.0)
