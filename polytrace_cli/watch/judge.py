"""Each new step against the run's step-time model, walk-forward: the model that judges a step is
fitted on earlier steps only.

The model is `diagnose.explain.decompose_run` on the steps already seen (fitted once the run has
MIN_TRAINING_STEPS timed training steps, refitted each time their number has grown by REFIT_GROWTH
since the last fit). A new step is then decomposed with that model (`diagnose.decompose`): its
seconds, the typical step the model expects (`expected_s`, no testing or checkpoint), the model
at the step's own workload (`model_s`), and its excess split into causes. It is slow by
`diagnose.thresholds.slow_steps`, with the thresholds of the fitted steps: excess > 5% of
expected_s, and above the robust threshold of the fitted steps' excess or with a cause standing
out from its level. Its listed causes are those standing out, largest first; a slow step with
none standing out lists its largest positive cause.
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
from polytrace_cli.model import read_workload, training_mask

# A model is refitted once the fitted training steps have grown by this factor.
REFIT_GROWTH = 1.25
# Stage columns of the workload frame drawn in the terminal view, in the order of a verl step.
STAGE_COLUMNS = ("gen_s", "reward_s", "old_log_prob_s", "ref_s", "values_s", "adv_s", "update_critic_s",
                 "update_actor_s", "update_weights_s", "testing_s", "save_checkpoint_s")


def _number(value) -> float | None:
    return float(value) if value is not None and math.isfinite(float(value)) else None


@dataclass
class StepJudge:
    """Judges the steps of one run as they land (see the module docstring)."""

    con: duckdb.DuckDBPyConnection
    run_id: int
    seen: set[tuple[int, int]] = field(default_factory=set)
    fitted_steps: int = 0
    fits: int = 0
    typical_s: float | None = None
    _run = None
    _history_keys: list[tuple[int, int]] = field(default_factory=list)

    def new_steps(self) -> list[dict]:
        """One record per step stored since the last call, in log order: step, segment, seconds,
        expected_s, model_s, slow, causes, stages (seconds per stage) and, before the model exists,
        `note` saying why there is no expectation."""
        frame = read_workload(self.con, self.run_id)
        if not frame.height:
            return []
        keys = list(zip(frame["segment"].to_list(), frame["step"].to_list()))
        new = np.array([key not in self.seen for key in keys])
        if not new.any():
            return []
        history = ~new
        self._refit(frame, history)
        judged = self._judge(frame, history) if self._run is not None else {}
        records = []
        for index in np.flatnonzero(new):
            row = frame.row(int(index), named=True)
            key = (row["segment"], row["step"])
            record = {"step": row["step"], "segment": row["segment"], "seconds": _number(row["wall_s"]),
                      "stages": {c[:-2]: _number(row[c]) for c in STAGE_COLUMNS if c in row and _number(row[c])}}
            if key in judged:
                record.update(judged[key])
            else:
                trained = int((training_mask(frame) & pl.Series(history)).sum())
                record.update(expected_s=None, model_s=None, slow=False, causes=[],
                              note=(f"no model yet: {trained} of {MIN_TRAINING_STEPS} timed training steps"
                                    if self._run is None else "no step time"))
            records.append(record)
            self.seen.add(key)
        return records

    def _refit(self, frame: pl.DataFrame, history: np.ndarray) -> None:
        mask = training_mask(frame) & pl.Series(history)
        trained = int(mask.sum())
        if trained < MIN_TRAINING_STEPS or (self._run is not None and trained < self.fitted_steps * REFIT_GROWTH):
            return
        past = pl.Series(history)
        self._run = decompose_run(frame.filter(past), mask.filter(past))
        self._history = frame.filter(past)
        self.fitted_steps, self.fits = trained, self.fits + 1
        self.typical_s = _number(self._run.expected)

    def _judge(self, frame: pl.DataFrame, history: np.ndarray) -> dict[tuple[int, int], dict]:
        run = self._run
        model = run.model
        steps, parts = decompose(frame, model, np.zeros(frame.height, dtype=bool))
        causes = step_causes(parts)
        fitted = self._history.filter(run.mask)
        flags, standout, _ = slow_steps(steps, causes, fitted)
        causes = causes.join(standout, on=["segment", "step", "cause"], how="left") \
            .with_columns(pl.col("stands_out").fill_null(False))
        judged = {}
        steps = steps.with_columns(slow=pl.Series(flags))
        for row in steps.iter_rows(named=True):
            key = (row["segment"], row["step"])
            if key in self.seen:
                continue
            mine = causes.filter((pl.col("segment") == row["segment"]) & (pl.col("step") == row["step"]))
            listed = mine.filter(pl.col("stands_out")).sort("seconds", descending=True)
            if row["slow"] and not listed.height:
                listed = mine.filter(pl.col("seconds") > 0).sort("seconds", descending=True).head(1)
            judged[key] = {
                "expected_s": _number(row["expected_s"]), "model_s": _number(row["model_s"]),
                "slow": bool(row["slow"]),
                "causes": [{"cause": c["cause"], "seconds": _number(c["seconds"]), "stage": c["stage"]}
                           for c in listed.iter_rows(named=True)],
            }
        return judged
