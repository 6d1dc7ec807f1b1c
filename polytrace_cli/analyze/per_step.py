"""per_step: one row per training step with its stage times, lengths, load balance and flags.

The `polytrace steps` view. A run's rows come from one basis:

- `step_aggregates` (console, JSONL, wandb, TensorBoard logs: the run has step metrics): stage
  seconds, logged response/prompt length mean and max, clip ratio and tokens
  (`perf/total_num_tokens`) from the `steps` view; slot idle = 1 − mean/max response length over
  the whole step (all ranks as one batch, as `longtail` does for these runs). Makespan λ needs each
  rank's longest response and is left null.
- `samples` (per-sample traces: PolyTrace packed or multi-turn): computed from the step's training
  samples (validate not true, tensor-parallel rank 0). With a step's DP ranks r, each holding
  responses l_1..l_N with prompts p_i:
      tokens          = Σ (p_i + l_i) over the step
      makespan λ      = max_r M_r / mean_r M_r,  M_r = max over rank r of l_i
      slot idle       = mean over ranks of 1 − Σ l / (N · max l)   (the `longtail` figure)
      clip ratio      = share of responses with l >= the run's cap (`lengths.caps`; null without a cap)
  λ needs at least two ranks and is null otherwise. reward_s is the slowest rank's reward seconds
  (`rank_timings`), since the stage ends when the last rank finishes; other stages are not logged.

On both bases, from the canonical step frame (`analyze.step_frame`, which the run's semantics
record decides): step_s (the step's wall time), logged_step_s (the logged total), step_time_basis
('logged', 'logged without overheads', 'derived from stage timers'), lambda_tokens (the busiest rank
that sets the time over the mean rank: after verl's balancing when the run balances its batch; the
per-rank samples' max_r T_r / mean_r T_r with T_r = Σ over rank r of (p_i + l_i)) and
lambda_tokens_before_balancing (global_seqlen/max / mean), with lambda_basis (the run's choice of
busiest rank: 'rank_tokens_balanced_max', 'rank_tokens_max', 'per-rank samples'). Multi-turn runs add, per step, the tool
calls, their mean and p99 latency and the prefix-cache hit ratio (`tools.per_step`).

Flags: partial (fewer training samples than the run's responses per step), validation (a validation step: testing time logged, a validation-only step, or validation
samples), checkpoint (checkpoint time logged), restart (first step after a restart or resume),
truncated (a log line cut short). Flags a basis cannot observe are null, not false.
missing_before: the steps missing just before the step in its segment, at the run's regular logging
interval (`store.queries.STEP_GAPS_SQL`; 0 when none, null on a segment's first step and on samples).

`mode` is the run's execution mode (the semantics record); in the modes where verl's `timing_s/gen` is
the trainer's wait, its seconds are `trainer_wait_s` and `gen_s` is empty; `rollout_s` is the rollout
side's busy seconds beside the step.

`expected_step_s` and `top_cause` belong to the step-time explanation and are null here;
`diagnose.per_step.steps_with_causes` (what `polytrace steps` shows) fills them.
"""

from __future__ import annotations

import duckdb
import polars as pl

from polytrace_cli.analyze.common import ALL_STEPS, StepRange, frame
from polytrace_cli.analyze.common import caps_sql, ids_sql, training_samples_sql
from polytrace_cli.store.catalog import steps_of_runs_sql
from polytrace_cli.store.queries import step_gaps_sql

STAGE_COLUMNS = ("gen_s", "trainer_wait_s", "rollout_s", "reward_s", "old_log_prob_s", "ref_s", "values_s", "adv_s", "update_actor_s",
                 "update_critic_s", "update_weights_s", "testing_s", "save_checkpoint_s")

COLUMNS: dict[str, pl.DataType] = {
    "run": pl.String, "segment": pl.Int64, "step": pl.Int64, "basis": pl.String, "mode": pl.String,
    **{name: pl.Float64 for name in STAGE_COLUMNS},
    "step_s": pl.Float64, "logged_step_s": pl.Float64, "step_time_basis": pl.String,
    "response_mean": pl.Float64, "response_max": pl.Float64, "prompt_mean": pl.Float64, "prompt_max": pl.Float64,
    "clip_ratio": pl.Float64, "tokens": pl.Float64, "dp_ranks": pl.Int64,
    "lambda_tokens": pl.Float64, "lambda_tokens_before_balancing": pl.Float64, "lambda_basis": pl.String,
    "lambda_makespan": pl.Float64,
    "slot_idle": pl.Float64,
    "tool_calls": pl.Int64, "tool_latency_mean_s": pl.Float64, "tool_latency_p99_s": pl.Float64,
    "prefix_cache_hit_ratio": pl.Float64,
    "validation": pl.Boolean, "checkpoint": pl.Boolean, "restart": pl.Boolean, "truncated": pl.Boolean,
    "partial": pl.Boolean, "missing_before": pl.Int64,
    # Filled by diagnose.per_step.steps_with_causes; null here.
    "expected_step_s": pl.Float64, "top_cause": pl.String,
}


