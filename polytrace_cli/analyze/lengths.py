"""lengths: prompt, response and total (prompt + response) length distributions.

Per run, per step and per kind: count, mean, std (sample), min, p50, p90, p99 (linear interpolation,
`quantile_cont`), max, CV = std / mean, skewness and excess kurtosis (bias-corrected sample
estimators, as pandas' `skew`/`kurt` and scipy's `skew(bias=False)`/`kurtosis(bias=False)`), clip
ratio, and the tail ratios p99/p50 and max/p50. Also the whole-run CDF and the prompt–response
correlation.

The samples counted are the step range's split (`common.samples_sql`): the training samples by
default (rows with `validate = true` left out everywhere), the validation samples (`validate =
true`) alone in the validation split. The cap stays the run's in both (known, or evident from its
training responses), and the step-aggregate fallback below is training only.

The length cap of a run (`cap_tokens`) is `runs.meta.max_response_len` when the ingester recorded
it (`cap_source = 'known'`); otherwise it is *evident* when the run's longest response length is
shared by at least 1% of its responses and by at least 3 of them (`cap_source = 'evident'`): real
length distributions have a single longest response unless generation was cut at a cap. With no cap
the clip ratio is null. Clip ratio = (responses with length >= cap) / responses.

Runs with only per-step aggregates (console logs, `steps` view) get what those support: per step
the logged mean, min, max and clip ratio (`basis = 'step_aggregates'`); per run the mean of the
step means, the min of the mins, the max of the maxes and the mean clip ratio, marked
`estimate = true` (the pooled mean and clip ratio weight every step equally). No std, percentiles
or shape statistics are reported for them.
"""

from __future__ import annotations

import duckdb
import polars as pl

from polytrace_cli.analyze.common import (
    ALL_STEPS, StepRange, caps_sql, frame, samples_sql, small_frame, step_aggregate_rows_sql,
)
from polytrace_cli.analyze.registry import register

KINDS = ("prompt", "response", "total")

# Summary column names other modules read (`polytrace check`).
KIND, CLIP_RATIO, P99_P50 = "kind", "clip_ratio", "p99_p50"

_STAT_COLUMNS = ["count", "mean_tokens", "std_tokens", "min_tokens", "p50_tokens", "p90_tokens", "p99_tokens",
                 "max_tokens", "cv", "skewness", "kurtosis", CLIP_RATIO, P99_P50, "max_p50"]


def caps(con: duckdb.DuckDBPyConnection, run_ids: list[int]) -> pl.DataFrame:
    """Per run: the response length cap and where it comes from.

    cap = runs.meta.max_response_len if recorded ('known'); else the run's maximum response length
    when >= 1% of its training responses and >= 3 of them equal it ('evident'); else null.
    """
    return frame(con, f"SELECT run, cap_tokens, cap_source FROM ({caps_sql(run_ids)}) ORDER BY run")


def _ratio_sql(num: str, den: str) -> str:
    """SQL of num / den as DOUBLE, null where the divisor is 0 or null (as `_with_ratios`)."""
    return f"CASE WHEN {den} > 0 THEN ({num} / {den})::DOUBLE END"


def _with_ratios(df: pl.DataFrame) -> pl.DataFrame:
    """Add CV = std/mean and the tail ratios p99/p50 and max/p50 (null where the divisor is 0 or null)."""

    def ratio(num: str, den: str) -> pl.Expr:
        return pl.when(pl.col(den) > 0).then(pl.col(num) / pl.col(den)).otherwise(None)

    return df.with_columns(
        ratio("std_tokens", "mean_tokens").alias("cv"),
        ratio("p99_tokens", "p50_tokens").alias("p99_p50"),
        ratio("max_tokens", "p50_tokens").alias("max_p50"),
    )


