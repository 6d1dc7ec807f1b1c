"""What every figure module shares: the Omitted result and small frame helpers.

A figure module has `ID`, `TITLE`, `CAPTION`, `frames(con, run_ids, steps) -> dict of polars frames`
(only calls the detail functions of `polytrace_cli.analyze` modules, imported by name, and reads only
the columns those modules declare in their `*_COLUMNS` schemas) and `render(frames) -> Figure | Omitted`
(draws, computes nothing new). A figure whose data the runs lack is an `Omitted` with the reason,
never an empty plot.
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
