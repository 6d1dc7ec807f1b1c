"""F1: CDF of prompt and of response lengths, one line per run, log-scale x."""

from __future__ import annotations

import polars as pl

from polytrace_cli.report import style
from polytrace_cli.analyze import lengths
from polytrace_cli.report.figures.base import Omitted, empty, runs_of

ID = "F1"
TITLE = "Prompt and response length CDFs"
CAPTION = "Share of samples at or below each length, per run; x is log-scaled."
FRAMES = ('cdf',)
# Why a run without this figure's data is left out of it.
LEFT_OUT = "no per-sample lengths"


def frames(con, run_ids, steps) -> dict[str, pl.DataFrame]:
    """The lengths analysis' whole-run CDF points."""
    return {"cdf": lengths.cdf(con, run_ids, steps)}


def render(data: dict[str, pl.DataFrame]):
    """Two panels (prompt, response): one CDF line per run."""
    cdf = data["cdf"]
    x, y = "length_tokens", "quantile"
    if empty(cdf, x, y):
        return Omitted("the runs have no per-sample lengths")
    figure, axes = style.new_figure(2, 1, width=10, height=4)
    runs = runs_of(cdf)
    for ax, kind in zip(axes, ("prompt", "response")):
        part = cdf.filter(pl.col("kind") == kind)
        for index, run in enumerate(runs):
            line = part.filter(pl.col("run") == run).sort(x)
            line = line.filter(pl.col(x) > 0)
            if line.height:
                ax.step(line[x].to_numpy(), line[y].to_numpy(), where="post", color=style.colour(index),
                        label=run, linewidth=1.6)
        ax.set_xscale("log")
        style.plain_log_ticks(ax, "x")
        ax.set_ylim(0, 1.01)
        ax.set_xlabel(f"{kind} length (tokens, log scale)")
        ax.set_ylabel("share of samples ≤ length")
        ax.set_title(f"{kind.capitalize()} length CDF")
        style.legend(ax)
    return figure
