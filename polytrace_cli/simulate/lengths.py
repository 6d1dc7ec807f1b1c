"""Each step's response lengths, for the policies that cut or carry responses.

From per-sample traces when the run has them (training samples, tp rank 0): the logged lengths.
Otherwise one distribution fitted per step from the logged aggregates, and the step is represented
by its n quantile points lengths_i = F⁻¹((i − ½) / n), i = 1..n (n = n_responses):

    unclipped (clip ratio 0 or not logged):  X ~ lognormal(μ, σ) with mean m = e^{μ+σ²/2} and
        the step's max at the (1 − 1/(n+1)) quantile: ln r_max = μ + σ·z,  so
        σ = z − √(z² − 2·ln(r_max/m))   (σ = z when the root is not real)
    clipped (clip ratio c > 0 and a cap L):  min(X, L) with P(X ≥ L) = c, so μ = ln L − σ·z_c
        (z_c = Φ⁻¹(1 − c)), and σ solves E[min(X, L)] = e^{μ+σ²/2}·Φ((ln L − μ − σ²)/σ) + c·L = m
        (bisection on σ ∈ [0.01, 4]).

In both cases the points are then adjusted so that the largest is the logged r_max and the sum is the
logged response_tokens (the others scaled), so that a policy that changes nothing reproduces the
logged workload.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np
import polars as pl
from scipy.special import ndtr, ndtri

from polytrace_cli.store.catalog import steps_of_runs_sql

SAMPLES_BASIS = "per-sample traces"
FITTED_BASIS = "a lognormal fitted per step from the logged mean, max and clip ratio"


@dataclass(frozen=True)
class StepLengths:
    """Per workload-frame row, the step's response lengths (None when unknown), and their basis."""

    lengths: list[np.ndarray | None]
    basis: str

    @property
    def known(self) -> int:
        """Rows with lengths."""
        return sum(x is not None for x in self.lengths)


def _fit_sigma_unclipped(mean: np.ndarray, r_max: np.ndarray, n: np.ndarray) -> np.ndarray:
    z = ndtri(1.0 - 1.0 / (n + 1.0))
    ratio = np.log(np.maximum(r_max / mean, 1.0))
    disc = z * z - 2.0 * ratio
    return np.where(disc > 0, z - np.sqrt(np.maximum(disc, 0.0)), z)


def _fit_sigma_clipped(mean: np.ndarray, clip: np.ndarray, cap: float) -> np.ndarray:
    z_c = ndtri(1.0 - clip)
    log_cap = np.log(cap)

    def clipped_mean(sigma: np.ndarray) -> np.ndarray:
        mu = log_cap - sigma * z_c
        return np.exp(mu + sigma * sigma / 2) * ndtr((log_cap - mu - sigma * sigma) / sigma) + clip * cap

    low, high = np.full(mean.shape, 0.01), np.full(mean.shape, 4.0)
    for _ in range(60):
        mid = (low + high) / 2
        # A larger σ puts more mass far below the cap (μ falls), so the clipped mean falls.
        too_high = clipped_mean(mid) > mean
        low, high = np.where(too_high, mid, low), np.where(too_high, high, mid)
    return (low + high) / 2


def _adjust(points: np.ndarray, r_max: float, total: float) -> np.ndarray:
    """Set the largest point to r_max and scale the others so that the points sum to total."""
    points = np.sort(points)
    points[-1] = r_max
    rest = points[:-1].sum()
    if rest > 0 and total > r_max:
        points[:-1] *= (total - r_max) / rest
    return np.minimum(points, r_max)


def fitted_lengths(frame: pl.DataFrame, response_length_mean: np.ndarray, clip_ratio: np.ndarray,
                   cap: float | None) -> list[np.ndarray | None]:
    """Quantile points of the per-step fitted distribution (see the module docstring)."""
    n = frame["n_responses"].fill_null(np.nan).to_numpy()
    r_max = frame["r_max"].fill_null(np.nan).to_numpy()
    total = frame["response_tokens"].fill_null(np.nan).to_numpy()
    mean = response_length_mean
    usable = np.isfinite(n) & (n >= 1) & np.isfinite(r_max) & np.isfinite(mean) & (mean > 0) & np.isfinite(total)
    clipped = usable & np.isfinite(clip_ratio) & (clip_ratio > 0) & (clip_ratio < 1) & (cap is not None)
    safe_mean = np.where(usable, mean, 1.0)
    sigma = _fit_sigma_unclipped(safe_mean, np.where(usable, r_max, 1.0), np.where(usable, n, 1.0))
    mu = np.log(safe_mean) - sigma * sigma / 2
    if clipped.any():
        clip_sigma = _fit_sigma_clipped(safe_mean, np.where(clipped, clip_ratio, 0.5), float(cap or 1.0))
        sigma = np.where(clipped, clip_sigma, sigma)
        mu = np.where(clipped, np.log(float(cap or 1.0)) - clip_sigma * ndtri(1.0 - np.where(clipped, clip_ratio, 0.5)),
                      mu)
    out: list[np.ndarray | None] = []
    for row in range(frame.height):
        if not usable[row]:
            out.append(None)
            continue
        count = int(round(n[row]))
        points = np.exp(mu[row] + sigma[row] * ndtri((np.arange(count) + 0.5) / count))
        if clipped[row]:
            points = np.minimum(points, cap)
        out.append(_adjust(points, float(r_max[row]), float(total[row])))
    return out


def step_lengths(con: duckdb.DuckDBPyConnection, run_id: int, frame: pl.DataFrame, meta: dict) -> StepLengths:
    """Each frame row's response lengths: per-sample traces when the run has them, else fitted."""
    samples = con.sql(f"""
        SELECT step, list(response_len::DOUBLE ORDER BY response_len) AS lengths
        FROM samples
        WHERE run_id = {int(run_id)} AND NOT coalesce(validate, false) AND response_len IS NOT NULL
          AND coalesce(tp_rank, 0) = 0
        GROUP BY step
    """).pl()
    if samples.height:
        by_step = {step: np.asarray(values, dtype=float) for step, values in samples.iter_rows()}
        return StepLengths([by_step.get(step) for step in frame["step"].to_list()], SAMPLES_BASIS)
    logged = con.sql(f"""
        SELECT segment::BIGINT AS segment, step::BIGINT AS step, response_length_mean, clip_ratio
        FROM ({steps_of_runs_sql(f"({int(run_id)})", ["response_length_mean", "clip_ratio"])})
    """).pl()
    joined = frame.select("segment", "step").join(logged, on=["segment", "step"], how="left")
    cap = meta.get("max_response_len")
    if not isinstance(cap, (int, float)) or cap <= 0:
        clip = joined["clip_ratio"].fill_null(0).to_numpy()
        # Without a logged cap, a step with clipped responses shows it as its longest response.
        capped = frame["r_max"].filter(pl.Series(clip > 0))
        cap = float(capped.max()) if capped.len() else None
    lengths = fitted_lengths(frame, joined["response_length_mean"].fill_null(np.nan).to_numpy(),
                             joined["clip_ratio"].fill_null(np.nan).to_numpy(), cap)
    return StepLengths(lengths, FITTED_BASIS)
