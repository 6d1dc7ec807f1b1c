"""Step-time analysis of step-aggregate runs (console, JSONL, wandb, TensorBoard logs).

Everything here reads the `steps` view: one row per (run, segment, step) with the canonical stage
timers in seconds. Runs without step metrics (PolyTrace workload traces) get empty detail frames
and a summary row with basis 'no_step_metrics'.
"""

from __future__ import annotations

import json

import duckdb
import numpy as np
import polars as pl

from polytrace_cli.analyze.common import ALL_STEPS, StepRange, frame, ids_sql, run_names
from polytrace_cli.analyze.registry import register
from polytrace_cli.analyze.shared_frames import once_per_report, shared
from polytrace_cli.semantics import step_timers
from polytrace_cli.store.catalog import steps_of_runs_sql

# Timers that verl counts inside timing_s/step in some versions and not in others; run meta says
# which way each run logged them (`step_timers.step_time_inclusion`).
EXTRA_TIMERS = tuple(step_timers.EXTRA_TIMERS)
# Stage timers are printed with 3 decimals by old verl: a sum of a dozen may miss the step by this much.
ROUNDING_TOLERANCE_S = 0.01
OUTLIER_Z = 3.5
MAD_SCALE = 1.4826
MIN_POINTS = 3


def _steps_sql(run_ids: list[int], columns: list[str], steps: StepRange) -> str:
    """The `steps` rows of the runs with the canonical `columns` (`catalog.steps_of_runs_sql`), each with its
    run's name and whether it is the first step of a segment after a restart."""
    return f"""
        SELECT st.*, runs.name AS run,
               st.segment > 0 AND st.step = min(st.step) OVER (PARTITION BY st.run_id, st.segment) AS first_after_restart
        FROM ({steps_of_runs_sql(ids_sql(run_ids), columns, steps.sql('step'))}) st JOIN runs USING (run_id)
    """


def stages(con: duckdb.DuckDBPyConnection) -> tuple[str, ...]:
    """The stage names, in order: the stage columns of the `steps` view without their `_s`."""
    return tuple(column.removesuffix("_s") for column in step_timers.stage_columns(con))


STEP_TIME_INCLUSION_COLUMNS = {"run": pl.String, "includes_testing": pl.Boolean, "includes_checkpoint": pl.Boolean}


def step_time_inclusion(con: duckdb.DuckDBPyConnection, run_ids: list[int]) -> pl.DataFrame:
    """Per run: includes_testing, includes_checkpoint (true / false / null = cannot tell), whether
    its step time counts the testing and checkpoint timers, from run meta
    (`step_time_includes_testing` / `step_time_includes_checkpoint`) or, for a run ingested
    without them, decided from its numbers by `step_timers.step_time_inclusion`."""
    rows = []
    for run_id, name, meta in con.execute(
            "SELECT run_id, name, meta FROM runs WHERE run_id IN (SELECT unnest(?)) ORDER BY run_id", [run_ids]).fetchall():
        meta = json.loads(meta or "{}")
        keys = step_timers.EXTRA_TIMERS.values()
        decided = meta if all(key in meta for key in keys) else shared(step_timers.step_time_inclusion, con, run_id)
        rows.append((name, decided.get("step_time_includes_testing"), decided.get("step_time_includes_checkpoint")))
    return pl.DataFrame(rows, schema=STEP_TIME_INCLUSION_COLUMNS, orient="row")


# The columns of `per_step` other than its stage columns: one `<stage>_s` per name of `stages(con)`,
# placed after `step` (`per_step_columns` gives the full order).
PER_STEP_COLUMNS = {
    "run": pl.String, "segment": pl.Int64, "step": pl.Int64,
    **{f"{name}_s": pl.Float64 for name in EXTRA_TIMERS},
    "step_s": pl.Float64, "stage_sum_s": pl.Float64, "unexplained_s": pl.Float64, "timers_exceed_step": pl.Boolean,
    "response_length_mean": pl.Float64, "response_length_max": pl.Float64, "testing": pl.Boolean,
    "checkpoint": pl.Boolean, "truncated_line": pl.Boolean, "restart": pl.Boolean,
    "validation_only": pl.Boolean, "step_time_basis": pl.String, "step_s_counts_testing": pl.Boolean,
    "step_s_counts_checkpoint": pl.Boolean,
}


