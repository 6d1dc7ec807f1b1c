"""Backtest of the step-time model on held-out steps, against two naive baselines.

The steps that log both a step time and a generation time are taken in step order; the first half
(⌊n/2⌋ steps) is the training half, the rest is held out. The model (`polytrace_cli.model`) is
fitted on the training half's steps that `training_mask` keeps (no warm-up, validation or
checkpoint step), then predicts every stage of each
held-out step from that step's workload. Testing and checkpoint seconds follow the logged
schedule: a held-out step that validated (checkpointed) gets the training half's median testing
(checkpoint) seconds. The predicted step time is Σ predicted stages + the model's rest + those
overheads, compared with the step's wall time (step_s, plus the overheads logged outside it).

Per stage, with the PolyTrace definition:

    error_s    = (predicted_s − real_s) / real_s          for each held-out step logging the stage
    accuracy   = 100 % − mean |error_s| · 100 %

The baselines get the same split and the same formula:

    median_baseline    every held-out step predicted as the median of the stage over the steps
                       the model is fitted on (for testing and checkpoint seconds: the training
                       half's steps that log them, the same median the model uses)
    previous_baseline  every held-out step predicted as the stage's most recent logged value
                       before it (the last training step for the first held-out step)

`overall` is the mean of the per-stage accuracies over the stages the run logs on held-out steps
(the step time itself is not a stage). For generation, `in_range_accuracy` restricts the held-out
steps to those whose r_max and response_tokens lie inside the range seen in the training half.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb
import numpy as np
import polars as pl

from polytrace_cli.errors import PolytraceError
from polytrace_cli.jsontext import json_text
from polytrace_cli.model import (
    MODELLED_STAGES, OVERHEADS, STAGE_FEATURES, fit_model, read_workload, run_info, training_mask,
)

MIN_STEPS = 4
BACKTEST_COLUMNS = ("stage", "steps", "accuracy", "median_baseline", "previous_baseline")


def accuracy(predicted: np.ndarray, real: np.ndarray) -> tuple[float | None, int]:
    """100 · (1 − mean |(predicted − real) / real|) over the rows where both are finite and real > 0,
    and how many rows that is; None when no row qualifies."""
    predicted, real = np.asarray(predicted, dtype=float), np.asarray(real, dtype=float)
    keep = np.isfinite(predicted) & np.isfinite(real) & (real > 0)
    if not keep.any():
        return None, 0
    error = (predicted[keep] - real[keep]) / real[keep]
    return float(100.0 * (1.0 - np.mean(np.abs(error)))), int(keep.sum())


@dataclass(frozen=True)
class StageAccuracy:
    """Accuracy (%) of the model and of the two baselines for one stage over the held-out steps."""

    steps: int
    accuracy: float | None
    median_baseline: float | None
    previous_baseline: float | None
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The accuracies, the step count and any stage-specific extras."""
        return {"accuracy": self.accuracy, "median_baseline": self.median_baseline,
                "previous_baseline": self.previous_baseline, "steps": self.steps, **self.extra}