def _sample_stats(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange, by_step: bool) -> pl.DataFrame:
    step_col = "step, " if by_step else ""
    sql = f"""
        WITH cap AS ({caps_sql(run_ids)}),
        s AS ({samples_sql(run_ids, steps)}),
        long AS (
            SELECT run_id, step, 'prompt' AS kind, prompt_len AS len, NULL::BOOLEAN AS at_cap FROM s
            UNION ALL
            SELECT s.run_id, s.step, 'response', s.response_len, s.response_len >= cap.cap_tokens
            FROM s JOIN cap ON s.run_id = cap.run_id
            UNION ALL
            SELECT run_id, step, 'total', prompt_len + response_len, NULL FROM s
        ), agg AS (
            SELECT run_id, {step_col} kind,
                   count(DISTINCT step) AS steps,
                   count(len) AS count, avg(len) AS mean_tokens, stddev_samp(len) AS std_tokens,
                   min(len)::DOUBLE AS min_tokens, quantile_cont(len, [0.5, 0.9, 0.99]) AS q,
                   max(len)::DOUBLE AS max_tokens, skewness(len) AS skewness, kurtosis(len) AS kurtosis,
                   avg(at_cap::DOUBLE) FILTER (WHERE len IS NOT NULL) AS clip_ratio
            FROM long GROUP BY ALL
        )
        SELECT r.name AS run, {step_col} kind, 'samples' AS basis, steps, count, mean_tokens, std_tokens, min_tokens,
               q[1] AS p50_tokens, q[2] AS p90_tokens, q[3] AS p99_tokens, max_tokens, skewness, kurtosis, clip_ratio
        FROM agg JOIN runs r USING (run_id)
        WHERE count > 0
    """
    return _with_ratios(frame(con, sql))


def _pooled_sample_stats_sql(run_ids: list[int], steps: StepRange) -> str:
    """SQL of the statistics of `_sample_stats` pooled over all selected steps, from a histogram: one
    row per run and kind (run_id, run, kind, basis, steps, count, mean_tokens, std_tokens, min_tokens,
    p50/p90/p99_tokens, max_tokens, skewness, kurtosis, clip_ratio). It reads the runs' caps from a
    relation `cap` (`caps_sql`) that the enclosing query defines.

    Lengths are integers, so each (run, kind) is first reduced to distinct values x with counts c
    (a hash aggregate instead of sorting every sample). Over the histogram, with n = Σc and
    μ = Σc·x / n, m_k = Σc·(x − μ)^k / n:
        std      = sqrt(Σc·(x − μ)² / (n − 1))
        skewness = m3 / m2^1.5 · sqrt(n(n − 1)) / (n − 2)                    (n > 2)
        kurtosis = (n − 1)((n + 1)(m4 / m2² − 3) + 6) / ((n − 2)(n − 3))     (n > 3)
        p_q      = v_lo + (h − ⌊h⌋)(v_hi − v_lo), h = (n − 1)q, v_lo and v_hi the values at
                   0-based sorted positions ⌊h⌋ and ⌈h⌉ (the first x whose cumulative count
                   exceeds the position): the same linear interpolation as `quantile_cont`.
    """
    quantiles = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
    picks = ",\n".join(
        f"min(x) FILTER (WHERE upto > floor((n - 1) * {q})) AS {name}_lo, "
        f"min(x) FILTER (WHERE upto > ceil((n - 1) * {q})) AS {name}_hi"
        for name, q in quantiles.items()
    )
    interpolated = ", ".join(
        f"{name}_lo + ((n - 1) * {q} - floor((n - 1) * {q})) * ({name}_hi - {name}_lo) AS {name}_tokens"
        for name, q in quantiles.items()
    )
    return f"""
        WITH s AS ({samples_sql(run_ids, steps)}),
        long AS (
            SELECT run_id, 'prompt' AS kind, prompt_len AS len FROM s
            UNION ALL SELECT run_id, 'response', response_len FROM s
            UNION ALL SELECT run_id, 'total', prompt_len + response_len FROM s
        ), h AS (
            SELECT run_id, kind, len::DOUBLE AS x, count(*)::DOUBLE AS c FROM long WHERE len IS NOT NULL GROUP BY ALL
        ), w AS (
            SELECT *, sum(c) OVER (PARTITION BY run_id, kind ORDER BY x) AS upto,
                      sum(c) OVER (PARTITION BY run_id, kind) AS n,
                      sum(c * x) OVER (PARTITION BY run_id, kind) / sum(c) OVER (PARTITION BY run_id, kind) AS mu
            FROM h
        ), agg AS (
            SELECT w.run_id, kind, any_value(n) AS n, any_value(mu) AS mu, min(x) AS min_tokens, max(x) AS max_tokens,
                   sum(c * (x - mu) ^ 2) AS s2, sum(c * (x - mu) ^ 3) AS s3, sum(c * (x - mu) ^ 4) AS s4,
                   {picks},
                   CASE WHEN kind = 'response' AND any_value(cap.cap_tokens) IS NOT NULL
                        THEN coalesce(sum(c) FILTER (WHERE x >= cap.cap_tokens), 0) / any_value(n) END AS clip_ratio
            FROM w LEFT JOIN cap ON cap.run_id = w.run_id
            GROUP BY w.run_id, kind
        ), st AS (SELECT run_id, count(DISTINCT step) AS steps FROM s GROUP BY run_id)
        SELECT run_id, r.name AS run, kind, 'samples' AS basis, st.steps, n::BIGINT AS count, mu AS mean_tokens,
               CASE WHEN n > 1 THEN sqrt(s2 / (n - 1)) END AS std_tokens, min_tokens, {interpolated}, max_tokens,
               CASE WHEN n > 2 AND s2 > 0 THEN (s3 / n) / pow(s2 / n, 1.5) * sqrt(n * (n - 1)) / (n - 2) END AS skewness,
               CASE WHEN n > 3 AND s2 > 0
                    THEN (n - 1) * ((n + 1) * ((s4 / n) / pow(s2 / n, 2) - 3) + 6) / ((n - 2) * (n - 3)) END AS kurtosis,
               clip_ratio
        FROM agg JOIN runs r USING (run_id) JOIN st USING (run_id)
    """


