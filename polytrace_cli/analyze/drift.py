"""drift: how response length moves over training.

Per step: mean and p99 response length (the samples of the step range's split, training by default;
for step-aggregate runs the logged `response_length/mean`, and no p99). Per run: the least-squares
line mean(step) = a + b·step (scipy `linregress`), the slope b in tokens/step with its 95% confidence interval
b ± t(0.975, n−2)·se(b), r², the relative slope b / (mean of the step means) per step, and the
Spearman rank correlation of step vs mean with its two-sided p-value (a trend test that assumes no
linearity). A trend from a few points is noise: below MIN_TREND_STEPS steps with data the slope and
its statistics are withheld (null) and `note` says why; `note` also counts the steps missing between
the first and last step with data.
"""

from __future__ import annotations

import duckdb
import polars as pl
from scipy import stats

from polytrace_cli.analyze.common import ALL_STEPS, StepRange, frame, ids_sql, samples_sql, step_aggregate_rows_sql
from polytrace_cli.analyze.registry import register

# Fewest steps with data for which a trend is reported.
MIN_TREND_STEPS = 5

SUMMARY_SCHEMA = {
    "run": pl.String, "basis": pl.String, "steps": pl.Int64, "first_step": pl.Int64, "last_step": pl.Int64,
    "mean_tokens": pl.Float64, "slope_tokens_per_step": pl.Float64, "slope_ci_low": pl.Float64,
    "slope_ci_high": pl.Float64, "intercept_tokens": pl.Float64, "r_squared": pl.Float64,
    "relative_slope_per_step": pl.Float64, "spearman_rho": pl.Float64, "spearman_p": pl.Float64,
    "missing_steps": pl.Int64, "note": pl.String,
}


PER_STEP_COLUMNS = {
    "run": pl.String, "step": pl.Int64, "basis": pl.String, "count": pl.Int64, "mean_tokens": pl.Float64,
    "p99_tokens": pl.Float64,
}


def per_step(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """Per run and step: samples, mean and p99 (`quantile_cont`) of the response length; for
    step-aggregate runs the logged mean with a null p99 (`basis` says which)."""
    sql = f"""
        WITH s AS ({samples_sql(run_ids, steps)}),
        from_samples AS (
            SELECT run_id, step, 'samples' AS basis, count(response_len) AS count,
                   avg(response_len) AS mean_tokens, quantile_cont(response_len, 0.99) AS p99_tokens
            FROM s WHERE response_len IS NOT NULL GROUP BY run_id, step
        ), from_aggregates AS (
            SELECT run_id, step, 'step_aggregates' AS basis, NULL::BIGINT AS count,
                   mean_tokens, NULL::DOUBLE AS p99_tokens
            FROM ({step_aggregate_rows_sql(run_ids, steps)}) WHERE kind = 'response'
        ), both_ AS (SELECT * FROM from_samples UNION ALL SELECT * FROM from_aggregates)
        SELECT r.name AS run, step::BIGINT AS step, basis, count, mean_tokens, p99_tokens
        FROM both_ JOIN runs r USING (run_id)
        WHERE r.run_id IN {ids_sql(run_ids)}
        ORDER BY run, step
    """
    return frame(con, sql)


def trend(steps: list[float], means: list[float]) -> dict:
    """Linear trend and rank-correlation test of a series: slope b (per step) with its 95% CI
    b ± t(0.975, n−2)·se(b), intercept, r², and Spearman ρ with its p-value (null below 3 points)."""
    n = len(steps)
    out = {"slope_tokens_per_step": None, "slope_ci_low": None, "slope_ci_high": None, "intercept_tokens": None,
           "r_squared": None, "spearman_rho": None, "spearman_p": None}
    if n < 2 or len(set(steps)) < 2:
        return out
    fit = stats.linregress(steps, means)
    out.update(slope_tokens_per_step=float(fit.slope), intercept_tokens=float(fit.intercept))
    if n >= 3:
        half = float(stats.t.ppf(0.975, n - 2) * fit.stderr)
        rho = stats.spearmanr(steps, means)
        out.update(slope_ci_low=float(fit.slope) - half, slope_ci_high=float(fit.slope) + half,
                   r_squared=float(fit.rvalue**2),
                   spearman_rho=None if rho.statistic != rho.statistic else float(rho.statistic),
                   spearman_p=None if rho.pvalue != rho.pvalue else float(rho.pvalue))
    return out


@register("drift", "response length over training: linear slope (tokens/step, 95% CI) and Spearman trend test")
def summary(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS,
            min_trend_steps: int = MIN_TREND_STEPS) -> pl.DataFrame:
    """One row per run: the trend of the per-step mean response length (see module docstring), withheld
    below `min_trend_steps` steps with data; missing_steps = last − first + 1 − steps with data."""
    rows = []
    for (run, basis), group in per_step(con, run_ids, steps).group_by(["run", "basis"], maintain_order=True):
        xs, ys = group["step"].cast(pl.Float64).to_list(), group["mean_tokens"].to_list()
        mean_of_means = sum(ys) / len(ys)
        first, last = int(min(xs)), int(max(xs))
        missing = last - first + 1 - len(set(xs))
        note = f"{missing} of steps {first}–{last} have no data" if missing else ""
        if len(xs) >= min_trend_steps:
            result = trend(xs, ys)
        else:
            result = trend([], [])
            note = "; ".join(filter(None, [f"trend withheld: {len(xs)} steps with data, at least {min_trend_steps} "
                                           "needed", note]))
        slope = result["slope_tokens_per_step"]
        rows.append({"run": run, "basis": basis, "steps": len(xs), "first_step": first, "last_step": last,
                     "mean_tokens": mean_of_means, **result,
                     "relative_slope_per_step": slope / mean_of_means if slope is not None and mean_of_means else None,
                     "missing_steps": missing, "note": note or None})
    return pl.DataFrame(rows, schema=SUMMARY_SCHEMA).select(list(SUMMARY_SCHEMA)).sort("run")
