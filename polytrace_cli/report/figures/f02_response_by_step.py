"""F2: response-length distribution across steps, with mean and p99 lines."""

from __future__ import annotations

import polars as pl

from polytrace_cli.report import style
from polytrace_cli.analyze import lengths
from polytrace_cli.report.figures.base import Omitted, empty, runs_of, span_groups

ID = "F2"
TITLE = "Response length across steps"
CAPTION = ("Per step: the band spans p50 to p90 of response length, the solid line is the mean and the dashed "
           "line p99. Step-aggregate runs show their logged mean with a min–max band. Lines and bands stop where "
           "steps are missing. Runs of very different lengths are drawn on step axes of their own.")
FRAMES = ('per_step',)
# Why a run without this figure's data is left out of it.
LEFT_OUT = "no response lengths per step"


def frames(con, run_ids, steps) -> dict[str, pl.DataFrame]:
    """The lengths analysis' per-step statistics."""
    return {"per_step": lengths.per_step(con, run_ids, steps)}


def render(data: dict[str, pl.DataFrame]):
    """One colour per run: min–max and p50–p90 bands, mean (solid) and p99 (dashed) lines; one axes, or one
    per group of runs of like length (`span_groups`) when their lengths differ by more than SPAN_RATIO."""
    per_step = data["per_step"]
    if empty(per_step, "mean_tokens"):
        return Omitted("the runs have no response lengths per step")
    response = per_step.filter(pl.col("kind") == "response").sort("run", "step")
    if response.height == 0:
        return Omitted("the runs have no response lengths per step")
    runs = runs_of(response)
    groups = span_groups(response)
    if len(groups) == 1:
        figure, (ax,) = style.new_figure(width=10, height=4.4)
        panels = [ax]
    else:
        figure, panels = style.new_grid(len(groups), columns=2, width=10, panel_height=3.8)
    for ax, group in zip(panels, groups):
        label = style.step_axis_label(response.filter(pl.col("run").is_in(group))["basis"].unique().to_list())
        values = []
        for run in group:
            part = response.filter(pl.col("run") == run)
            steps, colour = part["step"].to_numpy(), style.colour(runs.index(run))
            if part["p50_tokens"].drop_nulls().len() == 0 and part["max_tokens"].drop_nulls().len():
                # Step-aggregate runs: only the logged min and max bound the distribution.
                style.fill_steps(ax, steps, part["min_tokens"].to_numpy(), part["max_tokens"].to_numpy(),
                                 color=colour, alpha=0.12, linewidth=0, label=f"{run} min–max")
            if part["p50_tokens"].drop_nulls().len():
                style.fill_steps(ax, steps, part["p50_tokens"].to_numpy(), part["p90_tokens"].to_numpy(),
                                 color=colour, alpha=0.25, linewidth=0, label=f"{run} p50–p90")
            marker = "o" if len(steps) <= 40 else None
            style.plot_steps(ax, steps, part["mean_tokens"].to_numpy(), color=colour, linewidth=1.8, marker=marker,
                             label=f"{run} mean")
            if part["p99_tokens"].drop_nulls().len():
                style.plot_steps(ax, steps, part["p99_tokens"].to_numpy(), color=colour, linewidth=1.4,
                                 linestyle="--", label=f"{run} p99")
            values += [v for c in ("p50_tokens", "p99_tokens", "mean_tokens") for v in part[c].drop_nulls().to_list()]
        if style.spans_decades(values):
            ax.set_yscale("log")
            style.plain_log_ticks(ax, "y")
            ax.set_ylabel("response length (tokens, log scale)")
        else:
            ax.set_ylabel("response length (tokens)")
        ax.set_xlabel(label)
        style.thin_step_ticks(ax, None)
        ax.set_title("Response length per step" if len(groups) == 1 else ", ".join(group))
    # One legend entry per run (its colour) and one per line style, instead of one per run × statistic.
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Patch(color=style.colour(index), label=run) for index, run in enumerate(runs)]
    handles += [Line2D([], [], color="#333333", linewidth=1.8, label="mean"),
                Line2D([], [], color="#333333", linewidth=1.4, linestyle="--", label="p99"),
                Patch(color="#333333", alpha=0.25, label="p50–p90 (min–max for logs)")]
    # Outside the first row's last panel.
    panels[min(1, len(panels) - 1)].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8,
                                          frameon=False)
    return figure