def _aggregate_stats_sql(run_ids: list[int], steps: StepRange, by_step: bool) -> str:
    """SQL of the step-aggregate rows: per run (and step) and kind, the mean of the logged means, the
    min of the mins, the max of the maxes and the mean clip ratio (run_id, run, [step,] kind, basis,
    steps, then the columns of `_sample_stats`, null where the aggregates cannot give them)."""
    step_col = "step, " if by_step else ""
    return f"""
        WITH a AS ({step_aggregate_rows_sql(run_ids, steps)})
        SELECT run_id, r.name AS run, {step_col} kind, 'step_aggregates' AS basis, count(DISTINCT step) AS steps,
               NULL::BIGINT AS count, avg(mean_tokens) AS mean_tokens, NULL::DOUBLE AS std_tokens,
               min(min_tokens) AS min_tokens, NULL::DOUBLE AS p50_tokens, NULL::DOUBLE AS p90_tokens,
               NULL::DOUBLE AS p99_tokens, max(max_tokens) AS max_tokens, NULL::DOUBLE AS skewness,
               NULL::DOUBLE AS kurtosis, avg(clip_ratio) AS clip_ratio
        FROM a JOIN runs r USING (run_id) GROUP BY ALL
    """


def _aggregate_stats(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange, by_step: bool) -> pl.DataFrame:
    return _with_ratios(frame(con, _aggregate_stats_sql(run_ids, steps, by_step)).drop("run_id"))


def _order(df: pl.DataFrame, by_step: bool) -> pl.DataFrame:
    kind_rank = pl.col("kind").replace_strict({k: i for i, k in enumerate(KINDS)}, default=len(KINDS))
    keys = ["run", "step"] if by_step else ["run"]
    return df.sort([*(pl.col(k) for k in keys), kind_rank])


