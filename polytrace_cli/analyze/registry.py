"""The registry of analyses `polytrace analyze`, `compare`, `report` and `check` iterate over.

Each analysis module registers one summary function: (store connection, run ids, step range) ->
polars DataFrame with a `run` column and stable column names. Modules also expose detail
functions (per step, per rank, CDF points, ...) that figures draw from; those are plain public
functions and need no registration.
"""

from __future__ import annotations

import importlib
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


# Imported on first use so that commands which need no analysis start without scipy.
BUILT_IN = ("lengths", "drift", "longtail", "fit", "imbalance", "stages", "tools", "filtering")

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
    for module in BUILT_IN:
        importlib.import_module(f"polytrace_cli.analyze.{module}")

    return dict(_ANALYSES)


def named_analyses(names: list[str]) -> dict[str, Analysis]:
    """The named analyses in the given order, importing only their modules (a name that is not built
    in is looked up among all analyses); unknown names are left out."""
    if not set(names) <= set(BUILT_IN):
        registered = all_analyses()
    else:
        for name in names:
            importlib.import_module(f"polytrace_cli.analyze.{name}")
        registered = _ANALYSES
    return {name: registered[name] for name in names if name in registered}
