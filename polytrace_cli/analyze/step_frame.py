"""The canonical per-step frame: each step's time and DP imbalance as the run's semantics record
(`analyze.semantics`) says to read them. Every view of step time or λ reads these columns
(`steps`, `stages`, `imbalance`, `check`, the report's F4/F5/F6 and T1, findings, and the step-time
model behind `explain` and `whatif`); none derives them again.

One row per (run, segment, step) of the `steps` view, plus one per step of a run's training
samples that the view lacks (segment null). Columns (`STEP_FRAME_COLUMNS`):

    logged_step_s      the logged step total (timing_s/step), null when not logged
    step_s             the step's wall time:
                         logged_step_s + testing_s (when the run's step total leaves testing out)
                                       + save_checkpoint_s (when it leaves the checkpoint out)
                                       + update_weights_s (verl's fully async policy times its
                                         param_sync after the step, outside timing_s/step)
                         Σ every logged timer (stages, testing, checkpoint) when no total is logged
                       an inclusion that cannot be told is taken as included (verl up to 0.7)
    step_time_basis    'logged', 'logged without overheads' (the run's total leaves an overhead out,
                       added back here) or 'derived from stage timers'; null when nothing is timed
    step_s_counts_testing, step_s_counts_checkpoint
                       whether step_s counts that timer (null: cannot tell)
    mean_rank_tokens   mean over DP ranks of the rank's tokens: global_seqlen/mean, or from the
                       per-rank samples (Σ prompt + response over the rank's training samples)
    busiest_rank_tokens_before_balancing   global_seqlen/max, or the samples' busiest rank
    busiest_rank_tokens_balanced           global_seqlen/balanced_max (verl's balanced partition)
    busiest_rank_tokens                    the busiest rank that sets the time (`lambda_basis`):
                       balanced when the run balances its batch, else before balancing
    lambda_tokens_before_balancing, lambda_tokens_balanced, lambda_tokens
                       the three busiest ranks over mean_rank_tokens; lambda_tokens is the one
                       every gate and saving uses
    lambda_basis       the run's `lambda_basis`; null (and every λ null) without per-rank data
    truncated          a log line of the step was cut short
    partial            the step is one of the run's partial steps (`semantics`: fewer training samples
                       than responses per step, or a prompt group short of responses)
"""

from __future__ import annotations

import duckdb
import polars as pl

from polytrace_cli.analyze import semantics as sem
from polytrace_cli.analyze.common import ALL_STEPS, StepRange, frame, ids_sql
from polytrace_cli.analyze.shared_frames import shared
from polytrace_cli.semantics import step_timers
from polytrace_cli.store.catalog import steps_of_runs_sql

# The framework and mode whose weight sync is timed outside the logged step total (verl's
# fully_async_trainer.py: `_trigger_parameter_sync_after_step` runs after the `step` timer closes; slime's
# perf/step_time counts its weight update inside train_wait, NeMo-RL's inside total_step_time).
SYNC_OUTSIDE_STEP = ("verl", "fully-async")

STEP_FRAME_COLUMNS: dict[str, pl.DataType] = {
    "run": pl.String, "segment": pl.Int64, "step": pl.Int64,
    "logged_step_s": pl.Float64, "testing_s": pl.Float64, "save_checkpoint_s": pl.Float64,
    "step_s": pl.Float64, "step_time_basis": pl.String,
    "step_s_counts_testing": pl.Boolean, "step_s_counts_checkpoint": pl.Boolean,
    "mean_rank_tokens": pl.Float64, "busiest_rank_tokens_before_balancing": pl.Float64,
    "busiest_rank_tokens_balanced": pl.Float64, "busiest_rank_tokens": pl.Float64,
    "lambda_tokens_before_balancing": pl.Float64, "lambda_tokens_balanced": pl.Float64,
    "lambda_tokens": pl.Float64, "lambda_basis": pl.String,
    "validation_only": pl.Boolean, "truncated": pl.Boolean, "partial": pl.Boolean,
}


