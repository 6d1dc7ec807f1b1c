"""The registry of analyses `polytrace analyze`, `compare`, `report` and `check` iterate over.

Each analysis module registers one summary function: (store connection, run ids, step range) ->
polars DataFrame with a `run` column and stable column names. Modules also expose detail
functions (per step, per rank, CDF points, ...) that figures draw from; those are plain public
functions and need no registration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import duckdb
import polars as pl

from polytrace_cli.analyze.common import StepRange

SummaryFunction = Callable[[duckdb.DuckDBPyConnection, list[int], StepRange], pl.DataFrame]


@dataclass(frozen=True)
class Analysis:
    name: str
    description: str
    summary: SummaryFunction


_ANALYSES: dict[str, Analysis] = {}


def register(name: str, description: str) -> Callable[[SummaryFunction], SummaryFunction]:
    """Decorator registering a module's summary function under `name`."""

    def decorate(function: SummaryFunction) -> SummaryFunction:
        if name in _ANALYSES:
            raise ValueError(f"analysis {name!r} registered twice")
        _ANALYSES[name] = Analysis(name, description, function)
        return function

    return decorate


def all_analyses() -> dict[str, Analysis]:
    """Every registered analysis, in the order the analyze package imports them."""
    import polytrace_cli.analyze  # noqa: F401  (importing the package registers the built-ins)

    return dict(_ANALYSES)
