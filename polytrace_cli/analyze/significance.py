"""Correlation coefficients and the two tests the analyses run, from scipy.special alone.

scipy.stats takes 0.6 s to import; scipy.special 0.15 s. `polytrace analyze --only stages` (or
`imbalance`) computes its tests with these and never loads scipy.stats. Each function gives what
scipy.stats' own function of the same test gives (`tests/test_significance.py`).
"""

from __future__ import annotations

import math

import numpy as np


def pearson(x, y) -> tuple[float, float]:
    """Pearson's r and its two-sided p-value under no correlation (scipy.stats.pearsonr):

        r = Σ(x − x̄)(y − ȳ) / √(Σ(x − x̄)² Σ(y − ȳ)²),   p = 2 · T_{n−2}(−|t|),   t = r √((n − 2) / (1 − r²))

    (T_ν the CDF of Student's t with ν degrees of freedom). Needs n ≥ 3 and neither side constant."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    dx, dy = x - x.mean(), y - y.mean()
    r = float(np.clip(np.dot(dx / np.linalg.norm(dx), dy / np.linalg.norm(dy)), -1.0, 1.0))
    return r, _two_sided_t(r, x.size)


def spearman(x, y) -> tuple[float, float]:
    """Spearman's ρ (Pearson's r of the ranks, ties sharing their average rank) and its two-sided p-value
    by the same t approximation (scipy.stats.spearmanr)."""
    return pearson(_average_ranks(x), _average_ranks(y))


def binomial_upper_tail(successes: int, trials: int, probability: float) -> float:
    """P(X ≥ successes) for X ~ Binomial(trials, probability): the one-sided (greater) p-value of
    scipy.stats.binomtest."""
    from scipy.special import bdtrc

    if successes <= 0:
        return 1.0
    return float(bdtrc(successes - 1, trials, probability))


def _two_sided_t(r: float, n: int) -> float:
    from scipy.special import stdtr

    if abs(r) == 1.0:
        return 0.0
    t = r * math.sqrt((n - 2) / ((1.0 - r) * (1.0 + r)))
    return float(min(1.0, 2 * stdtr(n - 2, -abs(t))))


def _average_ranks(values) -> np.ndarray:
    """1-based ranks, ties given the mean of the ranks they span."""
    values = np.asarray(values, dtype=float)
    order = np.argsort(values, kind="mergesort")
    ordered = values[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    ends = np.r_[starts[1:], ordered.size]
    ranks = np.empty(values.size)
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return ranks
