"""longtail: how much decode time the long tail of response lengths costs, from lengths alone.

The responses a data-parallel rank decodes together in one step, l_1..l_N, occupy the batch for
max(l) decode iterations while the useful work is sum(l):

    slot idle       = 1 − sum(l) / (N · max(l))        (= 1 − mean(l) / max(l))
    straggler share = (max(l) − p90(l)) / max(l)       (p90 by linear interpolation)

the share of slot-iterations left idle, and the part of the step spent waiting for the slowest 10%.
A batch is (run, step, dp_rank); samples without a DP rank (e.g. multi-turn traces) form one batch
per step. Batches whose longest response is 0 are skipped.

Step-aggregate runs (console logs) log only the step's mean and max response length: their slot
idle is 1 − mean / max over the whole step's batch (`basis = 'step_aggregates'`, one batch per
step, not per rank), marked `estimate = true`: it treats all the step's ranks as one batch, so it
is not the per-rank figure. Straggler share needs p90 and is left null.

The summary reads the step range's split of the samples (`common.samples_sql`): training by default,
the validation samples in the validation split (which has no step aggregates).
"""

from __future__ import annotations

import duckdb
import numpy as np
import polars as pl

from polytrace_cli.analyze.common import (
    ALL_STEPS, StepRange, frame, ids_sql, samples_sql, step_aggregate_rows_sql, training_samples_sql,
)
from polytrace_cli.analyze.registry import register
from polytrace_cli.analyze.shared_frames import shared


PER_RANK_COLUMNS = {
    "run": pl.String, "step": pl.Int64, "dp_rank": pl.Int64, "basis": pl.String, "estimate": pl.Boolean,
    "n": pl.Int64, "sum_tokens": pl.Float64, "mean_tokens": pl.Float64, "max_tokens": pl.Float64,
    "p90_tokens": pl.Float64, "slot_idle": pl.Float64, "straggler_share": pl.Float64,
}


