"""F11: step time vs max response length, with the fitted line."""

from __future__ import annotations

import numpy as np
import polars as pl

from polytrace_cli.report import style
from polytrace_cli.analyze import stages
from polytrace_cli.report.figures.base import Omitted, empty, runs_of

ID = "F11"
TITLE = "Step time vs max response length"
CAPTION = "Each point is a step; lines are the least-squares fits the steps analysis reports, with their r."
FRAMES = ('points',)
# Why a run without this figure's data is left out of it.
LEFT_OUT = "fewer than 3 trainer steps with both step time and max response length"


def frames(con, run_ids, steps) -> dict[str, pl.DataFrame]:
    """The steps analysis' per-step (max response length, step time) points and fitted lines."""
    return {"points": stages.length_fit(con, run_ids, steps)}


def render(data: dict[str, pl.DataFrame]):
    """One scatter colour per run, with the run's fitted line."""
    points = data["points"]
    x, y = "response_length_max", "step_s"
    if empty(points, x, y):
        # length_fit leaves out a run with fewer than 3 such steps or one longest length: say so, not
        # that the run logs neither.
        return Omitted("no run has 3 or more training steps with both a step time and a max response length "
                       "that varies")
    figure, (ax,) = style.new_figure(width=10, height=4.6)
    for index, run in enumerate(runs_of(points)):
        part = points.filter((pl.col("run") == run) & pl.col(x).is_not_null() & pl.col(y).is_not_null())
        if part.height == 0:
            continue
        ax.scatter(part[x], part[y], s=14, alpha=0.7, color=style.colour(index), label=run)
        if part["slope_s_per_token"].drop_nulls().len():
            slope, intercept = part["slope_s_per_token"].drop_nulls()[0], part["intercept_s"].drop_nulls()[0]
            grid = np.linspace(part[x].min(), part[x].max(), 50)
            r = part["r"].drop_nulls()[0] if part["r"].drop_nulls().len() else None
            label = f"{run} fit: {slope * 1000:.3g} s per 1k tokens" + (f", r = {r:.2f}" if r is not None else "")
            ax.plot(grid, intercept + slope * grid, color=style.colour(index), linewidth=1.4, label=label)
    ax.set_xlabel("max response length in the step (tokens)")
    ax.set_ylabel("step time (s)")
    ax.set_title("Step time against the step's longest response")
    style.legend(ax, loc="upper left")
    return figure
