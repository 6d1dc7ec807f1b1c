"""Numbers that add up: where a run's logged numbers contradict one another or leave time unaccounted.

Per step (`STEP_COLUMNS`):

    gap_s           wall time between this step's records and the previous step's, on the run's wall
                    clock (`step_clock.logged_at`: a tracker's timestamps, else the console log's printed
                    times): logged_at(k) − logged_at(k − 1), for consecutive steps of one segment; null
                    without a clock or after a hole in the steps
    untimed_s       gap_s − step_s: time between two steps that no timer accounts for (logging, data
                    loading, work outside the step timer); null when gap_s or step_s is
    stage_sum_s     Σ of the step's stage timers, testing and checkpoint included where the step total
                    counts them (the same timers `step_s` is derived from when no total is logged)
    stage_excess_s  stage_sum_s − logged step total, when the stages add up to more than the total by
                    over max(STAGE_TOLERANCE_S, STAGE_TOLERANCE × total): timers that overlap, or a total
                    that leaves work out; null otherwise, and for steps without a logged total
    mfu             the logged model-FLOPs utilization of the actor (`mfu_actor`), a fraction
    mfu_impossible  mfu > 1: no device does more than its peak
    implied_gpus    total_tokens / (throughput × time_per_step): the GPU count the logged throughput
                    (tokens per second per GPU) implies; time_per_step is the logged one, else step_s
    throughput_mismatch  |implied_gpus / configured GPUs − 1| > THROUGHPUT_TOLERANCE, the configured count
                    being nnodes × n_gpus_per_node from the run's config (null without it)

Thresholds: a step is `untimed` when untimed_s > max(UNTIMED_MIN_S, UNTIMED_SHARE × step_s).

The summary (`SUMMARY_COLUMNS`), one row per run: the steps with a wall-clock gap, the untimed seconds
summed and as a share of the gaps' sum, the untimed steps, the steps whose stages exceed their total,
the steps with an impossible MFU, the largest MFU logged, the steps whose throughput implies another GPU
count than the config's, and the steps with any of these contradictions.
"""

from __future__ import annotations

import duckdb
import polars as pl

from polytrace_cli.analyze.common import ALL_STEPS, StepRange, ids_sql, run_names, step_clock_sql
from polytrace_cli.analyze.registry import register
from polytrace_cli.analyze.step_frame import shared_step_frame
from polytrace_cli.semantics import step_timers
from polytrace_cli.store.catalog import steps_of_runs_sql

UNTIMED_MIN_S = 1.0
UNTIMED_SHARE = 0.05
STAGE_TOLERANCE = 0.02
STAGE_TOLERANCE_S = 0.5
THROUGHPUT_TOLERANCE = 0.10

STEP_COLUMNS: dict[str, pl.DataType] = {
    "run": pl.String, "segment": pl.Int64, "step": pl.Int64, "step_s": pl.Float64, "gap_s": pl.Float64,
    "untimed_s": pl.Float64, "untimed": pl.Boolean, "stage_sum_s": pl.Float64, "stage_excess_s": pl.Float64,
    "mfu": pl.Float64, "mfu_impossible": pl.Boolean, "implied_gpus": pl.Float64, "throughput_mismatch": pl.Boolean,
}
SUMMARY_COLUMNS: dict[str, pl.DataType] = {
    "run": pl.String, "steps_with_gap": pl.Int64, "untimed_s": pl.Float64, "untimed_share": pl.Float64,
    "untimed_steps": pl.Int64, "stage_excess_steps": pl.Int64, "mfu_impossible_steps": pl.Int64,
    "mfu_max": pl.Float64, "throughput_mismatch_steps": pl.Int64, "inconsistent_steps": pl.Int64,
    "basis": pl.String,
}
UNTIMED_SHARE_COLUMN, INCONSISTENT_STEPS = "untimed_share", "inconsistent_steps"