@dataclass(frozen=True)
class BacktestResult:
    """A run's backtest: per-stage and step accuracies, their mean over stages, the split, notes."""

    run: str
    train_steps: int
    test_steps: int
    first_test_step: int
    stages: dict[str, StageAccuracy]
    step: StageAccuracy
    notes: tuple[str, ...] = ()

    @property
    def overall(self) -> dict[str, float | None]:
        """Mean over the stages of each accuracy (stages without a value are left out)."""
        out: dict[str, float | None] = {}
        for key in ("accuracy", "median_baseline", "previous_baseline"):
            values = [getattr(s, key) for s in self.stages.values() if getattr(s, key) is not None]
            out[key] = float(np.mean(values)) if values else None
        out["stages"] = len(self.stages)
        return out

    def table(self) -> pl.DataFrame:
        """One row per stage, then `step` and `overall` (columns `BACKTEST_COLUMNS`)."""
        rows = [(name, s.steps, s.accuracy, s.median_baseline, s.previous_baseline)
                for name, s in self.stages.items()]
        rows.append(("step", self.step.steps, self.step.accuracy, self.step.median_baseline,
                     self.step.previous_baseline))
        o = self.overall
        rows.append(("overall", self.test_steps, o["accuracy"], o["median_baseline"], o["previous_baseline"]))
        schema = {"stage": pl.String, "steps": pl.Int64, "accuracy": pl.Float64, "median_baseline": pl.Float64,
                  "previous_baseline": pl.Float64}
        return pl.DataFrame(rows, schema=schema, orient="row")

    def to_dict(self) -> dict:
        """{"run", "split", "stages": {stage: {...}}, "step": {...}, "overall": {...}, "notes"}."""
        return {
            "run": self.run,
            "split": {"train_steps": self.train_steps, "test_steps": self.test_steps,
                      "first_test_step": self.first_test_step},
            "stages": {name: s.to_dict() for name, s in self.stages.items()},
            "step": self.step.to_dict(),
            "overall": self.overall,
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        """JSON text of `to_dict`, as `polytrace whatif --backtest --json` prints it."""
        return json_text(self.to_dict())


def _baselines(train: np.ndarray, test: np.ndarray, previous: np.ndarray) -> tuple[float | None, float | None]:
    logged = train[np.isfinite(train)]
    median = float(np.median(logged)) if logged.size else np.nan
    median_accuracy, _ = accuracy(np.full(test.size, median), test)
    previous_accuracy, _ = accuracy(previous, test)
    return median_accuracy, previous_accuracy


def _column(df: pl.DataFrame, name: str) -> np.ndarray:
    return df[name].cast(pl.Float64).fill_null(np.nan).to_numpy()


def _previous(values: np.ndarray) -> np.ndarray:
    """Each row's most recent finite value strictly before it (NaN when none)."""
    return pl.Series(values).fill_nan(None).forward_fill().shift(1).fill_null(np.nan).to_numpy()


def backtest_frame(frame: pl.DataFrame, run: str = "") -> BacktestResult:
    """Backtest a workload frame (`read_workload`); see the module docstring."""
    # wall_s is the step time every view reads: logged, or derived from stage timers when no total is logged.
    eligible = frame.filter(pl.col("gen_s").is_not_null() & pl.col("wall_s").is_not_null())
    n = eligible.height
    if n < MIN_STEPS:
        raise PolytraceError(f"a backtest needs at least {MIN_STEPS} steps with both a step time and a "
                             f"generation time; run {run!r} has {n}")
    n_train = n // 2
    is_train = pl.Series(np.arange(n) < n_train)
    mask = training_mask(eligible) & is_train
    if not mask.any():
        raise PolytraceError(f"the first {n_train} steps of run {run!r} are all warm-up, validation or "
                             "checkpoint steps: there is nothing to fit the model on")
    model = fit_model(eligible, mask)
    predicted = model.predict(eligible)
    train_rows, test_rows = np.arange(n) < n_train, np.arange(n) >= n_train
    fit_rows = mask.to_numpy()
    notes: list[str] = []

    stages: dict[str, StageAccuracy] = {}
    step_prediction = predicted["step_s"].to_numpy().copy()
    unpredictable = np.zeros(n, dtype=bool)
    for stage in (*MODELLED_STAGES, *OVERHEADS):
        real = _column(eligible, f"{stage}_s")
        if not np.isfinite(real[test_rows]).any():
            continue
        if stage in OVERHEADS:
            logged = real[train_rows][np.isfinite(real[train_rows])]
            typical = float(np.median(logged)) if logged.size else np.nan
            guess = np.where(np.isfinite(real), typical, np.nan)
            scheduled = np.isfinite(real) & test_rows
            if not logged.size:
                notes.append(f"{stage}: no training step logs it, so its held-out occurrences cannot be "
                             "predicted; the steps holding them are left out of the step accuracy")
                unpredictable |= scheduled
            else:
                step_prediction = step_prediction + np.where(scheduled, typical, 0.0)
        elif f"{stage}_s" in predicted.columns:
            guess = predicted[f"{stage}_s"].to_numpy()
        else:
            continue
        model_accuracy, count = accuracy(guess[test_rows], real[test_rows])
        basis = train_rows if stage in OVERHEADS else fit_rows
        median_baseline, previous_baseline = _baselines(real[basis], real[test_rows],
                                                        _previous(real)[test_rows])
        extra = {}
        if stage == "gen":
            extra = _in_range(eligible, model.training, test_rows, guess, real)
        stages[stage] = StageAccuracy(count, model_accuracy, median_baseline, previous_baseline, extra)

    wall = _column(eligible, "wall_s")
    held = test_rows & ~unpredictable
    step_accuracy, count = accuracy(step_prediction[held], wall[held])
    median_baseline, previous_baseline = _baselines(wall[fit_rows], wall[held], _previous(wall)[held])
    step = StageAccuracy(count, step_accuracy, median_baseline, previous_baseline)
    worse = [name for name, s in {**stages, "step": step}.items()
             if s.accuracy is not None and s.median_baseline is not None and s.accuracy < s.median_baseline]
    if worse:
        notes.append(f"the model is less accurate than the median baseline on: {', '.join(worse)}")
    first_test = int(eligible["step"][n_train])
    warm = int((eligible["segment_start"] | eligible["restart"]).filter(pl.Series(test_rows)).sum())
    if warm:
        notes.append(f"{warm} held-out step(s) start a segment or follow a restart (warm-up): the model "
                     "predicts them at steady-state speed")
    return BacktestResult(run, n_train, n - n_train, first_test, stages, step, tuple(notes))


def _in_range(df: pl.DataFrame, fitted: pl.Series, test_rows: np.ndarray, guess: np.ndarray,
              real: np.ndarray) -> dict:
    """Generation accuracy over held-out steps whose generation features lie inside the fitted range."""
    inside = test_rows.copy()
    fit_rows = fitted.fill_null(False).to_numpy()
    for name in STAGE_FEATURES["gen"]:
        x = _column(df, name)
        seen = x[fit_rows & np.isfinite(x)]
        if not seen.size:
            continue
        inside &= np.isfinite(x) & (x >= seen.min()) & (x <= seen.max())
    value, count = accuracy(guess[inside], real[inside])
    return {"in_range_accuracy": value, "in_range_steps": count}


def backtest_run(con: duckdb.DuckDBPyConnection, run: str | int) -> BacktestResult:
    """Backtest the step-time model of a stored run (see the module docstring)."""
    info = run_info(con, run)
    return backtest_frame(read_workload(con, info.run_id), info.name)
