"""Where a run's typical step goes, in one sentence: the report's and `explain`'s first line per run.

Over the run's timed training steps (`analyze.stages.per_step` rows with a step time, validation-only
steps left out), the plain steps are those that logged neither validation nor a checkpoint (all of
them when every step logged one):

- step_s = the median step time of the plain steps;
- a stage's share = Σ stage seconds / Σ step_s over the plain steps (a stage missing in a step counts 0),
  the TOP_STAGES largest of those at least MIN_STAGE_SHARE, largest first; `unaccounted` = 1 − Σ shares
  of every stage when that is at least UNACCOUNTED_SHARE (step time no stage timer covers);
- per overhead (validation, checkpoint), its cadence over the steps that logged it
  (`cadence`) and the median seconds it adds to such a step.

"Typical step 11 s (median of 300): gen 45%, update_actor 30%, ref 10%; validation every 10 steps
+6.8 s; checkpoints every 10 steps +20 s". A run without step times (PolyTrace traces alone) has none.
"""

from __future__ import annotations

import duckdb
import numpy as np
import polars as pl

from polytrace_cli.analyze import stages
from polytrace_cli.analyze.common import ALL_STEPS, StepRange
from polytrace_cli.analyze.shared_frames import shared
from polytrace_cli.display import duration

TOP_STAGES = 3
MIN_STAGE_SHARE = 0.01
UNACCOUNTED_SHARE = 0.10
# The keys of a typical step; `stages` is [[stage, share], ...] and `overheads` [[what, cadence, seconds], ...].
TYPICAL_STEP_KEYS = ("run", "step_s", "steps", "stages", "unaccounted", "overheads", "text")
_OVERHEADS = (("validation", "testing_s", "testing"), ("checkpoints", "save_checkpoint_s", "checkpoint"))


def cadence(steps: list[int]) -> str:
    """'every 10 steps' when 3 or more steps are evenly spaced; 'mostly every 10 steps (26 steps)'
    when one spacing makes up at least 70% of the gaps; else 'at 4 steps'."""
    if len(steps) >= 3:
        gaps = np.diff(sorted(steps))
        values, counts = np.unique(gaps, return_counts=True)
        common = int(values[np.argmax(counts)])
        every = "every step" if common == 1 else f"every {common} steps"
        if counts.max() == gaps.size:
            return every
        if counts.max() >= 0.7 * gaps.size:
            return f"mostly {every} ({len(steps)} steps)"
    return f"at {len(steps)} step{'s' if len(steps) != 1 else ''}"


def typical_steps(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> dict[str, dict]:
    """run name -> its typical step (TYPICAL_STEP_KEYS, see the module docstring), for the runs with step
    times; a run without any is absent."""
    detail = shared(stages.per_step, con, run_ids, steps)
    timed = detail.filter(pl.col("step_s").is_not_null() & ~pl.col("validation_only"))
    stage_columns = [c for c in stages.stage_columns_of(detail) if c.removesuffix("_s") not in stages.EXTRA_TIMERS]
    out = {}
    for (run,), rows in timed.group_by("run", maintain_order=True):
        out[run] = typical_step(run, rows, stage_columns)
    return out


def typical_step(run: str, rows: pl.DataFrame, stage_columns: list[str]) -> dict:
    """The typical step of one run's timed training rows of `stages.per_step` (see the module docstring)."""
    plain = rows.filter(~pl.col("testing").fill_null(False) & ~pl.col("checkpoint").fill_null(False))
    if plain.height == 0:
        plain = rows
    step_s = float(plain["step_s"].median())
    total = float(plain["step_s"].sum())
    shares = []
    if total > 0:
        for column in stage_columns:
            seconds = float(plain[column].fill_null(0).sum())
            if seconds > 0:
                shares.append([column.removesuffix("_s"), seconds / total])
    shares.sort(key=lambda item: -item[1])
    covered = sum(share for _, share in shares)
    unaccounted = 1 - covered if shares and 1 - covered >= UNACCOUNTED_SHARE else None
    shown = [item for item in shares if item[1] >= MIN_STAGE_SHARE][:TOP_STAGES]
    overheads = []
    for what, column, _ in _OVERHEADS:
        logged = rows.filter(pl.col(column).fill_null(0) > 0)
        if logged.height:
            overheads.append([what, cadence(logged["step"].to_list()), float(logged[column].median())])
    parts = ", ".join(f"{stage} {share:.0%}" for stage, share in shown)
    if unaccounted is not None:
        parts += f"{', ' if parts else ''}untimed {unaccounted:.0%}"
    if not shares:
        parts = "no stage timers logged"
    text = f"Typical step {duration(step_s)} (median of {plain.height:,}): {parts}"
    text += "".join(f"; {what} {every} +{duration(seconds)}" for what, every, seconds in overheads)
    return {"run": run, "step_s": step_s, "steps": plain.height, "stages": shown, "unaccounted": unaccounted,
            "overheads": overheads, "text": text}