def per_step(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """One row per step of the runs' canonical step frame (`STEP_COLUMNS`, formulas in the module docstring)."""
    ids = ids_sql(run_ids)
    names = run_names(con, run_ids)
    base = shared_step_frame(con, run_ids, steps).filter(pl.col("segment").is_not_null()).select(
        "run", "segment", "step", "step_s", "logged_step_s", "step_s_counts_testing", "step_s_counts_checkpoint")
    if not base.height:
        return pl.DataFrame(schema=STEP_COLUMNS)
    clock = con.sql(f"""
        SELECT run_id, segment::BIGINT AS segment, step::BIGINT AS step, logged_at,
               logged_at - lag(logged_at) OVER w AS gap_s, step - lag(step) OVER w AS stride
        FROM ({step_clock_sql(run_ids)})
        WINDOW w AS (PARTITION BY run_id, segment ORDER BY step)""").pl()
    clock = clock.with_columns(run=pl.col("run_id").replace_strict(names, return_dtype=pl.String)).filter(
        pl.col("stride") == 1).select("run", "segment", "step", "gap_s")
    stages = step_timers.stage_columns(con)
    stage_sum = " + ".join(f"coalesce({column}, 0)" for column in stages) or "0"
    any_stage = " OR ".join(f"{column} IS NOT NULL" for column in stages) or "false"
    timers = con.sql(f"""
        SELECT s.run_id, s.segment::BIGINT AS segment, s.step::BIGINT AS step,
               CASE WHEN {any_stage} THEN {stage_sum} END AS stages_s, s.testing_s, s.save_checkpoint_s,
               s.total_tokens, s.throughput, s.time_per_step,
               TRY_CAST(json_extract(r.meta, '$.n_gpus_per_node') AS DOUBLE)
                 * coalesce(TRY_CAST(json_extract(r.meta, '$.nnodes') AS DOUBLE), 1) AS configured_gpus
        FROM ({steps_of_runs_sql(ids, [*stages, "testing_s", "save_checkpoint_s", "total_tokens", "throughput",
                                       "time_per_step"])}) s
        JOIN runs r USING (run_id)""").pl()
    mfu = con.sql(f"""
        SELECT sm.run_id, sm.segment::BIGINT AS segment, sm.step::BIGINT AS step, max(sm.value) AS mfu
        FROM named_step_metrics sm
        WHERE sm.run_id IN {ids} AND sm.canonical = 'mfu_actor' GROUP BY ALL""").pl()
    extra = timers.join(mfu, on=["run_id", "segment", "step"], how="left").with_columns(
        run=pl.col("run_id").replace_strict(names, return_dtype=pl.String)).drop("run_id")
    keys = ["run", "segment", "step"]
    out = base.join(clock, on=keys, how="left").join(extra, on=keys, how="left")
    counted = (pl.col("stages_s")
               + pl.when(pl.col("step_s_counts_testing").fill_null(True)).then(pl.col("testing_s").fill_null(0)).otherwise(0)
               + pl.when(pl.col("step_s_counts_checkpoint").fill_null(True))
               .then(pl.col("save_checkpoint_s").fill_null(0)).otherwise(0))
    total = pl.col("logged_step_s")
    excess = counted - total
    tolerance = pl.max_horizontal(pl.lit(STAGE_TOLERANCE_S), STAGE_TOLERANCE * total)
    untimed = pl.col("gap_s") - pl.col("step_s")
    implied = pl.col("total_tokens") / (pl.col("throughput") * pl.coalesce(pl.col("time_per_step"), pl.col("step_s")))
    implied = pl.when(pl.col("throughput") > 0).then(implied)
    return out.with_columns(
        implied_gpus=implied,
        throughput_mismatch=pl.when(pl.col("configured_gpus") > 0)
        .then((implied / pl.col("configured_gpus") - 1).abs() > THROUGHPUT_TOLERANCE),
        untimed_s=untimed,
        untimed=untimed > pl.max_horizontal(pl.lit(UNTIMED_MIN_S), UNTIMED_SHARE * pl.col("step_s")),
        stage_sum_s=counted,
        stage_excess_s=pl.when(total.is_not_null() & (excess > tolerance)).then(excess),
        mfu_impossible=pl.col("mfu") > 1.0,
    ).select(list(STEP_COLUMNS)).cast(STEP_COLUMNS).sort(keys)


@register("consistency", "numbers that add up: untimed time between steps, stages beyond the step, impossible MFU")
def summary(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """One row per run (`SUMMARY_COLUMNS`): untimed_share = Σ untimed_s / Σ gap_s over the steps with both."""
    detail = per_step(con, run_ids, steps)
    rows = []
    for name in sorted(run_names(con, run_ids).values()):
        own = detail.filter(pl.col("run") == name)
        gaps = own.filter(pl.col("untimed_s").is_not_null())
        gap_total = float(gaps.get_column("gap_s").sum()) if gaps.height else 0.0
        untimed_total = float(gaps.get_column("untimed_s").sum()) if gaps.height else None
        mfu = own.get_column("mfu").drop_nulls()
        rows.append({
            "run": name, "steps_with_gap": gaps.height, "untimed_s": untimed_total,
            "untimed_share": untimed_total / gap_total if gaps.height and gap_total > 0 else None,
            "untimed_steps": int(own.get_column("untimed").fill_null(False).sum()),
            "stage_excess_steps": own.filter(pl.col("stage_excess_s").is_not_null()).height,
            "mfu_impossible_steps": int(own.get_column("mfu_impossible").fill_null(False).sum()),
            "mfu_max": float(mfu.max()) if mfu.len() else None,
            "throughput_mismatch_steps": int(own.get_column("throughput_mismatch").fill_null(False).sum()),
            "inconsistent_steps": own.filter(pl.col("stage_excess_s").is_not_null()
                                             | pl.col("mfu_impossible").fill_null(False)
                                             | pl.col("throughput_mismatch").fill_null(False)).height,
            "basis": "steps' wall clock and timers" if gaps.height else
            "timers only: no wall clock between consecutive steps, so untimed time cannot be told",
        })
    return pl.DataFrame(rows, schema=SUMMARY_COLUMNS)
