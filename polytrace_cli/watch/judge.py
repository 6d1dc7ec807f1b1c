"""Each new step against the run's step-time model, walk-forward: the model that judges a step is
fitted on earlier steps only.

The model is `diagnose.explain.decompose_run` on the steps already seen (fitted once the run has
MIN_TRAINING_STEPS timed training steps, refitted each time their number has grown by REFIT_GROWTH
since the last fit). A new step is then decomposed with that model (`diagnose.decompose`, trailing:
the typical workload and each cause's level are those of the training steps up to the step): its
seconds, the typical step the model expects (`expected_s`, no testing or checkpoint), the model
at the step's own workload (`model_s`), and its excess split into causes. It is slow by
`diagnose.thresholds.slow_steps`, with the thresholds of the fitted steps: excess > 5% of
expected_s, and above the robust threshold of the fitted steps' excess or with a cause standing
out from its level. Its listed causes are those standing out, largest first; a slow step with
none standing out lists its largest positive cause.

A step judged before its values are final (first seen from a progress bar, `tqdm_estimate`, its
metric record buffered and landing later) is judged again once its seconds or stage seconds change:
its record comes again, `corrected`, by the model the run read whole with its final values gives it
(fitted at the same step on the steps before it as they now read; a fit whose steps changed since
is fitted again).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import duckdb
import numpy as np
import polars as pl

from polytrace_cli.diagnose.decompose import decompose, step_causes
from polytrace_cli.diagnose.explain import MIN_TRAINING_STEPS, decompose_run
from polytrace_cli.diagnose.thresholds import slow_steps
from polytrace_cli.model import MODELLED_STAGES, OVERHEADS, read_workload, training_mask

# A model is refitted once the fitted training steps have grown by this factor.
REFIT_GROWTH = 1.25
# Fits kept for judging a corrected step again (the latest ones; an older one is fitted again).
FITS_KEPT = 4
# The workload frame's stage columns a step event lists (its `stages`), in pipeline order.
STAGE_COLUMNS = tuple(f"{stage}_s" for stage in (*MODELLED_STAGES, *OVERHEADS))


def _number(value) -> float | None:
    return float(value) if value is not None and math.isfinite(float(value)) else None


@dataclass
class StepJudge:
    """Judges the steps of one run as they land (see the module docstring)."""

    con: duckdb.DuckDBPyConnection
    run_id: int
    seen: set[tuple[int, int]] = field(default_factory=set)
    # (segment, step) -> what the step's judgement read of it (`_inputs`) and whether it was judged slow.
    judged: dict[tuple[int, int], tuple[tuple, bool]] = field(default_factory=dict)
    fitted_steps: int = 0
    typical_s: float | None = None
    # (segment, step) of a fit row -> (hash of what the rows before it read, (RunDecomposition, its fitted steps)).
    _fits: dict[tuple[int, int], tuple] = field(default_factory=dict)
    _latest_fit: int = -1
    _model_of: dict[int, tuple | None] = field(default_factory=dict)
    # (segment, step) -> what `watch.asynchronous` reads of the step (its first-of-segment flag, wall time,
    # wait, staleness, dropped samples and whether that count is cumulative), for the steps `new_steps` returned.
    rollout_side: dict[tuple[int, int], tuple] = field(default_factory=dict)
    last_frame: pl.DataFrame | None = field(default=None, repr=False)  # the workload frame the last call read

    def new_steps(self) -> list[dict]:
        """One record per step stored since the last call, in log order: step, segment, seconds,
        expected_s, model_s, slow, causes, stages (seconds per stage) and, before the model exists,
        `note` saying why there is no expectation. A step that so far holds validation values only
        (a validation before training) is no step: it is left out until a training line lands for it.
        A step judged before whose seconds or stage seconds changed since comes again, judged anew,
        with `corrected` True and `was_slow` its earlier judgement.

        A step is judged by the model fitted on the steps before it, refitted where the count of
        timed training steps before a step reaches REFIT_GROWTH × the count the model was fitted
        on (`_fit_points`): the same judgement whether the steps land one by one or all at once, and
        for a corrected step the one the run read whole with its final values gives (a fit whose
        steps changed since is fitted again)."""
        frame = read_workload(self.con, self.run_id)
        self.last_frame = frame
        if not frame.height:
            return []
        keys = list(zip(frame["segment"].to_list(), frame["step"].to_list()))
        validation_only = frame["validation_only"].to_list()
        inputs = self._inputs(frame)
        new = [index for index, key in enumerate(keys) if key not in self.seen and not validation_only[index]]
        changed = [index for index, key in enumerate(keys)
                   if key in self.judged and not validation_only[index] and self.judged[key][0] != inputs[index]]
        if not new and not changed:
            return []
        training = training_mask(frame).to_numpy()
        trained_before = np.cumsum(training) - training
        points = self._fit_points(trained_before, validation_only)
        groups: dict[int | None, list[int]] = {}
        for index in sorted({*new, *changed}):
            at = max((point for point in points if point <= index), default=None)
            groups.setdefault(at, []).append(index)
        judged: dict[int, dict] = {}
        for at, group in groups.items():
            model = None if at is None else self._model_at(frame, at, keys, inputs, int(trained_before[at]))
            self._model_of.update({index: model for index in group})
            if model is not None:
                judged.update(self._judge(frame.head(group[-1] + 1), group, *model))
        records = []
        self.rollout_side.clear()
        for index in sorted({*new, *changed}):
            row = frame.row(index, named=True)
            self.rollout_side[keys[index]] = (
                bool(row["segment_start"]), row["wall_s"], row["trainer_wait_s"],
                row["staleness_mean"] if row["staleness_mean"] is not None else row["staleness_max"],
                row["dropped_samples"], row["execution_mode"] == "fully-async")
            record = {"step": row["step"], "segment": row["segment"], "seconds": _number(row["wall_s"]),
                      "stages": {c[:-2]: _number(row[c]) for c in STAGE_COLUMNS if c in row and _number(row[c])}}
            if index in judged:
                record.update(judged[index])
            else:
                record.update(expected_s=None, model_s=None, slow=False, causes=[],
                              note=(f"no model yet: {int(trained_before[index])} of {MIN_TRAINING_STEPS} timed"
                                    " training steps" if self._model_of[index] is None else "no step time"))
            if keys[index] in self.judged:
                record.update(corrected=True, was_slow=self.judged[keys[index]][1])
            records.append(record)
            self.seen.add(keys[index])
            self.judged[keys[index]] = (inputs[index], record["slow"])
        self._model_of.clear()
        return records

    @staticmethod
    def _inputs(frame: pl.DataFrame) -> list[tuple]:
        """Per row, what a step's judgement reads that a later line may change: its wall seconds and
        its stage seconds."""
        columns = ["wall_s", *(c for c in STAGE_COLUMNS if c in frame.columns)]
        return list(frame.select(columns).iter_rows())

    @staticmethod
    def _fit_points(trained_before: np.ndarray, validation_only: list[bool]) -> list[int]:
        """The rows a model is fitted at (on the rows before each): the first step with
        MIN_TRAINING_STEPS timed training steps before it, then each first step whose count
        reaches REFIT_GROWTH × the count of the last fit. Rows holding validation values only are
        no steps and fit nothing."""
        points, fitted = [], 0
        for index, trained in enumerate(trained_before.tolist()):
            if validation_only[index] or trained < MIN_TRAINING_STEPS:
                continue
            if not points or trained >= fitted * REFIT_GROWTH:
                points.append(index)
                fitted = trained
        return points

    def _model_at(self, frame: pl.DataFrame, at: int, keys: list, inputs: list[tuple], trained: int) -> tuple:
        """(the model fitted on the rows before row `at`, its fitted steps), fitted again when the
        rows it was fitted on read otherwise now (a step's record landing after its progress bar)."""
        history = hash(tuple(inputs[:at]))
        kept = self._fits.get(keys[at])
        if kept is None or kept[0] != history:
            rows = frame.head(at)
            run = decompose_run(rows, training_mask(rows))
            kept = (history, (run, rows.filter(run.mask)))
            self._fits[keys[at]] = kept
            while len(self._fits) > FITS_KEPT:
                self._fits.pop(next(iter(self._fits)))
        if at >= self._latest_fit:
            self._latest_fit, self.fitted_steps = at, trained
            self.typical_s = _number(kept[1][0].expected)
        return kept[1]

    def _judge(self, frame: pl.DataFrame, chunk: list[int], run, fitted: pl.DataFrame) -> dict[int, dict]:
        """The records of the rows `chunk` of `frame` (the run up to them), by `run`'s model with the
        thresholds of its `fitted` steps."""
        steps, parts = decompose(frame, run.model, np.zeros(frame.height, dtype=bool), trailing=True)
        causes = step_causes(parts)
        flags, standout, _ = slow_steps(steps, causes, fitted, trailing=True)
        causes = causes.join(standout, on=["segment", "step", "cause"], how="left") \
            .with_columns(pl.col("stands_out").fill_null(False))
        steps = steps.with_columns(slow=pl.Series(flags))
        position = {(frame["segment"][i], frame["step"][i]): i for i in chunk}
        judged = {}
        for row in steps.iter_rows(named=True):
            index = position.get((row["segment"], row["step"]))
            if index is None:
                continue
            mine = causes.filter((pl.col("segment") == row["segment"]) & (pl.col("step") == row["step"]))
            listed = mine.filter(pl.col("stands_out")).sort("seconds", descending=True)
            if row["slow"] and not listed.height:
                listed = mine.filter(pl.col("seconds") > 0).sort("seconds", descending=True).head(1)
            judged[index] = {
                "expected_s": _number(row["expected_s"]), "model_s": _number(row["model_s"]),
                "slow": bool(row["slow"]),
                "causes": [{"cause": c["cause"], "seconds": _number(c["seconds"]), "stage": c["stage"]}
                           for c in listed.iter_rows(named=True)],
            }
        return judged
