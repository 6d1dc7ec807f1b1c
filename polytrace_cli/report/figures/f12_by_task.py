"""F12: the runs grouped by task: response lengths, step-time CV and load imbalance λ per task."""

from __future__ import annotations

import numpy as np
import polars as pl

from polytrace_cli.analyze import fleet as fleet_analysis
from polytrace_cli.report import style
from polytrace_cli.report.figures.base import Omitted, empty

ID = "F12"
TITLE = "Runs by task"
CAPTION = ("Per task, over all its runs: response-length p50, p90, p99 and max of the pooled training samples; "
           "the mean of the runs' step-time CV (runs with at least 3 timed steps); mean λ over all steps, "
           "with the largest λ as a tick. n = runs contributing.")
FRAMES = ("fleet", "runs")
# Why a run without this figure's data is left out of it (every run has a task group, "(no task)" at worst).
LEFT_OUT = "no task group"


def frames(con, run_ids, steps) -> dict[str, pl.DataFrame]:
    """The fleet analysis grouped by task, and each run's task group (the runs the figure covers)."""
    return {"fleet": fleet_analysis.by_group(con, run_ids, "task", steps),
            "runs": fleet_analysis.run_groups(con, run_ids, "task")}


def _labels(fleet: pl.DataFrame) -> list[str]:
    return [group if group is not None else "(no task)" for group in fleet["group"].to_list()]


def render(data: dict[str, pl.DataFrame]):
    """Three panels, one x position per task: length quantiles (log y), step-time CV, λ."""
    fleet = data["fleet"]
    if fleet is None or fleet.height < 2:
        return Omitted("the runs belong to fewer than two tasks")
    if empty(fleet, "response_p50_tokens") and empty(fleet, "step_time_cv_mean") and empty(fleet, "lambda_mean"):
        return Omitted("no task has per-sample lengths, timed steps or per-rank loads")
    labels = _labels(fleet)
    x = np.arange(fleet.height)
    figure, axes = style.new_figure(3, 1, width=12, height=4)

    lengths, cv, imbalance = axes
    quantiles = {"response_p50_tokens": ("p50", "o"), "response_p90_tokens": ("p90", "v"),
                 "response_p99_tokens": ("p99", "^"), "response_max_tokens": ("max", "s")}
    for index, (column, (name, marker)) in enumerate(quantiles.items()):
        values = fleet[column].cast(pl.Float64).fill_null(float("nan")).to_numpy()
        lengths.plot(x, values, linestyle="none", marker=marker, color=style.colour(index), label=name)
    lengths.set_yscale("log")
    style.plain_log_ticks(lengths, "y")
    lengths.set_ylabel("response length (tokens, log scale)")
    lengths.set_title("Response lengths")
    style.legend(lengths)

    _bars(cv, x, fleet["step_time_cv_mean"], fleet["step_time_runs"], style.colour(0))
    cv.set_ylabel("step-time CV (std / mean)")
    cv.set_title("Step-time fluctuation")

    _bars(imbalance, x, fleet["lambda_mean"], fleet["imbalance_runs"], style.colour(1))
    maxima = fleet["lambda_max"].cast(pl.Float64).fill_null(float("nan")).to_numpy()
    imbalance.plot(x, maxima, linestyle="none", marker="_", markersize=14, color=style.colour(3), label="max λ")
    imbalance.axhline(1.0, color="grey", linewidth=0.8)
    imbalance.set_ylabel("λ = max rank load / mean")
    imbalance.set_title("DP load imbalance")
    style.legend(imbalance)

    for ax in axes:
        ax.set_xticks(x, labels, rotation=30 if len(labels) > 4 else 0)
        ax.set_xlim(-0.6, len(labels) - 0.4)
    return figure


def _bars(ax, x, values: pl.Series, runs: pl.Series, colour: str) -> None:
    """Bars where the value exists, 'n/a' where no run of the task supports one; n above each bar."""
    for position, value, count in zip(x, values.to_list(), runs.to_list()):
        if value is None:
            ax.text(position, 0, "n/a", ha="center", va="bottom", color="grey")
            continue
        ax.bar(position, value, width=0.6, color=colour)
        ax.annotate(f"n={count}", (position, value), ha="center", va="bottom", fontsize=8,
                    xytext=(0, 2), textcoords="offset points")
