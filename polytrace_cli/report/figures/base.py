"""What every figure module shares: the Omitted result and access to the analyses' detail functions.

A figure module has `ID`, `TITLE`, `CAPTION`, `frames(con, run_ids, steps) -> dict of polars frames`
(only calls into `polytrace_cli.analyze`) and `render(frames) -> Figure | Omitted` (draws, computes
nothing new). A figure whose data the runs lack is an `Omitted` with the reason, never an empty plot.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import polars as pl


@dataclass(frozen=True)
class Omitted:
    """A figure left out of the report, with one line saying why."""

    reason: str


class MissingAnalysis(Exception):
    """The analysis function a figure draws from is not available in this installation."""


def detail(module: str, *names: str) -> Callable:
    """The first of `names` defined in the analysis module `polytrace_cli.analyze.<module>`;
    MissingAnalysis when that module is not installed or defines none of them."""
    try:
        analysis = importlib.import_module(f"polytrace_cli.analyze.{module}")
    except ModuleNotFoundError as error:
        if error.name != f"polytrace_cli.analyze.{module}":
            raise
        raise MissingAnalysis(f"the {module} analysis is not available") from None
    for name in names:
        function = getattr(analysis, name, None)
        if callable(function):
            return function
    raise MissingAnalysis(f"the {module} analysis has no {' / '.join(names)} detail frame")


def empty(frame: pl.DataFrame | None, *columns: str) -> bool:
    """True when the frame is missing, has no rows, or every value of `columns` is null."""
    if frame is None or frame.height == 0:
        return True
    for column in columns:
        if column not in frame.columns or frame[column].drop_nulls().len() == 0:
            return True
    return False


def first_column(frame: pl.DataFrame, *candidates: str) -> str | None:
    """The first candidate column name present in the frame."""
    for name in candidates:
        if name in frame.columns:
            return name
    return None


def runs_of(frame: pl.DataFrame) -> list[str]:
    """The run names of a frame, in first-seen order."""
    if "run" not in frame.columns:
        return [""]
    return frame["run"].unique(maintain_order=True).to_list()