def _combine(samples: pl.DataFrame, aggregates: pl.DataFrame, by_step: bool) -> pl.DataFrame:
    """Sample and step-aggregate rows in one frame. `estimate` marks rows whose numbers only
    approximate the run's samples: pooled step aggregates (mean of step means, mean of step clip
    ratios: exact only when every step had the same number of responses). A step's own logged
    mean, min, max and clip ratio are exact, so per-step rows are never estimates."""
    head = ["run", "step", "kind", "basis", "steps"] if by_step else ["run", "kind", "basis", "steps"]
    columns = head + _STAT_COLUMNS
    parts = [df.select(columns) for df in (samples, aggregates) if df.height]
    combined = pl.concat(parts, how="vertical_relaxed") if parts else samples.select(columns)
    estimate = pl.lit(False) if by_step else pl.col("basis") == "step_aggregates"
    combined = combined.with_columns(estimate.alias("estimate")).select(*head[:-1], "estimate", *columns[len(head) - 1:])
    return _order(combined, by_step) if parts else combined


PER_STEP_COLUMNS = {
    "run": pl.String, "step": pl.Int64, "kind": pl.String, "basis": pl.String, "estimate": pl.Boolean,
    "count": pl.Int64, "mean_tokens": pl.Float64, "std_tokens": pl.Float64, "min_tokens": pl.Float64,
    "p50_tokens": pl.Float64, "p90_tokens": pl.Float64, "p99_tokens": pl.Float64, "max_tokens": pl.Float64,
    "cv": pl.Float64, "skewness": pl.Float64, "kurtosis": pl.Float64, "clip_ratio": pl.Float64,
    "p99_p50": pl.Float64, "max_p50": pl.Float64,
}