def _view_columns(con: duckdb.DuckDBPyConnection) -> set[str]:
    rows = con.execute("SELECT column_name FROM information_schema.columns WHERE table_name = 'steps'").fetchall()
    return {row[0] for row in rows}


def _from_step_aggregates(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange) -> pl.DataFrame:
    present = _view_columns(con)
    stages = ", ".join(f"st.{name}" if name in present else f"NULL::DOUBLE AS {name}" for name in STAGE_COLUMNS)
    read = [*(name for name in STAGE_COLUMNS if name in present), "response_length_mean", "response_length_max",
            "prompt_length_mean", "prompt_length_max", "clip_ratio", "total_tokens"]
    return frame(
        con,
        f"""
        WITH st AS (
            SELECT *, segment > 0 AND step = min(step) OVER (PARTITION BY run_id, segment) AS first_after_restart
            FROM ({steps_of_runs_sql(ids_sql(run_ids), read, steps.sql())})
        ), holes AS ({step_gaps_sql(ids_sql(run_ids))})
        SELECT r.name AS run, st.segment, st.step, 'step_aggregates' AS basis, {stages},
               st.response_length_mean AS response_mean, st.response_length_max AS response_max,
               st.prompt_length_mean AS prompt_mean, st.prompt_length_max AS prompt_max,
               st.clip_ratio, st.total_tokens AS tokens, NULL AS dp_ranks,
               NULL AS lambda_makespan,
               CASE WHEN st.response_length_max > 0
                    THEN 1 - st.response_length_mean / st.response_length_max END AS slot_idle,
               st.has_testing OR st.is_validation_only AS validation, st.has_checkpoint AS checkpoint,
               st.first_after_restart OR list_has_any(st.flags, ['restart', 'resumed']) AS restart,
               st.truncated_line AS truncated, holes.missing_before
        FROM st JOIN runs r USING (run_id) LEFT JOIN holes USING (run_id, segment, step)
        """,
    ).with_columns(segment=pl.col("segment").cast(pl.Int64), step=pl.col("step").cast(pl.Int64))


def _from_samples(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange) -> pl.DataFrame:
    if not run_ids:
        return pl.DataFrame()
    return frame(
        con,
        f"""
        WITH cap AS ({caps_sql(run_ids)}),
        s AS (
            SELECT run_id, step, coalesce(dp_rank, rank) AS dp_rank, prompt_len, response_len
            FROM ({training_samples_sql(run_ids, steps)}) WHERE coalesce(tp_rank, 0) = 0
        ), by_rank AS (
            SELECT run_id, step, dp_rank,
                   sum(coalesce(prompt_len, 0) + coalesce(response_len, 0))::DOUBLE AS load_tokens,
                   max(response_len)::DOUBLE AS max_response,
                   CASE WHEN max(response_len) > 0
                        THEN 1 - sum(response_len)::DOUBLE / (count(response_len) * max(response_len)) END AS slot_idle
            FROM s GROUP BY ALL
        ), balance AS (
            SELECT run_id, step, nullif(count(dp_rank), 0) AS dp_ranks,
                   CASE WHEN count(dp_rank) >= 2 AND avg(max_response) > 0
                        THEN max(max_response) / avg(max_response) END AS lambda_makespan,
                   avg(slot_idle) AS slot_idle
            FROM by_rank GROUP BY ALL
        ), lengths AS (
            SELECT s.run_id, s.step, avg(response_len) AS response_mean, max(response_len)::DOUBLE AS response_max,
                   avg(prompt_len) AS prompt_mean, max(prompt_len)::DOUBLE AS prompt_max,
                   avg((response_len >= cap.cap_tokens)::DOUBLE) FILTER (WHERE response_len IS NOT NULL) AS clip_ratio,
                   sum(coalesce(prompt_len, 0) + coalesce(response_len, 0))::DOUBLE AS tokens
            FROM s JOIN cap USING (run_id) GROUP BY ALL
        ), all_steps AS (
            SELECT run_id, step, bool_or(coalesce(validate, false)) AS validation
            FROM samples WHERE run_id IN {ids_sql(run_ids)} AND {steps.sql()} GROUP BY ALL
        ), reward AS (
            SELECT run_id, step, max(seconds) AS reward_s
            FROM rank_timings
            WHERE run_id IN {ids_sql(run_ids)} AND {steps.sql()} AND stage = 'reward'
              AND coalesce(validate, false) = false
            GROUP BY ALL
        )
        SELECT r.name AS run, NULL AS segment, a.step, 'samples' AS basis, w.reward_s,
               l.response_mean, l.response_max, l.prompt_mean, l.prompt_max, l.clip_ratio, l.tokens,
               b.dp_ranks, b.lambda_makespan, b.slot_idle,
               a.validation, NULL AS checkpoint, NULL AS restart, NULL AS truncated
        FROM all_steps a JOIN runs r USING (run_id)
        LEFT JOIN lengths l USING (run_id, step) LEFT JOIN balance b USING (run_id, step)
        LEFT JOIN reward w USING (run_id, step)
        """,
    )


