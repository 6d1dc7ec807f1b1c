"""Backtest of the step-time forecaster on generated verl logs with drift and level shifts, beside the fair
median and recent baselines, fixed split and walk-forward; and the fixed-form workload model (`fit_model`)
on the same split, the model the forecaster chooses from.

    .venv/bin/python benchmarks/model_backtest.py            # prints one table per log and a summary
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.model import fit_model, read_workload, training_mask
from polytrace_cli.simulate.backtest import _eligible, accuracy, backtest_run
from polytrace_cli.store import open_store
from polytrace_cli.ingest.registry import declared_metric_names
from polytrace_cli.workload.presets import preset
from polytrace_cli.workload.steplog import StepTimeModel, write_step_log
from polytrace_cli.workload.synth import with_overrides

LOGS = {
    # per-token cost of update_actor drifting up 12 % while lengths drift down; old_log_prob shifting level
    "math-drift": ("math", dict(steps=300, batch=16, n=8, dp_ranks=8, max_response_len=16384, drift=-0.003, seed=3),
                   StepTimeModel(validate_every=25, checkpoint_every=100, cost_drift=(("update_actor", 1.12),),
                                 level_shifts=((100, "old_log_prob", -1.0),))),
    # generation slowing 15 % over the run; a weight-sync level shift
    "code-shift": ("code", dict(steps=240, batch=16, n=16, dp_ranks=4, max_response_len=16384, drift=0.001, seed=4),
                   StepTimeModel(validate_every=20, checkpoint_every=60, cost_drift=(("gen", 1.15),),
                                 level_shifts=((150, "update_actor", 6.0),), step_includes_overheads=False)),
    # steady costs, a rising workload (the fixed-form model's home ground)
    "math-steady": ("math", dict(steps=200, batch=32, n=8, dp_ranks=8, max_response_len=8192, drift=0.003, seed=5),
                    StepTimeModel(validate_every=20, checkpoint_every=50)),
    # a level shift in generation (a slower node) late in the training half
    "math-gen-shift": ("math", dict(steps=240, batch=32, n=8, dp_ranks=8, max_response_len=8192, drift=0.0, seed=6),
                       StepTimeModel(validate_every=30, level_shifts=((90, "gen", 15.0),))),
}


def fixed_form_step_accuracy(con, run: str) -> float | None:
    """The fixed-form model's step accuracy on the same split, with the same schedule of overheads."""
    frame = read_workload(con, run)
    eligible, n_train = _eligible(frame, run)
    mask = training_mask(eligible) & pl.Series(np.arange(eligible.height) < n_train)
    model = fit_model(eligible, mask)
    predicted = model.predict(eligible)["step_s"].to_numpy()
    for overhead in ("testing", "save_checkpoint"):
        values = eligible[f"{overhead}_s"].cast(pl.Float64).fill_null(np.nan).to_numpy()
        logged = values[:n_train][np.isfinite(values[:n_train])]
        predicted = predicted + np.where(np.isfinite(values), np.median(logged) if logged.size else np.nan, 0.0)
    wall = eligible["wall_s"].to_numpy()
    held = np.arange(eligible.height) >= n_train
    return accuracy(predicted[held], wall[held])[0]


def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        db = Path(folder) / "bench.duckdb"
        con = open_store(db, metric_names=declared_metric_names)
        for name, (task, overrides, truth) in LOGS.items():
            lengths, base = preset(task)
            spec = with_overrides(base, **overrides)
            written = write_step_log(lengths, spec, truth, Path(folder) / name)
            ingest_paths(con, written.files, run_name=name)
        summary = []
        for name in LOGS:
            started = time.perf_counter()
            result = backtest_run(con, name, walk_forward=True)
            seconds = time.perf_counter() - started
            table = result.table().select("stage", "method", "accuracy", "median_baseline", "recent_baseline",
                                          "margin", "walk_forward", "walk_median", "walk_recent")
            print(f"\n{name}: {result.test_steps} held-out steps, backtest + walk-forward in {seconds:.1f} s "
                  f"(refit every {result.walk_forward.refit_every})")
            with pl.Config(tbl_rows=40, tbl_cols=20, float_precision=2, tbl_width_chars=160):
                print(table)
            for note in result.notes:
                print("  note:", note)
            summary.append((name, result.step.accuracy, fixed_form_step_accuracy(con, name),
                            result.step.median_baseline, result.step.recent_baseline,
                            result.overall["accuracy"], result.overall["best_baseline"],
                            result.walk_forward.step.accuracy, result.walk_forward.step.median_baseline,
                            result.walk_forward.step.recent_baseline))
        con.close()
    frame = pl.DataFrame(summary, schema=["log", "step", "fixed_form", "fair_median", "recent", "overall",
                                          "overall_best_baseline", "walk_step", "walk_median", "walk_recent"],
                         orient="row")
    print("\nsummary (step accuracy %, overall = mean over stages)")
    with pl.Config(tbl_rows=20, tbl_cols=20, float_precision=2, tbl_width_chars=160):
        print(frame)
    print(f"mean margin of the step over the fair median: {float((frame['step'] - frame['fair_median']).mean()):.2f} points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
