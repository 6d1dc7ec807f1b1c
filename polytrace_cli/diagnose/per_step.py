"""The `polytrace steps` frame with its two explanation columns filled from `explain`'s decomposition.

`analyze.per_step` cannot call `diagnose` (the diagnosis reads the analyses), so the columns are
joined here:

    expected_step_s  the run's step-time model at the step's own workload, no validation or
                     checkpoint: Σ_k f_k(W_step) (`decompose`'s model_s)
    top_cause        on a slow step (`thresholds.slow_steps`), the cause with the largest positive
                     seconds of its excess over the run's expected step; empty on the other steps

Both are computed for every timed step of a run with enough timed training steps for a model
(`explain.MIN_TRAINING_STEPS`); they stay empty on runs without step timings, as in `per_step`.
The model is fitted on the whole run, whatever step range is shown.
"""

from __future__ import annotations

import duckdb
import polars as pl

from polytrace_cli.analyze.common import ALL_STEPS, StepRange
from polytrace_cli.analyze.per_step import per_step
from polytrace_cli.diagnose.explain import MIN_TRAINING_STEPS, decompose_run
from polytrace_cli.model import read_workload, training_mask
from polytrace_cli.store.queries import run_ids as ids_of_runs

EXPLAINED_COLUMNS = {"segment": pl.Int64, "step": pl.Int64, "expected_step_s": pl.Float64, "top_cause": pl.String}


def explained_steps(con: duckdb.DuckDBPyConnection, run_id: int) -> pl.DataFrame:
    """Per timed step of the run: segment, step, expected_step_s, top_cause (`EXPLAINED_COLUMNS`,
    see the module docstring); no rows when the run has too few timed training steps."""
    frame = read_workload(con, run_id)
    mask = training_mask(frame)
    if int(mask.sum()) < MIN_TRAINING_STEPS:
        return pl.DataFrame(schema=EXPLAINED_COLUMNS)
    run = decompose_run(frame, mask)
    slow = run.steps.filter(pl.Series(run.slow_flags)).select("segment", "step")
    top = (run.causes.join(slow, on=["segment", "step"]).filter(pl.col("seconds") > 0)
           .sort("seconds", descending=True)
           .group_by("segment", "step", maintain_order=True).agg(top_cause=pl.col("cause").first()))
    return (run.steps.select("segment", "step", expected_step_s="model_s")
            .join(top, on=["segment", "step"], how="left", maintain_order="left")
            .cast(EXPLAINED_COLUMNS))


def steps_with_causes(con: duckdb.DuckDBPyConnection, run_ids: list[int],
                      steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """`per_step` with expected_step_s and top_cause filled per run from `explained_steps`; rows
    and columns as `per_step`."""
    frame = per_step(con, run_ids, steps)
    timed = frame.filter(pl.col("basis") == "step_aggregates")["run"].unique(maintain_order=True).to_list()
    if not timed:
        return frame
    names = dict(zip(timed, ids_of_runs(con, timed)))
    parts = [explained_steps(con, names[name]).with_columns(run=pl.lit(name)) for name in timed]
    explained = pl.concat(parts).rename({"expected_step_s": "explained_s", "top_cause": "explained_cause"})
    return (frame.join(explained, on=["run", "segment", "step"], how="left", maintain_order="left")
            .with_columns(expected_step_s=pl.coalesce("expected_step_s", "explained_s"),
                          top_cause=pl.coalesce("top_cause", "explained_cause"))
            .select(frame.columns))
