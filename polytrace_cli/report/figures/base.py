"""What every figure module shares: the Omitted result and small frame helpers.

A figure module has `ID`, `TITLE`, `CAPTION`, `frames(con, run_ids, steps) -> dict of polars frames`
(only calls the detail functions of `polytrace_cli.analyze` modules, imported by name, and reads only
the columns those modules declare in their `*_COLUMNS` schemas) and `render(frames) -> Figure | Omitted`
(draws, computes nothing new). A figure whose data the runs lack is an `Omitted` with the reason,
never an empty plot. Figures with a step axis draw runs of very different lengths on axes of their own
(`span_groups`), so a trace of a few steps is never squashed into a corner beside a long run.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl


@dataclass(frozen=True)
class Omitted:
    """A figure left out of the report, with one line saying why."""

    reason: str


def empty(frame: pl.DataFrame | None, *columns: str) -> bool:
    """True when the frame is missing, has no rows, or every value of one of `columns` is null."""
    if frame is None or frame.height == 0:
        return True
    return any(frame[column].drop_nulls().len() == 0 for column in columns)


def runs_of(frame: pl.DataFrame) -> list[str]:
    """The run names of a frame, in first-seen order."""
    return frame["run"].unique(maintain_order=True).to_list()


# Runs whose step spans differ by more than this factor are drawn on axes of their own.
SPAN_RATIO = 5.0


def span_groups(frame: pl.DataFrame, step: str = "step") -> list[list[str]]:
    """The frame's runs grouped so that runs of very different lengths get their own step axis: runs sorted
    by step span (last − first + 1), a new group started when a run's span is more than SPAN_RATIO times the
    group's shortest; the groups in the order of their first run in the frame, runs in first-seen order.
    One group when the spans are alike, so a figure of runs of one length keeps one axes."""
    runs = runs_of(frame)
    spans = {run: span for run, span in frame.group_by("run").agg(
        (pl.col(step).max() - pl.col(step).min() + 1).alias("span")).iter_rows()}
    groups: list[list[str]] = []
    for run in sorted(runs, key=lambda r: (spans[r] or 1, runs.index(r))):
        if groups and (spans[run] or 1) <= SPAN_RATIO * (spans[groups[-1][0]] or 1):
            groups[-1].append(run)
        else:
            groups.append([run])
    ordered = sorted(groups, key=lambda group: min(runs.index(run) for run in group))
    return [sorted(group, key=runs.index) for group in ordered]
