"""F9: reward time per DP rank per step (sandboxed code rewards)."""

from __future__ import annotations

import numpy as np
import polars as pl

from polytrace_cli.report import style
from polytrace_cli.analyze import imbalance
from polytrace_cli.report.figures.base import Omitted, empty, runs_of

ID = "F9"
TITLE = "Reward time per rank"
CAPTION = ("Seconds each data-parallel rank spent computing rewards in each step; the step waits for the "
           "slowest rank (black: max across ranks).")
FRAMES = ('reward',)
# Why a run without this figure's data is left out of it.
LEFT_OUT = "no per-rank reward timings"

MAX_LINES = 8


def frames(con, run_ids, steps) -> dict[str, pl.DataFrame]:
    """The imbalance analysis' reward seconds per step × rank."""
    return {"reward": imbalance.reward_per_rank(con, run_ids, steps)}


def render(data: dict[str, pl.DataFrame]):
    """Per run: one line per rank (a heat map when there are more than eight ranks) and the per-step max."""
    reward = data["reward"]
    if empty(reward, "seconds"):
        return Omitted("the runs have no per-rank reward timings (reward_timings traces)")
    runs = runs_of(reward)
    figure, axes = style.new_grid(len(runs), columns=2, panel_height=3.8)
    for ax, run in zip(axes, runs):
        part = reward.filter(pl.col("run") == run).sort("step", "dp_rank")
        ranks = part["dp_rank"].unique().sort().to_list()
        if len(ranks) <= MAX_LINES:
            for index, rank in enumerate(ranks):
                line = part.filter(pl.col("dp_rank") == rank)
                style.plot_steps(ax, line["step"], line["seconds"], color=style.colour(index), linewidth=1.2,
                                 label=f"rank {rank}", marker=style.point_marker(line.height))
            worst = part.group_by("step").agg(pl.col("seconds").max()).sort("step")
            style.plot_steps(ax, worst["step"], worst["seconds"], color="#777777", linewidth=0.8,
                             linestyle=":", label="max")
            ax.set_ylabel("reward seconds")
            ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
        else:
            grid = part.pivot(on="step", index="dp_rank", values="seconds", aggregate_function="mean").sort("dp_rank")
            columns = sorted(grid.columns[1:], key=int)
            steps = np.array([int(c) for c in columns])
            image = ax.imshow(grid.select(columns).to_numpy().astype(float), aspect="auto", origin="lower",
                              cmap=style.SEQUENTIAL_CMAP, interpolation="nearest",
                              extent=(steps.min() - 0.5, steps.max() + 0.5, -0.5, len(ranks) - 0.5))
            ax.grid(False)
            ax.set_ylabel("DP rank")
            style.add_colorbar(figure, image, [ax], label="reward seconds")
        ax.set_xlabel(style.WORKLOAD_STEP)
        ax.set_title(f"{run}: reward seconds per rank" if run else "reward seconds per rank")
        style.thin_step_ticks(ax, None)
    return figure
