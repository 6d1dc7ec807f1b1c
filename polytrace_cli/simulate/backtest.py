"""Backtest of the step-time forecaster on held-out steps, against baselines given the same information.

The steps with both a step time (the canonical step frame's wall time, `analyze.step_frame`) and a
generation time (an asynchronous trainer's wait for the rollout side in its stead) are taken in step order; the first half
(⌊n/2⌋ steps) is the training half, the rest is held out. The forecaster (`model.forecast`: per stage
the workload model, a recency-weighted or level-shifted fit, or the stage's recent level, chosen by
cross-validation inside the training half) is fitted on the training half's steps that
`training_mask` keeps (no warm-up, validation or checkpoint step), then predicts every stage of each
held-out step from that step's workload. Testing and checkpoint seconds follow the logged schedule:
a held-out step that validated (checkpointed) gets the training half's median testing (checkpoint)
seconds. The predicted step time is Σ predicted stages + the rest + those overheads, compared with
the step's wall time (the logged step time plus the overheads logged outside it, or derived from the
stage timers when the log has no step total).

Per stage, with the PolyTrace definition:

    error_s    = (predicted_s − real_s) / real_s          for each held-out step logging the stage
    accuracy   = 100 % − mean |error_s| · 100 %

The baselines get the same split, the same schedule and the same formula:

    median_baseline    the median of the stage over the steps the model is fitted on (for testing
                       and checkpoint seconds: over the training half's steps that log them); for the
                       step time, the median wall time of those steps plus, on a held-out step that
                       validates (checkpoints), the training half's median testing (checkpoint) seconds
    recent_baseline    the same with the median over the last RECENT_STEPS fitted steps (the last
                       RECENT_STEPS logged occurrences for testing and checkpoint seconds)
    previous_baseline  the stage's most recent logged value before the step (held-out values
                       included: it sees more than the model, and is reported for reference)

`margin` = accuracy − the better of median_baseline and recent_baseline (`best_baseline`).
`overall` is the mean of the per-stage accuracies over the stages the run logs on held-out steps
(the step time itself is not a stage). For generation, `in_range_accuracy` restricts the held-out
steps to those whose r_max and response_tokens lie inside the range seen in the training half.

Walk-forward (`walk_forward=True`): each held-out step is predicted from every step before it, as a
live monitor would: the forecaster is refitted on the steps before step i every `refit_every` steps
(1 up to MAX_REFITS held-out steps, else ⌈held-out / MAX_REFITS⌉) and predicts steps i..i+k−1 from
their workloads; the baselines are recomputed before every step (median and recent over the fitted
steps so far, previous the last logged value), all scored with the same formula on the same steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import duckdb
import numpy as np
import polars as pl

from polytrace_cli.analyze.semantics import DERIVED, crash_clause
from polytrace_cli.errors import PolytraceError
from polytrace_cli.jsontext import json_text
from polytrace_cli.model import MODELLED_STAGES, OVERHEADS, STAGE_FEATURES, read_workload, run_info, training_mask
from polytrace_cli.model.fit import stage_seconds
from polytrace_cli.model.forecast import RECENT_STEPS, Forecaster, StageChoice, fit_forecaster

MIN_STEPS = 4
MAX_REFITS = 60
BASELINES = ("median_baseline", "recent_baseline", "previous_baseline")
BACKTEST_COLUMNS = ("stage", "steps", "method", "accuracy", "median_baseline", "recent_baseline",
                    "previous_baseline", "margin", "walk_forward", "walk_median", "walk_recent", "walk_previous")


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
    """Accuracy (%) of the model and of the baselines for one stage over the held-out steps; `method`
    is the forecaster's choice for the stage."""

    steps: int
    accuracy: float | None
    median_baseline: float | None
    previous_baseline: float | None
    extra: dict = field(default_factory=dict)
    recent_baseline: float | None = None
    method: str | None = None

    @property
    def best_baseline(self) -> float | None:
        """The better of the median and recent baselines (the two that see what the model sees)."""
        values = [v for v in (self.median_baseline, self.recent_baseline) if v is not None]
        return max(values) if values else None

    @property
    def margin(self) -> float | None:
        """accuracy − best_baseline, in points."""
        best = self.best_baseline
        return None if self.accuracy is None or best is None else self.accuracy - best

    def to_dict(self) -> dict:
        """The accuracies, the best baseline and the margin over it, the step count, the method and
        any stage-specific extras."""
        return {"accuracy": self.accuracy, "median_baseline": self.median_baseline,
                "recent_baseline": self.recent_baseline, "previous_baseline": self.previous_baseline,
                "best_baseline": self.best_baseline, "margin": self.margin, "method": self.method,
                "steps": self.steps, **self.extra}


