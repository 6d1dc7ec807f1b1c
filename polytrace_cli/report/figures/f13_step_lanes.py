"""F13: the slowest step and a typical one as lanes, one lane per rank and role."""

from __future__ import annotations

import polars as pl

from polytrace_cli.analyze import timeline
from polytrace_cli.report import style
from polytrace_cli.report.figures.base import Omitted, empty, runs_of

ID = "F13"
TITLE = "The slowest and a typical step, as lanes"
CAPTION = ("Each lane is a rank (or lane) of one role; bars are its spans, coloured by stage, from the step's "
           "first start. Top: the run's slowest step; below it, the step nearest the median step time. "
           "Hatched bars were synthesized from stage timers (the stages laid end to end in the framework's "
           "order), not measured.")
FRAMES = ("lanes",)
LEFT_OUT = "no spans and no stage timers, or fewer than two steps"

MAX_LANES = 16


def frames(con, run_ids, steps) -> dict[str, pl.DataFrame]:
    """The timeline analysis' spans of each run's slowest and typical step."""
    return {"lanes": timeline.step_lanes(con, run_ids, steps)}


def render(data: dict[str, pl.DataFrame]):
    """Per run two panels (slowest, typical): one row per worker, a bar per span."""
    from matplotlib.patches import Patch

    lanes = data["lanes"]
    if empty(lanes, "offset_s"):
        return Omitted("the runs have no spans and no stage timers over two steps or more")
    runs = runs_of(lanes)
    stages = lanes.get_column("stage").unique().sort().to_list()
    colours = {stage: style.colour(index) for index, stage in enumerate(stages)}
    figure, axes = style.new_grid(2 * len(runs), columns=1, panel_height=2.6)
    for index, run in enumerate(runs):
        for offset, which in enumerate(("slowest", "typical")):
            ax = axes[2 * index + offset]
            part = lanes.filter((pl.col("run") == run) & (pl.col("which") == which))
            workers = part.select("role", "worker").unique().sort("role", "worker").get_column("worker").to_list()
            shown = workers[:MAX_LANES]
            for row, worker in enumerate(shown):
                mine = part.filter(pl.col("worker") == worker)
                for stage, start, end, synthesized in mine.select("stage", "offset_s", "end_s", "synthesized").iter_rows():
                    ax.barh(row, max(end - start, 0.0), left=start, height=0.7, color=colours[stage],
                            hatch="//" if synthesized else None, edgecolor="white", linewidth=0.4)
            ax.set_yticks(range(len(shown)), shown, fontsize=7)
            ax.invert_yaxis()
            ax.set_xlabel("seconds from the step's start")
            step = part.get_column("step").first() if part.height else None
            hidden = f", {len(workers) - len(shown)} more lanes not shown" if len(workers) > len(shown) else ""
            ax.set_title(f"{run}: {which} step {step}{hidden}" if run else f"{which} step {step}{hidden}")
        handles = [Patch(facecolor=colours[stage], label=stage) for stage in stages]
        axes[2 * index].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    return figure
