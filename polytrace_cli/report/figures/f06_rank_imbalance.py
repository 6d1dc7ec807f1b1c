"""F6: load imbalance, a DP rank × step heat map of load / mean with λ and balanced λ per step."""

from __future__ import annotations

import numpy as np
import polars as pl

from polytrace_cli.report import style
from polytrace_cli.analyze import imbalance
from polytrace_cli.report.figures.base import Omitted, empty, runs_of

ID = "F6"
TITLE = "Load imbalance across data-parallel ranks"
CAPTION = ("Top: each rank's token load (prompt + response) over the step's mean rank load. "
           "Bottom: λ = max/mean per step and λ after repartitioning the prompt groups (balanced).")
FRAMES = ('ranks', 'steps')

MAX_RUNS = 3


def frames(con, run_ids, steps) -> dict[str, pl.DataFrame]:
    """The imbalance analysis' per step × rank loads and per-step λ."""
    return {"ranks": imbalance.per_rank(con, run_ids, steps),
            "steps": imbalance.per_step(con, run_ids, steps)}


def render(data: dict[str, pl.DataFrame]):
    """Per run: a heat map (rank rows, step columns) above a λ / λ_balanced line chart."""
    ranks, per_step = data["ranks"], data["steps"]
    if empty(ranks, "load_over_mean") and empty(per_step, "lambda"):
        return Omitted("the runs have no per-rank samples and no verl global_seqlen metrics")
    runs = (runs_of(ranks) if not empty(ranks, "load_over_mean") else runs_of(per_step))[:MAX_RUNS]
    figure, axes = style.new_figure(len(runs), 2, width=max(6.0, 4.2 * len(runs)), height=6.4)
    top, bottom = axes[: len(runs)], axes[len(runs):]
    limit = 1.0
    if not empty(ranks, "load_over_mean"):
        deviation = np.nanmax(np.abs(ranks["load_over_mean"].to_numpy() - 1.0))
        limit = max(0.05, float(deviation))
    image = None
    for index, run in enumerate(runs):
        heat_ax, line_ax = top[index], bottom[index]
        part = ranks.filter(pl.col("run") == run) if not empty(ranks, "load_over_mean") else None
        if part is not None and part.height:
            grid = part.pivot(on="step", index="dp_rank", values="load_over_mean", aggregate_function="mean").sort("dp_rank")
            step_columns = sorted(grid.columns[1:], key=int)
            matrix = grid.select(step_columns).to_numpy().astype(float)
            steps = np.array([int(s) for s in step_columns])
            image = heat_ax.imshow(matrix, aspect="auto", cmap=style.DIVERGING_CMAP, vmin=1 - limit, vmax=1 + limit,
                                   interpolation="nearest", origin="lower",
                                   extent=(steps.min() - 0.5, steps.max() + 0.5, -0.5, matrix.shape[0] - 0.5))
            heat_ax.grid(False)
            heat_ax.set_ylabel("DP rank")
            ranks_shown = grid["dp_rank"].to_list()
            tick_every = max(1, len(ranks_shown) // 8)
            heat_ax.set_yticks(range(0, len(ranks_shown), tick_every), [str(r) for r in ranks_shown[::tick_every]])
        else:
            heat_ax.text(0.5, 0.5, "no per-rank samples\n(λ from global_seqlen)", ha="center", va="center",
                         transform=heat_ax.transAxes, color="#555555")
            heat_ax.set_axis_off()
        heat_ax.set_title(f"{run}: rank load / mean" if run else "rank load / mean")
        heat_ax.set_xlabel("training step")
        lines = per_step.filter(pl.col("run") == run).sort("step") if not empty(per_step, "lambda") else None
        if lines is not None and lines.height:
            line_ax.plot(lines["step"], lines["lambda"], color=style.colour(3), marker=style.point_marker(lines.height), markersize=3,
                         linewidth=1.4, label="λ = max / mean")
            if lines["lambda_balanced"].drop_nulls().len():
                line_ax.plot(lines["step"], lines["lambda_balanced"], color=style.colour(2), marker=style.point_marker(lines.height, "s"),
                             markersize=3, linewidth=1.4, label="λ balanced")
            line_ax.axhline(1.0, color="#777777", linewidth=0.8, linestyle=":")
            style.legend(line_ax, loc="upper right")
        line_ax.set_xlabel("training step")
        line_ax.set_ylabel("imbalance λ")
        style.thin_step_ticks(line_ax, None)
    if image is not None:
        figure.colorbar(image, ax=list(top), label="load / mean load", shrink=0.9)
    return figure