@dataclass(frozen=True)
class WalkForward:
    """Walk-forward accuracies per stage and for the step, on the same held-out steps as the split."""

    refit_every: int
    stages: dict[str, StageAccuracy]
    step: StageAccuracy

    @property
    def overall(self) -> dict[str, float | None]:
        """Mean over the stages of each accuracy."""
        return _overall(self.stages)

    def to_dict(self) -> dict:
        """{"refit_every", "stages", "step", "overall"}."""
        return {"refit_every": self.refit_every, "stages": {n: s.to_dict() for n, s in self.stages.items()},
                "step": self.step.to_dict(), "overall": self.overall}


def _overall(stages: dict[str, StageAccuracy]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for key in ("accuracy", *BASELINES):
        values = [getattr(s, key) for s in stages.values() if getattr(s, key) is not None]
        out[key] = float(np.mean(values)) if values else None
    best = [out[k] for k in ("median_baseline", "recent_baseline") if out[k] is not None]
    out["best_baseline"] = max(best) if best else None
    out["margin"] = None if out["accuracy"] is None or out["best_baseline"] is None else \
        out["accuracy"] - out["best_baseline"]
    out["stages"] = len(stages)
    return out


@dataclass(frozen=True)
class BacktestResult:
    """A run's backtest: per-stage and step accuracies, their mean over stages, the split, notes, and
    the walk-forward accuracies when asked for."""

    run: str
    train_steps: int
    test_steps: int
    first_test_step: int
    stages: dict[str, StageAccuracy]
    step: StageAccuracy
    notes: tuple[str, ...] = ()
    walk_forward: WalkForward | None = None

    @property
    def overall(self) -> dict[str, float | None]:
        """Mean over the stages of each accuracy (stages without a value are left out), the better
        baseline's and the margin over it."""
        return _overall(self.stages)

    def table(self) -> pl.DataFrame:
        """One row per stage, then `step` and `overall` (columns `BACKTEST_COLUMNS`; the walk_* columns
        null without a walk-forward)."""
        walk = self.walk_forward

        def row(name: str, s: StageAccuracy | None, w: StageAccuracy | None, steps: int) -> tuple:
            return (name, steps, s.method if s else None, *(getattr(s, k) if s else None for k in (
                "accuracy", "median_baseline", "recent_baseline", "previous_baseline", "margin")),
                    *(getattr(w, k) if w else None for k in ("accuracy", *BASELINES)))

        rows = [row(name, s, walk.stages.get(name) if walk else None, s.steps) for name, s in self.stages.items()]
        rows.append(row("step", self.step, walk.step if walk else None, self.step.steps))
        o, wo = self.overall, walk.overall if walk else {}
        rows.append(("overall", self.test_steps, None, o["accuracy"], o["median_baseline"], o["recent_baseline"],
                     o["previous_baseline"], o["margin"], wo.get("accuracy"), wo.get("median_baseline"),
                     wo.get("recent_baseline"), wo.get("previous_baseline")))
        schema = {name: pl.Float64 for name in BACKTEST_COLUMNS}
        schema.update(stage=pl.String, steps=pl.Int64, method=pl.String)
        return pl.DataFrame(rows, schema=schema, orient="row")

    def to_dict(self) -> dict:
        """{"run", "split", "stages": {stage: {...}}, "step": {...}, "overall": {...}, "notes",
        "walk_forward": {...} or null}."""
        return {
            "run": self.run,
            "split": {"train_steps": self.train_steps, "test_steps": self.test_steps,
                      "first_test_step": self.first_test_step},
            "stages": {name: s.to_dict() for name, s in self.stages.items()},
            "step": self.step.to_dict(),
            "overall": self.overall,
            "notes": list(self.notes),
            "walk_forward": self.walk_forward.to_dict() if self.walk_forward else None,
        }

    def to_json(self) -> str:
        """JSON text of `to_dict`, as `polytrace whatif --backtest --json` prints it."""
        return json_text(self.to_dict())


def _level(values: np.ndarray, recent: bool = False) -> float:
    logged = values[np.isfinite(values)]
    if recent:
        logged = logged[-RECENT_STEPS:]
    return float(np.median(logged)) if logged.size else np.nan


def _column(df: pl.DataFrame, name: str) -> np.ndarray:
    return df[name].cast(pl.Float64).fill_null(np.nan).to_numpy()


def _previous(values: np.ndarray) -> np.ndarray:
    """Each row's most recent finite value strictly before it (NaN when none)."""
    return pl.Series(values).fill_nan(None).forward_fill().shift(1).fill_null(np.nan).to_numpy()


def _eligible(frame: pl.DataFrame, run: str, crash: str = "") -> tuple[pl.DataFrame, int]:
    """The steps a backtest reads and how many of them it fits on. wall_s is the step time every view
    reads: logged, or derived from stage timers when no total is logged. A run that logs stage timers
    needs its generation time on each step (an asynchronous trainer's step has no generation of its own:
    its wait for the rollout side stands in); a run that logs none (TRL: `step_time` alone) is modelled
    as one whole step (`model.fit`), so every timed step counts."""
    staged = any(frame.get_column(f"{stage}_s").is_not_null().any() for stage in MODELLED_STAGES
                 if f"{stage}_s" in frame.columns)
    first_stage = pl.coalesce("gen_s", "trainer_wait_s") if "trainer_wait_s" in frame.columns else pl.col("gen_s")
    timed = pl.col("wall_s").is_not_null()
    eligible = frame.filter(first_stage.is_not_null() & timed if staged else timed)
    n = eligible.height
    if n < MIN_STEPS:
        needs = ("both a step time and a generation time (or, asynchronous, a wait for the rollout)" if staged
                 else "a step time")
        raise PolytraceError(f"a backtest needs at least {MIN_STEPS} steps with {needs}; run {run!r} has {n}{crash}")
    return eligible, n // 2


def _scheduled_overheads(eligible: pl.DataFrame, upto: int, recent: bool = False) -> np.ndarray:
    """Per row, Σ over the overheads it logs of their median (recent: over the last RECENT_STEPS logged
    occurrences) over rows < upto; NaN on a row logging an overhead those rows never logged."""
    total = np.zeros(eligible.height)
    for overhead in OVERHEADS:
        values = _column(eligible, f"{overhead}_s")
        typical = _level(values[:upto], recent)
        total = total + np.where(np.isfinite(values), typical, 0.0)
    return total


def backtest_frame(frame: pl.DataFrame, run: str = "", walk_forward: bool = False,
                   refit_every: int | None = None, crash: str = "") -> BacktestResult:
    """Backtest a workload frame (`read_workload`); see the module docstring. `crash`: what a
    refusal for lack of steps adds about the run's end (`semantics.crash_clause`)."""
    eligible, n_train = _eligible(frame, run, crash)
    n = eligible.height
    is_train = pl.Series(np.arange(n) < n_train)
    mask = training_mask(eligible) & is_train
    if not mask.any():
        raise PolytraceError(f"the first {n_train} steps of run {run!r} are all warm-up, validation or "
                             "checkpoint steps: there is nothing to fit the model on")
    forecaster = fit_forecaster(eligible, mask)
    predicted = forecaster.predict(eligible)
    train_rows, test_rows = np.arange(n) < n_train, np.arange(n) >= n_train
    fit_rows = mask.to_numpy()
    notes: list[str] = []
    actual = stage_seconds(eligible)

    stages: dict[str, StageAccuracy] = {}
    step_prediction = predicted["step_s"].to_numpy().copy()
    unpredictable = np.zeros(n, dtype=bool)
    for stage in (*MODELLED_STAGES, *OVERHEADS):
        real = _column(eligible, f"{stage}_s")
        if not np.isfinite(real[test_rows]).any():
            continue
        method = None
        if stage in OVERHEADS:
            typical = _level(real[train_rows])
            guess = np.where(np.isfinite(real), typical, np.nan)
            scheduled = np.isfinite(real) & test_rows
            if not np.isfinite(typical):
                notes.append(f"{stage}: no training step logs it, so its held-out occurrences cannot be "
                             "predicted; the steps holding them are left out of the step accuracy")
                unpredictable |= scheduled
            else:
                step_prediction = step_prediction + np.where(scheduled, typical, 0.0)
            basis = train_rows
        elif f"{stage}_s" in predicted.columns:
            guess = predicted[f"{stage}_s"].to_numpy()
            method = forecaster.choices[stage].method
            basis = fit_rows
        else:
            continue
        model_accuracy, count = accuracy(guess[test_rows], real[test_rows])
        extra = _in_range(eligible, fit_rows, test_rows, guess, real) if stage == "gen" else {}
        held_real = real[test_rows]
        stages[stage] = StageAccuracy(
            count, model_accuracy, accuracy(np.full(held_real.size, _level(real[basis])), held_real)[0],
            accuracy(_previous(real)[test_rows], held_real)[0], extra,
            accuracy(np.full(held_real.size, _level(real[basis], recent=True)), held_real)[0], method)

    wall = _column(eligible, "wall_s")
    held = test_rows & ~unpredictable
    step_accuracy, count = accuracy(step_prediction[held], wall[held])
    fit_wall = np.where(fit_rows, wall, np.nan)
    fair_median = _level(fit_wall) + _scheduled_overheads(eligible, n_train)
    fair_recent = _level(fit_wall, recent=True) + _scheduled_overheads(eligible, n_train, recent=True)
    step = StageAccuracy(count, step_accuracy, accuracy(fair_median[held], wall[held])[0],
                         accuracy(_previous(wall)[held], wall[held])[0], {},
                         accuracy(fair_recent[held], wall[held])[0], "sum of stages")
    notes += _choice_notes(forecaster, actual)
    worse = [name for name, s in {**stages, "step": step}.items()
             if s.margin is not None and s.margin < 0]
    if worse:
        notes.append(f"the model is less accurate than the better of the median and recent baselines on: "
                     f"{', '.join(worse)}")
    if "step_time_basis" in eligible.columns and (eligible["step_time_basis"] == DERIVED).any():
        notes.append(f"the log has no step total: step time is {DERIVED} (their sum)")
    first_test = int(eligible["step"][n_train])
    warm = int((eligible["segment_start"] | eligible["restart"]).filter(pl.Series(test_rows)).sum())
    if warm:
        notes.append(f"{warm} held-out step(s) start a segment or follow a restart (warm-up): the model "
                     "predicts them at steady-state speed")
    walk = _walk_forward(eligible, n_train, refit_every) if walk_forward else None
    if walk is not None:
        notes.append(f"walk-forward: refitted every {walk.refit_every} step(s) on every step before the one "
                     "predicted")
    return BacktestResult(run, n_train, n - n_train, first_test, stages, step, tuple(notes), walk)


def _choice_notes(forecaster: Forecaster, actual: dict[str, np.ndarray]) -> list[str]:
    """What the forecaster chose where it is not the plain workload line."""
    notes = []
    levels = [s for s, c in forecaster.choices.items() if c.is_baseline and c.fit.coefficients == {}
              and any(c.features) and c.cv_errors and "workload" in c.cv_errors]
    if levels:
        notes.append(f"the workload model did not beat the stage's level in cross-validation inside the training "
                     f"half, so these stages are predicted by a baseline: "
                     + ", ".join(f"{s} ({forecaster.choices[s].method})" for s in levels))
    adapted = [s for s, c in forecaster.choices.items() if c.method in ("recency", "shifted", "trend")]
    if adapted:
        notes.append("drift or a level shift: " + ", ".join(f"{s} ({_adaptation(forecaster.choices[s])})"
                                                           for s in adapted))
    return notes


def _adaptation(choice: StageChoice) -> str:
    if choice.method == "recency":
        return "recency-weighted fit"
    if choice.method == "trend":
        per_100 = 1e4 * choice.trend.beta / choice.trend.alpha if choice.trend and choice.trend.alpha else 0.0
        return f"a drift of {per_100:+.1f}% per 100 steps"
    return f"fitted after the level shift at step {choice.shift_step}"


def _walk_forward(eligible: pl.DataFrame, n_train: int, refit_every: int | None) -> WalkForward:
    n = eligible.height
    held = n - n_train
    every = refit_every or (1 if held <= MAX_REFITS else math.ceil(held / MAX_REFITS))
    mask_all = training_mask(eligible).to_numpy()
    stage_names = [s for s in (*MODELLED_STAGES, *OVERHEADS)
                   if np.isfinite(_column(eligible, f"{s}_s")[n_train:]).any()]
    reals = {s: _column(eligible, f"{s}_s") for s in stage_names}
    wall = _column(eligible, "wall_s")
    predictions = {s: np.full(n, np.nan) for s in [*stage_names, "step"]}
    baselines = {(s, b): np.full(n, np.nan) for s in [*stage_names, "step"] for b in ("median", "recent")}
    forecaster: Forecaster | None = None
    for i in range(n_train, n):
        history = mask_all & (np.arange(n) < i)
        if (i - n_train) % every == 0 or forecaster is None:
            if history.any():
                forecaster = fit_forecaster(eligible, pl.Series(history))
        if forecaster is None:
            continue
        row = eligible.slice(i, 1)
        stage_guess = forecaster.predict(row)
        predictions["step"][i] = float(forecaster.predict_wall(row)[0])
        for stage in stage_names:
            if stage in OVERHEADS:
                predictions[stage][i] = forecaster.overheads.get(stage, np.nan)
            elif f"{stage}_s" in stage_guess.columns:
                predictions[stage][i] = float(stage_guess[f"{stage}_s"][0])
            basis = (np.arange(n) < i) if stage in OVERHEADS else history
            values = np.where(basis, reals[stage], np.nan)
            baselines[(stage, "median")][i] = _level(values)
            baselines[(stage, "recent")][i] = _level(values, recent=True)
        fit_wall = np.where(history, wall, np.nan)
        before = slice(0, i)
        overheads_median = _scheduled_overheads(eligible.slice(0, i + 1), i)[i]
        overheads_recent = _scheduled_overheads(eligible.slice(0, i + 1), i, recent=True)[i]
        baselines[("step", "median")][i] = _level(fit_wall[before]) + overheads_median
        baselines[("step", "recent")][i] = _level(fit_wall[before], recent=True) + overheads_recent
    test = np.arange(n) >= n_train

    def score(name: str, real: np.ndarray) -> StageAccuracy:
        model, count = accuracy(predictions[name][test], real[test])
        return StageAccuracy(count, model, accuracy(baselines[(name, "median")][test], real[test])[0],
                             accuracy(_previous(real)[test], real[test])[0], {},
                             accuracy(baselines[(name, "recent")][test], real[test])[0],
                             forecaster.choices[name].method if forecaster and name in forecaster.choices else None)

    stages = {s: score(s, reals[s]) for s in stage_names}
    return WalkForward(every, stages, score("step", wall))


def _in_range(df: pl.DataFrame, fit_rows: np.ndarray, test_rows: np.ndarray, guess: np.ndarray,
              real: np.ndarray) -> dict:
    """Generation accuracy over held-out steps whose generation features lie inside the fitted range."""
    inside = test_rows.copy()
    for name in STAGE_FEATURES["gen"]:
        x = _column(df, name)
        seen = x[fit_rows & np.isfinite(x)]
        if not seen.size:
            continue
        inside &= np.isfinite(x) & (x >= seen.min()) & (x <= seen.max())
    value, count = accuracy(guess[inside], real[inside])
    return {"in_range_accuracy": value, "in_range_steps": count}


def backtest_run(con: duckdb.DuckDBPyConnection, run: str | int, walk_forward: bool = False,
                 refit_every: int | None = None) -> BacktestResult:
    """Backtest the step-time forecaster of a stored run (see the module docstring)."""
    info = run_info(con, run)
    return backtest_frame(read_workload(con, info.run_id), info.name, walk_forward, refit_every,
                          crash_clause(con, info.run_id))
