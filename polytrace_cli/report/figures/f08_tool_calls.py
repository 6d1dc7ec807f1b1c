"""F8: tool calls, latency CDF per tool, turns per trajectory, and prefix-cache hit by turn."""

from __future__ import annotations

import polars as pl

from polytrace_cli.report import style
from polytrace_cli.analyze import tools
from polytrace_cli.report.figures.base import Omitted, empty, runs_of

ID = "F8"
TITLE = "Tool calls"
CAPTION = ("Left: tool latency CDF per tool (log x). Middle: share of trajectories by number of turns. "
           "Right: prefix-cache hit ratio Σ cached / Σ prompt tokens by turn index.")
FRAMES = ('latency', 'turns', 'cache')
# Why a run without this figure's data is left out of it.
LEFT_OUT = "no multi-turn trajectories or tool calls"


def frames(con, run_ids, steps) -> dict[str, pl.DataFrame]:
    """The tools analysis' latency CDF, turns distribution and cache hit by turn."""
    return {"latency": tools.latency_cdf(con, run_ids, steps),
            "turns": tools.per_trajectory(con, run_ids, steps),
            "cache": tools.cache_by_turn(con, run_ids, steps)}


def render(data: dict[str, pl.DataFrame]):
    """Three panels; a panel whose frame is empty says so instead of drawing empty axes."""
    latency, turns, cache = data["latency"], data["turns"], data["cache"]
    if turns is not None and turns.height:
        turns = turns.filter(pl.col("measure") == "turns")
    lat_x, lat_y, turn_x, turn_y, hit = "latency_s", "cdf", "value", "share", "hit_ratio"
    has = {
        "latency": not empty(latency, lat_x, lat_y),
        "turns": not empty(turns, turn_x, turn_y),
        "cache": not empty(cache, hit),
    }
    if not any(has.values()):
        return Omitted("the runs have no multi-turn trajectories or tool calls")
    count = sum(has.values())
    figure, axes = style.new_figure(count, 1, width=10, height=4.0)
    panels = iter(axes)  # one panel per part with data, left to right; none drawn empty
    left = next(panels) if has["latency"] else None
    middle = next(panels) if has["turns"] else None
    right = next(panels) if has["cache"] else None
    if has["latency"]:
        series = latency.select("run", "tool").unique(maintain_order=True)
        for index, (run, tool) in enumerate(series.iter_rows()):
            part = latency.filter((pl.col("run") == run) & (pl.col("tool") == tool))
            part = part.filter(pl.col(lat_x) > 0).sort(lat_x)
            label = f"{run}: {tool}" if len(runs_of(series)) > 1 else (tool or run)
            left.step(part[lat_x], part[lat_y], where="post", color=style.colour(index), linewidth=1.4, label=label)
        left.set_xscale("log")
        style.plain_log_ticks(left, "x")
        left.set_ylim(0, 1.02)
        left.set_xlabel("tool latency (s, log scale)")
        left.set_ylabel("share of calls ≤ latency")
        left.set_title("Tool latency CDF")
        style.legend(left, loc="lower right")
    if has["turns"]:
        runs = runs_of(turns)
        width = 0.8 / len(runs)
        for index, run in enumerate(runs):
            part = turns.filter(pl.col("run") == run).sort(turn_x)
            middle.bar(part[turn_x].to_numpy() + (index - (len(runs) - 1) / 2) * width, part[turn_y], width=width,
                       color=style.colour(index), label=run)
        middle.set_xlabel("turns per trajectory")
        middle.set_ylabel("share of trajectories")
        middle.set_title("Turns per trajectory")
        middle.xaxis.get_major_locator().set_params(integer=True)
        if len(runs) > 1:
            middle.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    if has["cache"]:
        for index, run in enumerate(runs_of(cache)):
            part = cache.filter(pl.col("run") == run).sort("turn")
            right.plot(part["turn"], part[hit], color=style.colour(index), marker="o", markersize=4, linewidth=1.4,
                       label=run)
        right.set_ylim(0, 1.02)
        right.set_xlabel("turn index")
        right.set_ylabel("prefix-cache hit ratio")
        right.set_title("Cache hit by turn")
        right.xaxis.get_major_locator().set_params(integer=True)
        style.legend(right, loc="lower right")
    return figure
