"""F3: prompt vs response length, hexbin, with the correlation."""

from __future__ import annotations

import numpy as np
import polars as pl

from polytrace_cli.report import style
from polytrace_cli.analyze import lengths
from polytrace_cli.report.figures.base import Omitted, empty, runs_of

ID = "F3"
TITLE = "Prompt vs response length"
CAPTION = "Density of (prompt, response) length pairs on log axes, with Pearson r and Spearman ρ per run."
FRAMES = ('pairs', 'correlation')
# Why a run without this figure's data is left out of it.
LEFT_OUT = "no per-sample prompt and response lengths"



def frames(con, run_ids, steps) -> dict[str, pl.DataFrame]:
    """The lengths analysis' (prompt, response) pair counts and correlation."""
    return {"pairs": lengths.joint_histogram(con, run_ids, steps),
            "correlation": lengths.correlation(con, run_ids, steps)}


def render(data: dict[str, pl.DataFrame]):
    """One hexbin per run (three to a row), coloured by sample count on a log scale."""
    pairs, correlation = data["pairs"], data["correlation"]
    x, y = "prompt_tokens", "response_tokens"
    if empty(pairs, x, y):
        return Omitted("the runs have no per-sample prompt and response lengths")
    runs = runs_of(pairs)
    figure, axes = style.new_grid(len(runs), panel_height=3.8)
    for ax, run in zip(axes, runs):
        part = pairs.filter((pl.col("run") == run) & (pl.col(x) > 0) & (pl.col(y) > 0))
        if part.height == 0:
            ax.set_axis_off()
            continue
        counts = part["count"].to_numpy().astype(float)
        art = ax.hexbin(part[x].to_numpy(), part[y].to_numpy(), C=counts,
                        reduce_C_function=np.sum, gridsize=40, xscale="log", yscale="log",
                        bins="log", cmap=style.SEQUENTIAL_CMAP, mincnt=1, linewidths=0)
        style.plain_colorbar(style.add_colorbar(figure, art, [ax], label="samples"))
        ax.grid(False)
        style.plain_log_ticks(ax, "x", "y", narrow_below=1.0)  # narrow panels: 1-2-5 labels would collide
        ax.set_xlabel("prompt length (tokens, log)")
        ax.set_ylabel("response length (tokens, log)")
        r = correlation.filter(pl.col("run") == run) if not empty(correlation, "run") else None
        text = ""
        if r is not None and r.height:
            pearson, spearman = r["pearson"][0], r["spearman"][0]
            text = f"r = {pearson:.2f}, ρ = {spearman:.2f}" if pearson is not None and spearman is not None else ""
        ax.set_title(f"{run}\n{text}" if text else run)
    return figure
