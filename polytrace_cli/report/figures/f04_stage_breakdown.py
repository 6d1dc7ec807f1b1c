"""F4: step-time breakdown, stacked bars of stage seconds per step."""

from __future__ import annotations

import numpy as np
import polars as pl

from polytrace_cli.report import style
from polytrace_cli.analyze import stages as stage_analysis
from polytrace_cli.report.figures.base import Omitted, empty, runs_of

ID = "F4"
TITLE = "Step-time breakdown by stage"
CAPTION = ("Seconds per stage for each step, stacked (bars, or stacked bands beyond 200 steps); "
           "the remainder up to the step time is unexplained.")
FRAMES = ('stages',)
# Why a run without this figure's data is left out of it.
LEFT_OUT = "no per-step stage timings"

# Stage timers, then the timers inside the step besides the stages (validation, checkpoint), then the rest.
STAGE_COLUMNS = (*(f"{name}_s" for name in (*stage_analysis.STAGES, *stage_analysis.EXTRA_TIMERS)), "unexplained_s")
STAGES = tuple(column.removesuffix("_s") for column in STAGE_COLUMNS)
MAX_BARS = 200


def frames(con, run_ids, steps) -> dict[str, pl.DataFrame]:
    """The steps analysis' per-step stage seconds."""
    return {"stages": stage_analysis.per_step(con, run_ids, steps)}


def _long(stages: pl.DataFrame) -> pl.DataFrame:
    """(run, step, stage, seconds) rows of the per-step stage columns `<stage>_s`."""
    return (stages.sort("run", "segment", "step", nulls_last=False).select("run", "step", *STAGE_COLUMNS)
            .unpivot(index=["run", "step"], variable_name="stage", value_name="seconds")
            .with_columns(pl.col("stage").str.replace(r"_s$", "")))


def render(data: dict[str, pl.DataFrame]):
    """One panel per run: stacked bars of the stages' seconds, step on x."""
    stages = data["stages"]
    if empty(stages, "step"):
        return Omitted("the runs have no per-step stage timings (step-aggregate logs such as verl's timing_s/*)")
    long = _long(stages).filter(pl.col("stage").is_in(STAGES) & pl.col("seconds").is_not_null()
                                & (pl.col("seconds") > 0))
    if long.height == 0:
        return Omitted("the runs log no stage seconds")
    runs = runs_of(long)
    figure, axes = style.new_figure(1, len(runs), width=10, height=3.4 * len(runs))
    for ax, run in zip(axes, runs):
        part = long.filter(pl.col("run") == run)
        # After a restart a step can appear in two segments; the later segment's timings are the ones kept.
        table = part.pivot(on="stage", index="step", values="seconds", aggregate_function="last").sort("step").fill_null(0)
        steps = table["step"].to_numpy()
        bottom = np.zeros(len(steps))
        width = 0.85 if len(steps) < 2 else 0.85 * float(np.min(np.diff(steps)))
        for index, stage in enumerate(s for s in STAGES if s in table.columns):
            values = table[stage].to_numpy().astype(float)
            colour = "#BBBBBB" if stage == "unexplained" else style.colour(index)
            if len(steps) <= MAX_BARS:
                ax.bar(steps, values, bottom=bottom, width=width, color=colour, label=stage, linewidth=0)
            else:  # thousands of bars draw slowly and unreadably: stacked step bands instead, one polygon per stage
                style.fill_steps(ax, steps, bottom, bottom + values, step="mid", color=colour, label=stage, linewidth=0)
            bottom += values
        ax.set_xlabel(style.TRAINER_STEP)
        ax.set_ylabel("seconds")
        ax.set_title(f"{run}: stage seconds per step" if run else "stage seconds per step")
        style.thin_step_ticks(ax, steps)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    return figure