def per_rank(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """Per run, step and DP rank: N, sum, max and p90 of response lengths, slot idle
    = 1 − sum/(N·max) and straggler share = (max − p90)/max. Step-aggregate runs: one row per step
    (dp_rank null) with slot idle = 1 − mean/max, null straggler share and estimate = true."""
    sql = f"""
        WITH s AS ({samples_sql(run_ids, steps)}),
        batches AS (
            SELECT run_id, step, coalesce(dp_rank, rank) AS dp_rank, 'samples' AS basis,
                   count(response_len) AS n, sum(response_len)::DOUBLE AS sum_tokens,
                   avg(response_len) AS mean_tokens, max(response_len)::DOUBLE AS max_tokens,
                   quantile_cont(response_len, 0.9) AS p90_tokens
            FROM s WHERE response_len IS NOT NULL GROUP BY ALL
        ), from_aggregates AS (
            SELECT run_id, step, NULL::INTEGER AS dp_rank, 'step_aggregates' AS basis, NULL::BIGINT AS n,
                   NULL::DOUBLE AS sum_tokens, mean_tokens, max_tokens, NULL::DOUBLE AS p90_tokens
            FROM ({step_aggregate_rows_sql(run_ids, steps)}) WHERE kind = 'response'
        ), b AS (SELECT * FROM batches UNION ALL SELECT * FROM from_aggregates)
        SELECT r.name AS run, step::BIGINT AS step, dp_rank, basis, basis = 'step_aggregates' AS estimate,
               n, sum_tokens, mean_tokens, max_tokens, p90_tokens,
               1 - mean_tokens / max_tokens AS slot_idle,
               (max_tokens - p90_tokens) / max_tokens AS straggler_share
        FROM b JOIN runs r USING (run_id)
        WHERE max_tokens > 0 AND r.run_id IN {ids_sql(run_ids)}
        ORDER BY run, step, dp_rank NULLS FIRST
    """
    return frame(con, sql)


PER_STEP_COLUMNS = {
    "run": pl.String, "step": pl.Int64, "basis": pl.String, "estimate": pl.Boolean, "batches": pl.Int64,
    "slot_idle": pl.Float64, "straggler_share": pl.Float64, "max_slot_idle": pl.Float64,
}


def per_step(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """Per run and step: the mean over the step's DP-rank batches of slot idle and straggler share,
    and the worst rank's slot idle."""
    return (
        shared(per_rank, con, run_ids, steps)
        .group_by(["run", "step", "basis", "estimate"], maintain_order=True)
        .agg(pl.len().alias("batches"), pl.col("slot_idle").mean(), pl.col("straggler_share").mean(),
             pl.col("slot_idle").max().alias("max_slot_idle"))
        .sort(["run", "step"])
    )


SUMMARY_COLUMNS = {
    "run": pl.String, "basis": pl.String, "estimate": pl.Boolean, "steps": pl.Int64, "batches": pl.Int64,
    "mean_slot_idle": pl.Float64, "mean_straggler_share": pl.Float64, "max_slot_idle": pl.Float64,
}


@register("longtail", "decode slots left idle by long responses: slot idle and straggler share per step and rank")
def summary(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """One row per run: batches, steps, mean slot idle and straggler share over all (step, rank)
    batches, and the largest slot idle of any batch."""
    return (
        shared(per_rank, con, run_ids, steps)
        .group_by(["run", "basis", "estimate"], maintain_order=True)
        .agg(pl.col("step").n_unique().alias("steps"), pl.len().alias("batches"),
             pl.col("slot_idle").mean().alias("mean_slot_idle"),
             pl.col("straggler_share").mean().alias("mean_straggler_share"),
             pl.col("slot_idle").max().alias("max_slot_idle"))
        .with_columns(pl.col("steps").cast(pl.Int64), pl.col("batches").cast(pl.Int64))
        .sort("run")
    )


STILL_DECODING_COLUMNS = {
    "run": pl.String, "step": pl.Int64, "position_tokens": pl.Float64, "still_decoding_share": pl.Float64,
}


def still_decoding(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: list[int] | None = None,
                   points: int = 64) -> pl.DataFrame:
    """Figure F7 data: per run and step, the share of the step's training responses still decoding
    at decode position x, i.e. share(l > x), at `points` evenly spaced positions from 0 to the
    run's longest response in the chosen steps (all steps when `steps` is None)."""
    if points < 2:
        raise ValueError("points must be at least 2")
    step_filter = "true" if steps is None else f"step IN ({', '.join(str(int(s)) for s in steps) or 'NULL'})"
    fractions = np.linspace(0.0, 1.0, points).tolist()
    sql = f"""
        WITH s AS (
            SELECT run_id, step, response_len FROM ({training_samples_sql(run_ids)})
            WHERE response_len IS NOT NULL AND {step_filter}
        ), counts AS (
            SELECT run_id, step, response_len, count(*) AS c FROM s GROUP BY ALL
        ), totals AS (
            SELECT run_id, step, sum(c) AS n FROM counts GROUP BY ALL
        ), grid AS (
            SELECT run_id, unnest({fractions}::DOUBLE[]) * max(response_len) AS position FROM s GROUP BY run_id
        ), stepgrid AS (
            SELECT t.run_id, t.step, t.n, g.position FROM totals t JOIN grid g USING (run_id)
        )
        SELECT r.name AS run, g.step::BIGINT AS step, g.position AS position_tokens,
               coalesce(sum(c.c), 0) / any_value(g.n) AS still_decoding_share
        FROM stepgrid g
        LEFT JOIN counts c ON c.run_id = g.run_id AND c.step = g.step AND c.response_len > g.position
        JOIN runs r ON r.run_id = g.run_id
        GROUP BY r.name, g.step, g.position
        ORDER BY run, step, position_tokens
    """
    return frame(con, sql)