def per_step(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """Per run, step and kind (prompt, response, total): count, mean, std, min, p50, p90, p99, max,
    CV = std/mean, skewness, excess kurtosis, clip ratio = share of responses >= the run's cap
    (response rows only), p99/p50 and max/p50. Step-aggregate runs: logged mean/min/max/clip ratio."""
    result = _combine(_sample_stats(con, run_ids, steps, True), _aggregate_stats(con, run_ids, steps, True), True)
    return result.drop("steps")


SUMMARY_COLUMNS = {
    "run": pl.String, "kind": pl.String, "basis": pl.String, "estimate": pl.Boolean, "steps": pl.Int64,
    "count": pl.Int64, "mean_tokens": pl.Float64, "std_tokens": pl.Float64, "min_tokens": pl.Float64,
    "p50_tokens": pl.Float64, "p90_tokens": pl.Float64, "p99_tokens": pl.Float64, "max_tokens": pl.Float64,
    "cv": pl.Float64, "skewness": pl.Float64, "kurtosis": pl.Float64, "clip_ratio": pl.Float64,
    "p99_p50": pl.Float64, "max_p50": pl.Float64, "cap_tokens": pl.Int64, "cap_source": pl.String,
    "pearson": pl.Float64, "spearman": pl.Float64,
}


def summary_frame(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """Per run and kind over all selected steps: the statistics of `per_step` pooled over samples, plus
    the run's response cap (tokens, source; on the response row only) and the prompt–response
    Pearson and Spearman correlation.

    One query: the samples are reduced in DuckDB and only the few summary rows come back."""
    kinds = " ".join(f"WHEN '{kind}' THEN {rank}" for rank, kind in enumerate(KINDS))
    sql = f"""
        WITH cap AS MATERIALIZED ({caps_sql(run_ids)}),
        stats AS (
            SELECT * FROM ({_pooled_sample_stats_sql(run_ids, steps)})
            UNION ALL BY NAME
            SELECT * FROM ({_aggregate_stats_sql(run_ids, steps, False)})
        ), corr AS ({_correlation_sql(run_ids, steps)})
        SELECT stats.run, kind, basis, basis = 'step_aggregates' AS estimate, steps::BIGINT AS steps,
               count::BIGINT AS count, mean_tokens::DOUBLE AS mean_tokens, std_tokens::DOUBLE AS std_tokens,
               min_tokens::DOUBLE AS min_tokens, p50_tokens::DOUBLE AS p50_tokens, p90_tokens::DOUBLE AS p90_tokens,
               p99_tokens::DOUBLE AS p99_tokens, max_tokens::DOUBLE AS max_tokens,
               {_ratio_sql("std_tokens", "mean_tokens")} AS cv,
               skewness::DOUBLE AS skewness, kurtosis::DOUBLE AS kurtosis, clip_ratio::DOUBLE AS clip_ratio,
               {_ratio_sql("p99_tokens", "p50_tokens")} AS {P99_P50}, {_ratio_sql("max_tokens", "p50_tokens")} AS max_p50,
               CASE WHEN basis = 'samples' AND kind = 'response' THEN cap.cap_tokens END::BIGINT AS cap_tokens,
               CASE WHEN basis = 'samples' AND kind = 'response' THEN cap.cap_source END AS cap_source,
               corr.pearson, corr.spearman
        FROM stats LEFT JOIN cap USING (run_id) LEFT JOIN corr USING (run_id)
        ORDER BY stats.run, CASE kind {kinds} ELSE {len(KINDS)} END
    """
    return small_frame(con, sql, SUMMARY_COLUMNS)


@register("lengths", "prompt/response/total length distribution per run: percentiles, CV, shape, clip ratio, tails")
def summary(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """One row per run × kind: see `summary_frame`."""
    return summary_frame(con, run_ids, steps)


CORRELATION_COLUMNS = {
    "run": pl.String, "n": pl.Int64, "pearson": pl.Float64, "spearman": pl.Float64,
}


def _correlation_sql(run_ids: list[int], steps: StepRange) -> str:
    """SQL of run_id, n, pearson, spearman (see `correlation`); NaN and infinities are null."""
    # A value seen c times whose last position in sorted order is `upto` holds positions
    # upto − c + 1 .. upto: its average rank is upto − (c − 1)/2.
    return f"""
        WITH pairs AS (
            SELECT run_id, prompt_len AS p, response_len AS r, count(*)::DOUBLE AS c
            FROM ({samples_sql(run_ids, steps)})
            WHERE prompt_len IS NOT NULL AND response_len IS NOT NULL
            GROUP BY ALL
        ), pv AS (
            SELECT run_id, p, sum(sum(c)) OVER (PARTITION BY run_id ORDER BY p) - (sum(c) - 1) / 2 AS rp
            FROM pairs GROUP BY run_id, p
        ), rv AS (
            SELECT run_id, r, sum(sum(c)) OVER (PARTITION BY run_id ORDER BY r) - (sum(c) - 1) / 2 AS rr
            FROM pairs GROUP BY run_id, r
        ), ranked AS (
            -- Every pair finds its p in pv and its r in rv, so these are inner joins; as LEFT JOINs
            -- the planner keeps their order (inner, it joined pv with rv on run_id first: a cross
            -- product of the distinct prompt and response lengths).
            SELECT pairs.run_id, c, p::DOUBLE AS p, r::DOUBLE AS r, rp, rr
            FROM pairs LEFT JOIN pv USING (run_id, p) LEFT JOIN rv USING (run_id, r)
        ), centred AS (
            SELECT run_id, c,
                   p - sum(c * p) OVER w / sum(c) OVER w AS dp, r - sum(c * r) OVER w / sum(c) OVER w AS dr,
                   rp - sum(c * rp) OVER w / sum(c) OVER w AS drp, rr - sum(c * rr) OVER w / sum(c) OVER w AS drr
            FROM ranked WINDOW w AS (PARTITION BY run_id)
        ), c AS (
            SELECT run_id, sum(c)::BIGINT AS n,
                   sum(c * dp * dr) / sqrt(sum(c * dp * dp) * sum(c * dr * dr)) AS pearson,
                   sum(c * drp * drr) / sqrt(sum(c * drp * drp) * sum(c * drr * drr)) AS spearman
            FROM centred GROUP BY run_id
        )
        SELECT run_id, n, CASE WHEN isfinite(pearson) THEN pearson END AS pearson,
               CASE WHEN isfinite(spearman) THEN spearman END AS spearman
        FROM c
    """


def correlation(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """Per run: n pairs, Pearson r of (prompt_len, response_len) and Spearman ρ = Pearson r of their
    ranks, ties given the average rank ((first position + last position) / 2).

    Computed over the histogram of distinct (p, r) pairs with counts c (packed traces repeat each
    prompt length n times): with weighted means p̄ = Σc·p / Σc, r̄ likewise,
        r = Σc(p − p̄)(r − r̄) / sqrt(Σc(p − p̄)² · Σc(r − r̄)²)
    and the same over the pairs' average ranks for ρ (null when a length is constant)."""
    sql = f"""
        SELECT runs.name AS run, c.n, c.pearson, c.spearman
        FROM ({_correlation_sql(run_ids, steps)}) c JOIN runs USING (run_id) ORDER BY run
    """
    return small_frame(con, sql, CORRELATION_COLUMNS)


CDF_COLUMNS = {
    "run": pl.String, "kind": pl.String, "quantile": pl.Float64, "length_tokens": pl.Float64,
}


def cdf(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS, points: int = 101) -> pl.DataFrame:
    """Whole-run CDF points per run and kind: `points` evenly spaced quantiles q in [0, 1] and the
    length at q (`quantile_cont`, linear interpolation); plotting length against q draws the CDF."""
    if points < 2:
        raise ValueError("points must be at least 2")
    grid = [i / (points - 1) for i in range(points)]
    sql = f"""
        WITH s AS ({samples_sql(run_ids, steps)}),
        long AS (
            SELECT run_id, 'prompt' AS kind, prompt_len AS len FROM s
            UNION ALL SELECT run_id, 'response', response_len FROM s
            UNION ALL SELECT run_id, 'total', prompt_len + response_len FROM s
        ), q AS (
            SELECT run_id, kind, quantile_cont(len, {grid}) AS values FROM long
            WHERE len IS NOT NULL GROUP BY ALL
        )
        SELECT r.name AS run, kind, unnest({grid}::DOUBLE[]) AS quantile, unnest(values) AS length_tokens
        FROM q JOIN runs r USING (run_id)
    """
    kind_rank = pl.col("kind").replace_strict({k: i for i, k in enumerate(KINDS)}, default=len(KINDS))
    return frame(con, sql).sort([pl.col("run"), kind_rank, pl.col("quantile")])


JOINT_BINS_PER_E = 24


JOINT_HISTOGRAM_COLUMNS = {
    "run": pl.String, "prompt_tokens": pl.Float64, "response_tokens": pl.Float64, "count": pl.Int64,
}


def joint_histogram(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS,
                    bins_per_e: int = JOINT_BINS_PER_E) -> pl.DataFrame:
    """Per run: counts of (prompt, response) length pairs on a log grid, for a density plot of the joint.

    A length l > 0 falls in bin b = floor(k · ln l) with k = `bins_per_e` bins per factor e; the bin is
    reported by its geometric centre exp((b + 0.5) / k) as `prompt_tokens` / `response_tokens`, with
    `count` the training samples in the (prompt bin, response bin) cell. Pairs with a zero or missing
    length are left out.
    """
    if bins_per_e < 1:
        raise ValueError("bins_per_e must be at least 1")
    k = float(bins_per_e)
    sql = f"""
        WITH s AS (
            SELECT run_id, floor({k} * ln(prompt_len)) AS pb, floor({k} * ln(response_len)) AS rb
            FROM ({samples_sql(run_ids, steps)})
            WHERE prompt_len > 0 AND response_len > 0
        )
        SELECT r.name AS run, exp((pb + 0.5) / {k}) AS prompt_tokens, exp((rb + 0.5) / {k}) AS response_tokens,
               count(*) AS count
        FROM s JOIN runs r USING (run_id) GROUP BY r.name, pb, rb ORDER BY r.name, pb, rb
    """
    return frame(con, sql)