def _raw(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange) -> pl.DataFrame:
    timers = [*step_timers.stage_columns(con), "testing_s", "save_checkpoint_s"]
    timer_sum = " + ".join(f"coalesce(st.{column}, 0)" for column in timers)
    any_timer = " OR ".join(f"st.{column} IS NOT NULL" for column in timers)
    read = ["step_s", *timers, "update_weights_s", "rank_tokens_max", "rank_tokens_mean", "rank_tokens_balanced_max"]
    ids = ids_sql(run_ids)
    return frame(
        con,
        f"""
        WITH st AS ({steps_of_runs_sql(ids, read, steps.sql())}
        ), rank_loads AS (
            SELECT run_id, step, coalesce(dp_rank, rank) AS dp_rank,
                   sum(coalesce(prompt_len, 0) + coalesce(response_len, 0))::DOUBLE AS load
            FROM samples
            WHERE run_id IN {ids} AND {steps.sql()} AND NOT coalesce(validate, false)
              AND coalesce(tp_rank, 0) = 0 AND coalesce(dp_rank, rank) IS NOT NULL
            GROUP BY ALL
        ), sampled AS (
            SELECT run_id, step, avg(load) AS sample_mean, max(load) AS sample_max
            FROM rank_loads GROUP BY ALL HAVING count(*) >= 2
        ), trained AS (
            SELECT run_id, step, count(*) FILTER (WHERE NOT coalesce(validate, false)) AS training_samples
            FROM samples WHERE run_id IN {ids} AND {steps.sql()} GROUP BY ALL
        ), keys AS (
            SELECT run_id, segment, step FROM st
            UNION ALL
            SELECT run_id, NULL AS segment, step FROM trained
            WHERE NOT EXISTS (SELECT 1 FROM st WHERE st.run_id = trained.run_id AND st.step = trained.step)
        )
        SELECT r.name AS run, k.segment::BIGINT AS segment, k.step::BIGINT AS step,
               st.step_s AS logged_step_s, st.testing_s, st.save_checkpoint_s, st.update_weights_s,
               CASE WHEN {any_timer} THEN {timer_sum} END AS timers_sum_s,
               st.rank_tokens_max AS seq_max, st.rank_tokens_mean AS seq_mean,
               st.rank_tokens_balanced_max AS seq_balanced, sampled.sample_mean, sampled.sample_max,
               coalesce(st.is_validation_only, false) AS validation_only,
               coalesce(st.truncated_line, false) AS truncated
        FROM keys k JOIN runs r ON r.run_id = k.run_id
        LEFT JOIN st ON st.run_id = k.run_id AND st.segment = k.segment AND st.step = k.step
        LEFT JOIN sampled ON sampled.run_id = k.run_id AND sampled.step = k.step
        LEFT JOIN trained ON trained.run_id = k.run_id AND trained.step = k.step
        ORDER BY run, segment NULLS FIRST, step
        """,
    )


def step_frame(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """The canonical per-step frame (`STEP_FRAME_COLUMNS`, formulas in the module docstring), rows
    ordered by run, segment (null first), step."""
    if not run_ids:
        return pl.DataFrame(schema=STEP_FRAME_COLUMNS)
    records = sem.semantics(con, run_ids).select(
        "run", "step_time_basis", "includes_testing", "includes_checkpoint", "lambda_basis", "partial_steps",
        "execution_mode")
    frameworks = pl.DataFrame(con.execute("SELECT name, framework FROM runs WHERE run_id IN (SELECT unnest(?))",
                                          [run_ids]).fetchall(), schema={"run": pl.String, "framework": pl.String},
                              orient="row")
    df = _raw(con, run_ids, steps).join(records, on="run", how="left").join(frameworks, on="run", how="left")
    c = pl.col
    left_out_testing = c("includes_testing").eq(False)
    left_out_checkpoint = c("includes_checkpoint").eq(False)
    logged = c("logged_step_s").is_not_null()
    derived = ~logged & c("timers_sum_s").is_not_null()
    by_samples = c("lambda_basis") == sem.PER_RANK_SAMPLES
    by_seqlen = c("lambda_basis").is_in([sem.BALANCED_MAX, sem.PRE_BALANCING_MAX])
    df = df.with_columns(
        step_s=pl.when(logged).then(
            c("logged_step_s")
            + pl.when(left_out_testing).then(c("testing_s").fill_null(0)).otherwise(0)
            + pl.when(left_out_checkpoint).then(c("save_checkpoint_s").fill_null(0)).otherwise(0)
            + pl.when((c("framework") == SYNC_OUTSIDE_STEP[0]) & (c("execution_mode") == SYNC_OUTSIDE_STEP[1]))
            .then(c("update_weights_s").fill_null(0)).otherwise(0))
        .when(derived).then(c("timers_sum_s")),
        step_time_basis=pl.when(logged).then(
            pl.when(c("step_time_basis") == sem.WITHOUT_OVERHEADS).then(pl.lit(sem.WITHOUT_OVERHEADS))
            .otherwise(pl.lit(sem.LOGGED)))
        .when(derived).then(pl.lit(sem.DERIVED)),
        step_s_counts_testing=pl.when(derived | left_out_testing).then(True).otherwise(c("includes_testing")),
        step_s_counts_checkpoint=pl.when(derived | left_out_checkpoint).then(True)
        .otherwise(c("includes_checkpoint")),
        mean_rank_tokens=pl.when(by_samples).then(c("sample_mean")).when(by_seqlen).then(c("seq_mean")),
        busiest_rank_tokens_before_balancing=pl.when(by_samples).then(c("sample_max"))
        .when(by_seqlen).then(c("seq_max")),
        busiest_rank_tokens_balanced=pl.when(by_seqlen).then(c("seq_balanced")),
        partial=c("partial_steps").list.contains(c("step")),
    ).with_columns(
        busiest_rank_tokens=pl.when(c("lambda_basis") == sem.BALANCED_MAX)
        .then(pl.coalesce("busiest_rank_tokens_balanced", "busiest_rank_tokens_before_balancing"))
        .otherwise(c("busiest_rank_tokens_before_balancing")),
    ).with_columns(
        **{f"lambda_tokens{suffix}": pl.when(c("mean_rank_tokens") > 0)
           .then(c(f"busiest_rank_tokens{suffix}") / c("mean_rank_tokens"))
           for suffix in ("_before_balancing", "_balanced", "")},
        partial=c("partial").fill_null(False),
    )
    return df.select(list(STEP_FRAME_COLUMNS)).cast(STEP_FRAME_COLUMNS)


def shared_step_frame(con: duckdb.DuckDBPyConnection, run_ids: list[int],
                      steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """`step_frame`, computed once per report (`analyze.shared_frames`)."""
    return shared(step_frame, con, run_ids, steps)
