"""The correlation tests and the binomial tail of `analyze.significance` give scipy.stats' numbers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from polytrace_cli.analyze.significance import binomial_upper_tail, pearson, spearman


def test_hand_computed_pearson_and_spearman():
    # x = 1..4, y = 2, 4, 5, 9: x̄ = 2.5, ȳ = 5; Σdxdy = 1.5·3 + .5·1 + .5·0 + 1.5·4 = 11, Σdx² = 5, Σdy² = 26.
    r, p = pearson([1, 2, 3, 4], [2, 4, 5, 9])
    assert r == pytest.approx(11 / np.sqrt(5 * 26))
    assert 0 < p < 1
    rho, p_rho = spearman([1, 2, 3, 4], [2, 4, 5, 9])  # monotone: ρ = 1, p = 0
    assert (rho, p_rho) == (pytest.approx(1.0), 0.0)
    # Ties share their mean rank: y ranks 4, 2.5, 2.5, 1 against x ranks 1..4.
    assert spearman([1, 2, 3, 4], [40, 30, 30, 1])[0] == pytest.approx(pearson([1, 2, 3, 4], [4, 2.5, 2.5, 1])[0])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.floats(-1e3, 1e3, allow_nan=False)), min_size=3, max_size=40))
def test_the_correlation_tests_match_scipy(pairs):
    x = np.array([a for a, _ in pairs], dtype=float)
    y = np.array([b for _, b in pairs], dtype=float)
    if np.ptp(x) == 0 or np.ptp(y) < 1e-6 * max(1.0, np.abs(y).max()):
        return
    for ours, theirs in ((pearson(x, y), stats.pearsonr(x, y)), (spearman(x, y), stats.spearmanr(x, y))):
        assert ours[0] == pytest.approx(float(theirs.statistic), abs=1e-9)
        if 1 - abs(ours[0]) < 1e-9:  # |r| one in exact arithmetic: the p-value is rounding of a near-zero
            assert ours[1] < 1e-6 and theirs.pvalue < 1e-6
        else:
            assert ours[1] == pytest.approx(float(theirs.pvalue), rel=1e-6, abs=1e-12)


@pytest.mark.parametrize("successes,trials,probability", [
    (0, 10, 0.5), (10, 10, 0.5), (3, 10, 0.25), (40, 100, 0.125), (1, 1, 0.5), (700, 3000, 1 / 64)])
def test_the_binomial_tail_matches_binomtest(successes, trials, probability):
    expected = stats.binomtest(successes, trials, probability, alternative="greater").pvalue
    assert binomial_upper_tail(successes, trials, probability) == pytest.approx(expected, rel=1e-9, abs=1e-300)


def test_hand_computed_binomial_tail():
    assert binomial_upper_tail(10, 10, 0.5) == pytest.approx(0.5**10)
    assert binomial_upper_tail(9, 10, 0.5) == pytest.approx(11 / 1024)  # C(10,9) + C(10,10) = 11 of 2^10
    assert binomial_upper_tail(0, 5, 0.3) == 1.0