def _conform(df: pl.DataFrame) -> pl.DataFrame:
    """The frame with exactly COLUMNS, in order and type (absent columns null)."""
    return df.select([
        (pl.col(name) if name in df.columns else pl.lit(None)).cast(dtype).alias(name) for name, dtype in COLUMNS.items()
    ])


def _canonical(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange) -> pl.DataFrame:
    """The canonical frame's columns this view shows, keyed by run, segment, step."""
    from polytrace_cli.analyze.step_frame import shared_step_frame

    return shared_step_frame(con, run_ids, steps).select(
        "run", "segment", "step", "step_s", "logged_step_s", "step_time_basis", "lambda_tokens",
        "lambda_tokens_before_balancing", "lambda_basis", "partial")


def per_step(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """One row per (run, segment, step) with COLUMNS; formulas and bases in the module docstring.

    A run with step metrics is read from them (`step_aggregates`); a run without them from its
    samples (`samples`). Step time and token λ come from the canonical step frame
    (`analyze.step_frame`), the tool columns from `tools.per_step`. Rows are ordered by run,
    segment, step."""
    from polytrace_cli.analyze.tools import per_step as tools_per_step
    with_metrics = {row[0] for row in con.execute(
        f"SELECT DISTINCT run_id FROM step_metrics WHERE run_id IN {ids_sql(run_ids)}").fetchall()}
    parts = []
    if with_metrics:
        parts.append(_from_step_aggregates(con, sorted(with_metrics), steps))
    sampled = [run_id for run_id in run_ids if run_id not in with_metrics]
    if sampled:
        parts.append(_from_samples(con, sampled, steps))
    parts = [part for part in parts if part.height]
    if not parts:
        return pl.DataFrame(schema=COLUMNS)
    canonical = _canonical(con, run_ids, steps)
    tools = tools_per_step(con, run_ids, steps)
    keys = ["run", "segment", "step"]
    joined = [part.drop([name for name in canonical.columns if name in part.columns and name not in keys])
              .with_columns(pl.col("segment").cast(pl.Int64), pl.col("step").cast(pl.Int64))
              .join(canonical, on=keys, how="left", nulls_equal=True, maintain_order="left")
              .join(tools, on=["run", "step"], how="left", maintain_order="left")
              for part in parts]
    return _by_mode(con, run_ids, pl.concat([_conform(part) for part in joined])).sort(
        "run", "segment", "step", nulls_last=False)


def _by_mode(con: duckdb.DuckDBPyConnection, run_ids: list[int], df: pl.DataFrame) -> pl.DataFrame:
    """Each run's execution mode (`mode`), and in the modes where verl's `timing_s/gen` is the trainer's wait
    (`execution_mode.WAIT_MODES`) its seconds as trainer_wait_s, gen_s left empty."""
    from polytrace_cli.analyze.semantics import semantics
    from polytrace_cli.semantics.execution_mode import WAIT_MODES

    modes = semantics(con, run_ids).select("run", pl.col("execution_mode").alias("mode_of_run"))
    waits = pl.col("mode_of_run").is_in(list(WAIT_MODES)).fill_null(False)
    return (df.join(modes, on="run", how="left", maintain_order="left")
            .with_columns(mode=pl.col("mode_of_run"),
                          trainer_wait_s=pl.when(waits).then(pl.coalesce("trainer_wait_s", "gen_s"))
                          .otherwise(pl.col("trainer_wait_s")),
                          gen_s=pl.when(waits).then(None).otherwise(pl.col("gen_s")))
            .select(list(COLUMNS)))
