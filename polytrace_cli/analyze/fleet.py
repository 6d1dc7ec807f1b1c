"""Fleet analyses: the runs grouped by task (or model), as the paper's per-task figures are.

One row per group, over every selected run of the group:

- lengths, pooled over the training samples (validation left out) of all the group's runs:
  count, mean, p50, p90, p99 (linear interpolation, `quantile_cont`) and max of the response and
  of the prompt lengths; a prompt length counts once per response, as in the lengths analysis.
  Runs without per-sample rows (console-only logs) add no lengths; `sample_runs` counts the runs
  that do.
- step-time CV: per run, cv = std/mean (sample std) of `step_s` over its training steps (the
  stages analysis' 'step' row); a run with fewer than 3 such steps has no CV and is left out.
  Per group: the mean and the max of the runs' CVs, and `step_time_runs` = how many runs had one.
  CVs are not pooled over runs' steps, because runs of different sizes have different step times
  and pooling would count that difference as fluctuation.
- DP load imbalance λ = max_r load_r / mean_r load_r per step (the imbalance analysis): the mean and
  the max over all steps of the group's runs (each step weighs the same), with `imbalance_runs`
  and `imbalance_steps` saying how many contributed.

A run without a task (model) label forms the group null.
"""

from __future__ import annotations

import duckdb
import polars as pl

from polytrace_cli.analyze.common import ALL_STEPS, StepRange, frame, ids_sql, training_samples_sql
from polytrace_cli.analyze.shared_frames import shared
from polytrace_cli.errors import PolytraceError

GROUPINGS = {
    "task": "r.task",
    "model": "coalesce(r.model, json_extract_string(r.meta, '$.model'))",
}
MIN_STEPS_FOR_CV = 3

COLUMNS = {
    "by": pl.String, "group": pl.String, "runs": pl.Int64, "sample_runs": pl.Int64, "samples": pl.Int64,
    "response_mean_tokens": pl.Float64, "response_p50_tokens": pl.Float64, "response_p90_tokens": pl.Float64,
    "response_p99_tokens": pl.Float64, "response_max_tokens": pl.Float64,
    "prompt_mean_tokens": pl.Float64, "prompt_p50_tokens": pl.Float64, "prompt_p90_tokens": pl.Float64,
    "prompt_p99_tokens": pl.Float64, "prompt_max_tokens": pl.Float64,
    "step_time_runs": pl.Int64, "step_time_cv_mean": pl.Float64, "step_time_cv_max": pl.Float64,
    "imbalance_runs": pl.Int64, "imbalance_steps": pl.Int64, "lambda_mean": pl.Float64, "lambda_max": pl.Float64,
}

# `by_group`'s columns under the name the report's column contract reads; `run_groups`' columns.
BY_GROUP_COLUMNS = COLUMNS
RUN_GROUPS_COLUMNS = {"run": pl.String, "run_id": pl.Int64, "group": pl.String}


def run_groups(con: duckdb.DuckDBPyConnection, run_ids: list[int], by: str) -> pl.DataFrame:
    """Per run: run (name), run_id and group (its task or model label, null when unlabeled)."""
    if by not in GROUPINGS:
        raise PolytraceError(f"--by takes {' or '.join(GROUPINGS)}, not {by!r}")
    return frame(con, f"SELECT r.name AS run, r.run_id, {GROUPINGS[by]} AS \"group\" FROM runs r "
                      f"WHERE r.run_id IN {ids_sql(run_ids)}")


def _lengths(con: duckdb.DuckDBPyConnection, run_ids: list[int], by: str, steps: StepRange) -> pl.DataFrame:
    return frame(
        con,
        f"""
        WITH s AS ({training_samples_sql(run_ids, steps)})
        SELECT {GROUPINGS[by]} AS "group", count(DISTINCT s.run_id)::BIGINT AS sample_runs,
               count(s.response_len)::BIGINT AS samples,
               avg(s.response_len) AS response_mean_tokens,
               quantile_cont(s.response_len, 0.5) AS response_p50_tokens,
               quantile_cont(s.response_len, 0.9) AS response_p90_tokens,
               quantile_cont(s.response_len, 0.99) AS response_p99_tokens,
               max(s.response_len)::DOUBLE AS response_max_tokens,
               avg(s.prompt_len) AS prompt_mean_tokens,
               quantile_cont(s.prompt_len, 0.5) AS prompt_p50_tokens,
               quantile_cont(s.prompt_len, 0.9) AS prompt_p90_tokens,
               quantile_cont(s.prompt_len, 0.99) AS prompt_p99_tokens,
               max(s.prompt_len)::DOUBLE AS prompt_max_tokens
        FROM s JOIN runs r USING (run_id)
        GROUP BY ALL
        """,
    )


def _step_time_cv(con: duckdb.DuckDBPyConnection, run_ids: list[int], groups: pl.DataFrame,
                  steps: StepRange) -> pl.DataFrame:
    from polytrace_cli.analyze.stages import stage_stats

    per_run = stage_stats(con, run_ids, steps).filter(
        (pl.col("stage") == "step") & (pl.col("steps") >= MIN_STEPS_FOR_CV) & pl.col("cv").is_not_null()
    )
    return (
        per_run.join(groups.select("run", "group"), on="run")
        .group_by("group")
        .agg(step_time_runs=pl.len(), step_time_cv_mean=pl.col("cv").mean(), step_time_cv_max=pl.col("cv").max())
    )


def _imbalance(con: duckdb.DuckDBPyConnection, run_ids: list[int], groups: pl.DataFrame,
               steps: StepRange) -> pl.DataFrame:
    from polytrace_cli.analyze.imbalance import per_step

    return (
        shared(per_step, con, run_ids, steps).filter(pl.col("lambda").is_not_null())
        .join(groups.select("run", "group"), on="run")
        .group_by("group")
        .agg(imbalance_runs=pl.col("run").n_unique(), imbalance_steps=pl.len(),
             lambda_mean=pl.col("lambda").mean(), lambda_max=pl.col("lambda").max())
    )


def by_group(con: duckdb.DuckDBPyConnection, run_ids: list[int], by: str = "task",
             steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """One row per task (or model) with the `COLUMNS` above, formulas in the module docstring;
    ordered by group name, the unlabeled group last."""
    groups = run_groups(con, run_ids, by)
    counts = groups.group_by("group").agg(runs=pl.len())
    out = (
        counts.join(_lengths(con, run_ids, by, steps), on="group", how="left", nulls_equal=True)
        .join(_step_time_cv(con, run_ids, groups, steps), on="group", how="left", nulls_equal=True)
        .join(_imbalance(con, run_ids, groups, steps), on="group", how="left", nulls_equal=True)
        .with_columns(by=pl.lit(by))
        .with_columns(pl.col(name).fill_null(0) for name in
                      ("sample_runs", "samples", "step_time_runs", "imbalance_runs", "imbalance_steps"))
    )
    return out.select(list(COLUMNS)).cast(COLUMNS).sort("group", nulls_last=True)