def per_step_columns(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The columns of `per_step`, in order: run, segment, step, one `<stage>_s` per `stages(con)`, then
    the rest of PER_STEP_COLUMNS."""
    fixed = list(PER_STEP_COLUMNS)
    return [*fixed[:3], *(f"{name}_s" for name in stages(con)), *fixed[3:]]


def stage_columns_of(per_step_frame: pl.DataFrame) -> list[str]:
    """The stage columns (`<stage>_s`) of a `per_step` frame, in its order: those it has beyond
    PER_STEP_COLUMNS."""
    return [column for column in per_step_frame.columns if column not in PER_STEP_COLUMNS]


def per_step(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """Per (run, segment, step), F4: each stage's seconds (`<stage>_s`), testing_s,
    save_checkpoint_s, step_s = the canonical step time (`analyze.step_frame`: the logged total with
    the overheads it leaves out added back, or Σ the timers when no total is logged),
    stage_sum_s = Σ stage timers + the extra timers (testing, checkpoint) that step_s counts,
    unexplained_s = step_s − stage_sum_s, the response-length aggregates, and the reason flags
    (testing, checkpoint, truncated_line, restart, validation_only).

    unexplained_s is null where it cannot be told: the step holds an extra timer whose inclusion
    is unknown, or the timers exceed the step time by more than the rounding tolerance (then
    timers_exceed_step is true); a shortfall within the tolerance counts as 0. It is never negative.
    """
    from polytrace_cli.analyze.step_frame import shared_step_frame

    names = stages(con)
    stage_sum = " + ".join(f"coalesce({name}_s, 0)" for name in names) or "0"
    stage_columns = ", ".join(f"{name}_s" for name in (*names, *EXTRA_TIMERS))
    detail = frame(
        con,
        f"""
        WITH s AS ({_steps_sql(run_ids, [*(f"{name}_s" for name in (*names, *EXTRA_TIMERS)),
                                          "response_length_mean", "response_length_max"], steps)})
        SELECT run, segment::BIGINT AS segment, step::BIGINT AS step, {stage_columns},
               {stage_sum} AS stages_only_s,
               response_length_mean, response_length_max,
               has_testing AS testing, has_checkpoint AS checkpoint, truncated_line,
               first_after_restart OR list_has_any(flags, ['restart', 'resumed']) AS restart,
               is_validation_only AS validation_only
        FROM s
        ORDER BY run, segment, step
        """,
    )
    canonical = shared_step_frame(con, run_ids, steps).select(
        "run", "segment", "step", "step_s", "step_time_basis", "step_s_counts_testing", "step_s_counts_checkpoint")
    detail = detail.join(canonical, on=["run", "segment", "step"], how="left", maintain_order="left")
    if "gen" in names and "trainer_wait" in names:
        # In the modes where verl's timing_s/gen is the trainer's wait, its seconds are the trainer_wait stage.
        from polytrace_cli.analyze.semantics import semantics
        from polytrace_cli.semantics.execution_mode import WAIT_MODES

        waiting = [row["run"] for row in semantics(con, run_ids).select("run", "execution_mode").iter_rows(named=True)
                   if row["execution_mode"] in WAIT_MODES]
        if waiting:
            wait = pl.col("run").is_in(waiting)
            detail = detail.with_columns(
                trainer_wait_s=pl.when(wait).then(pl.coalesce("trainer_wait_s", "gen_s")).otherwise(pl.col("trainer_wait_s")),
                gen_s=pl.when(wait).then(None).otherwise(pl.col("gen_s")))

    def counted(timer: str, counts: str) -> pl.Expr:
        seconds = pl.col(f"{timer}_s")
        return (pl.when(seconds.is_null() | (seconds == 0)).then(pl.lit(0.0))
                .when(pl.col(counts)).then(seconds)
                .when(~pl.col(counts)).then(pl.lit(0.0)))

    raw = pl.col("step_s") - pl.col("stage_sum_s")
    detail = detail.with_columns(
        stage_sum_s=pl.col("stages_only_s") + counted("testing", "step_s_counts_testing")
        + counted("save_checkpoint", "step_s_counts_checkpoint")
    ).with_columns(
        unexplained_s=pl.when(raw < -ROUNDING_TOLERANCE_S).then(None).when(raw < 0).then(pl.lit(0.0)).otherwise(raw),
        timers_exceed_step=(raw < -ROUNDING_TOLERANCE_S).fill_null(False),
    )
    return detail.select(per_step_columns(con)).cast({name: dtype for name, dtype in PER_STEP_COLUMNS.items()})


STAGE_STATS_COLUMNS = {
    "run": pl.String, "stage": pl.String, "steps": pl.Int64, "mean_s": pl.Float64, "std_s": pl.Float64,
    "cv": pl.Float64, "min_s": pl.Float64, "max_s": pl.Float64, "max_over_min": pl.Float64,
    "p95_over_p50": pl.Float64, "share": pl.Float64,
}


def stage_stats(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """Per run × stage (the `steps` view's stages and 'step', the canonical step time of `per_step`)
    over the training steps that logged the stage: mean_s, std_s (sample), cv = std/mean, min_s,
    max_s, max_over_min = max/min, p95_over_p50 = p95/p50 (linear quantiles), and share = Σ stage /
    Σ step_s over the steps with a step time (a stage missing in such a step counts 0; null when no
    step has a step time)."""
    names = [f"{name}_s" for name in (*stages(con), "step")]
    detail = shared(per_step, con, run_ids, steps)
    totals = detail.filter(pl.col("step_s").is_not_null()).group_by("run").agg(step_total=pl.col("step_s").sum())
    long = (detail.filter(~pl.col("validation_only"))
            .unpivot(index=["run", "step_s"], on=names, variable_name="stage", value_name="seconds")
            .filter(pl.col("seconds").is_not_null()))
    seconds = pl.col("seconds")
    stats = (
        long.join(totals, on="run", how="left")
        .group_by("run", "stage", maintain_order=True)
        .agg(steps=pl.len(), mean_s=seconds.mean(), std_s=seconds.std(), min_s=seconds.min(), max_s=seconds.max(),
             p95=seconds.quantile(0.95, "linear"), p50=seconds.quantile(0.5, "linear"),
             timed=seconds.filter(pl.col("step_s").is_not_null()).sum(), step_total=pl.col("step_total").first())
        .with_columns(
            cv=pl.col("std_s") / pl.when(pl.col("mean_s") != 0).then(pl.col("mean_s")),
            max_over_min=pl.col("max_s") / pl.when(pl.col("min_s") != 0).then(pl.col("min_s")),
            p95_over_p50=pl.col("p95") / pl.when(pl.col("p50") != 0).then(pl.col("p50")),
            share=pl.col("timed") / pl.when(pl.col("step_total") != 0).then(pl.col("step_total")),
            order=pl.col("stage").replace_strict(names, list(range(len(names))), return_dtype=pl.Int64),
            stage=pl.col("stage").str.strip_suffix("_s"),
        )
        .sort("run", "order")
    )
    return stats.select(list(STAGE_STATS_COLUMNS)).cast(STAGE_STATS_COLUMNS)


SERIES_COLUMNS = {
    "run": pl.String, "segment": pl.Int64, "step": pl.Int64, "step_s": pl.Float64, "gen_s": pl.Float64,
    "robust_z": pl.Float64, "reasons": pl.String, "outlier": pl.Boolean,
    "slow_outlier": pl.Boolean,
}


def series(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """Per step with a step time, F5: step_s, gen_s, robust_z = |step_s − median| / (1.4826 · MAD)
    (median and MAD = median |step_s − median| over the run's steps; null when MAD = 0),
    outlier = robust_z > 3.5, slow_outlier = outlier on the slow side (step_s > median), and reasons:
    the step's flags among testing, checkpoint, truncated_line, restart, validation_only,
    comma-separated ('' when none)."""
    detail = shared(per_step, con, run_ids, steps).filter(pl.col("step_s").is_not_null())
    reason_columns = ("testing", "checkpoint", "truncated_line", "restart", "validation_only")
    median = pl.col("step_s").median().over("run")
    with_z = detail.with_columns(deviation=(pl.col("step_s") - median).abs()).with_columns(
        mad=pl.col("deviation").median().over("run")
    )
    return with_z.select(
        "run", "segment", "step", "step_s", "gen_s",
        robust_z=pl.when(pl.col("mad") > 0).then(pl.col("deviation") / (MAD_SCALE * pl.col("mad"))),
        slower=pl.col("step_s") > median,
        reasons=pl.concat_list(
            [pl.when(pl.col(name)).then(pl.lit(name)) for name in reason_columns]
        ).list.drop_nulls().list.join(","),
    ).with_columns(outlier=(pl.col("robust_z") > OUTLIER_Z).fill_null(False)).with_columns(
        slow_outlier=pl.col("outlier") & pl.col("slower")).drop("slower")


def outliers(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """The steps of `series` with robust_z > 3.5, each with its reasons."""
    return series(con, run_ids, steps).filter(pl.col("outlier"))


def correlations(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """Per run × time (step_s, gen_s) × length (response_length_max, response_length_mean):
    n, Pearson r and p, Spearman ρ and p (`significance.pearson` and `spearman`) over training steps
    where both are logged; left out below 3 points or when either side is constant."""
    from polytrace_cli.analyze.significance import pearson, spearman

    detail = shared(per_step, con, run_ids, steps).filter(~pl.col("validation_only"))

    rows = []
    for (run,), group in detail.group_by("run", maintain_order=True):
        for time in ("step_s", "gen_s"):
            for length in ("response_length_max", "response_length_mean"):
                pair = group.select(time, length).drop_nulls()
                x, y = pair[length].to_numpy(), pair[time].to_numpy()
                if pair.height < MIN_POINTS or x.min() == x.max() or y.min() == y.max():
                    continue
                rows.append((run, time.removesuffix("_s"), length, pair.height, *pearson(x, y), *spearman(x, y)))
    return pl.DataFrame(
        rows,
        schema={"run": pl.String, "time": pl.String, "length": pl.String, "n": pl.Int64, "pearson_r": pl.Float64,
                "pearson_p": pl.Float64, "spearman_r": pl.Float64, "spearman_p": pl.Float64},
        orient="row",
    )


LENGTH_FIT_COLUMNS = {
    "run": pl.String, "segment": pl.Int64, "step": pl.Int64, "response_length_max": pl.Float64,
    "step_s": pl.Float64, "slope_s_per_token": pl.Float64, "intercept_s": pl.Float64, "r": pl.Float64,
    "fitted_step_s": pl.Float64,
}


def _least_squares_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """(slope, intercept, r) of the least-squares line y ≈ intercept + slope · x, r Pearson's
    correlation (undefined, NaN, when y is constant); x must not be constant."""
    dx, dy = x - x.mean(), y - y.mean()
    sxx, syy, sxy = float(dx @ dx), float(dy @ dy), float(dx @ dy)
    slope = sxy / sxx
    r = sxy / np.sqrt(sxx * syy) if syy > 0 else float("nan")
    return slope, float(y.mean()) - slope * float(x.mean()), float(np.clip(r, -1.0, 1.0))


def length_fit(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """F11 points: per training step, response_length_max and step_s, with the run's least-squares
    line step_s ≈ intercept_s + slope_s_per_token · response_length_max (ordinary least squares:
    slope = cov(x, y) / var(x), intercept = ȳ − slope · x̄), fitted_step_s on it and Pearson's r.
    Runs with under 3 points or a constant length are left out."""
    detail = shared(per_step, con, run_ids, steps).filter(~pl.col("validation_only"))
    parts = []
    for (run,), group in detail.group_by("run", maintain_order=True):
        points = group.select("run", "segment", "step", "response_length_max", "step_s").drop_nulls()
        x = points["response_length_max"].to_numpy()
        if points.height < MIN_POINTS or x.min() == x.max():
            continue
        slope, intercept, r = _least_squares_line(x, points["step_s"].to_numpy())
        parts.append(points.with_columns(
            slope_s_per_token=pl.lit(slope), intercept_s=pl.lit(intercept), r=pl.lit(r),
            fitted_step_s=intercept + slope * pl.col("response_length_max"),
        ))
    if not parts:
        return pl.DataFrame(schema={"run": pl.String, "segment": pl.Int64, "step": pl.Int64,
                                    "response_length_max": pl.Float64, "step_s": pl.Float64,
                                    "slope_s_per_token": pl.Float64, "intercept_s": pl.Float64,
                                    "r": pl.Float64, "fitted_step_s": pl.Float64})
    return pl.concat(parts)


STAGE, CV, STEP_STAGE = "stage", "cv", "step"  # read by `polytrace check`: the step row's CV
SUMMARY_COLUMNS = {
    "run": pl.String, "basis": pl.String, STAGE: pl.String, "steps": pl.Int64, "mean_s": pl.Float64,
    "std_s": pl.Float64, CV: pl.Float64, "min_s": pl.Float64, "max_s": pl.Float64,
    "max_over_min": pl.Float64, "p95_over_p50": pl.Float64, "share": pl.Float64,
    "mean_unexplained_s": pl.Float64, "step_includes_testing": pl.Boolean, "step_includes_checkpoint": pl.Boolean,
    "outlier_steps": pl.Int64,
    "step_vs_max_len_pearson": pl.Float64, "step_vs_max_len_spearman": pl.Float64,
    "gen_vs_max_len_pearson": pl.Float64, "gen_vs_max_len_spearman": pl.Float64,
    "step_vs_mean_len_pearson": pl.Float64, "gen_vs_mean_len_pearson": pl.Float64,
}


@register("stages", "Stage times (mean, CV, max/min, p95/p50, share), unexplained time, outlier steps, time vs length")
def summary(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """One row per run × stage with the `stage_stats` columns, plus run-level columns repeated on
    each row: mean_unexplained_s (mean over steps of `per_step`'s unexplained_s, never negative),
    step_includes_testing / step_includes_checkpoint (`step_time_inclusion`), outlier_steps (robust
    z > 3.5) and the Pearson/Spearman correlations of step and gen time with max and mean response
    length. basis 'step_aggregates'; a run without step metrics gets one row with basis
    'no_step_metrics' and no numbers."""
    with once_per_report():  # the per-step frame below is read by four of the parts: computed once
        return _summary(con, run_ids, steps)


def _summary(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange) -> pl.DataFrame:
    stats = stage_stats(con, run_ids, steps)
    detail = shared(per_step, con, run_ids, steps)
    unexplained = (
        detail.filter(pl.col("step_s").is_not_null())
        .group_by("run").agg(mean_unexplained_s=pl.col("unexplained_s").mean())
    )
    outlier_counts = series(con, run_ids, steps).group_by("run").agg(outlier_steps=pl.col("outlier").sum())
    corr = correlations(con, run_ids, steps)
    wide = pl.DataFrame({"run": list(run_names(con, run_ids).values())}, schema={"run": pl.String})
    for time, length, method, name in [
        ("step", "response_length_max", "pearson_r", "step_vs_max_len_pearson"),
        ("step", "response_length_max", "spearman_r", "step_vs_max_len_spearman"),
        ("gen", "response_length_max", "pearson_r", "gen_vs_max_len_pearson"),
        ("gen", "response_length_max", "spearman_r", "gen_vs_max_len_spearman"),
        ("step", "response_length_mean", "pearson_r", "step_vs_mean_len_pearson"),
        ("gen", "response_length_mean", "pearson_r", "gen_vs_mean_len_pearson"),
    ]:
        picked = corr.filter((pl.col("time") == time) & (pl.col("length") == length)).select("run", pl.col(method).alias(name))
        wide = wide.join(picked, on="run", how="left")
    measured = (
        stats.with_columns(basis=pl.lit("step_aggregates"))
        .join(unexplained, on="run", how="left")
        .join(step_time_inclusion(con, run_ids).rename({"includes_testing": "step_includes_testing",
                                                        "includes_checkpoint": "step_includes_checkpoint"}),
              on="run", how="left")
        .join(outlier_counts, on="run", how="left")
        .join(wide, on="run", how="left")
    )
    missing = sorted(set(run_names(con, run_ids).values()) - set(stats["run"].to_list()))
    empty = pl.DataFrame({"run": missing, "basis": ["no_step_metrics"] * len(missing)},
                         schema={"run": pl.String, "basis": pl.String})
    return pl.concat([measured.select(list(SUMMARY_COLUMNS)).cast(SUMMARY_COLUMNS), empty], how="diagonal_relaxed") \
        .select(list(SUMMARY_COLUMNS)).cast(SUMMARY_COLUMNS)
