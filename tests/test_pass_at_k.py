"""pass@k against values worked out by hand from 1 - C(n-c, k) / C(n, k) (Chen et al. 2021)."""

import math

import pytest

from posttrain.eval import mean_pass_at_k, pass_at_k


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (10, 0, 1, 0.0),
        (10, 3, 1, 0.3),  # pass@1 is the share correct
        (5, 2, 2, 1 - 3 / 10),  # C(3,2)/C(5,2) = 3/10
        (10, 3, 5, 1 - 21 / 252),  # C(7,5)/C(10,5) = 21/252
        (4, 1, 4, 1.0),  # every sample drawn: any correct one counts
        (10, 8, 3, 1.0),  # fewer than k wrong samples
        (200, 1, 100, 0.5),  # C(199,100)/C(200,100) = 100/200
    ],
)
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_matches_the_binomial_formula_where_it_does_not_overflow():
    for n, c, k in [(20, 4, 3), (30, 10, 7), (15, 1, 15), (12, 0, 5)]:
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12)


def test_mean_over_tasks_and_bad_input():
    assert mean_pass_at_k([(2, 1), (2, 0), (2, 2)], 1) == pytest.approx(0.5)
    assert mean_pass_at_k([(2, 1), (2, 0), (2, 2)], 2) == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)
