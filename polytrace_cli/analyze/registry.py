"""The registry of analyses `polytrace analyze`, `compare`, `report` and `check` iterate over.

`ANALYSES` lists the analysis modules in the order every command shows them. Each of them registers
one summary function: (store connection, run ids, step range) ->
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


# Module names under polytrace_cli.analyze, in output order. They are imported on first use so that
# commands which need no analysis start without scipy.
ANALYSES = ("lengths", "drift", "longtail", "fit", "imbalance", "stages", "tools", "filtering")
# Those that load scipy: drift and fit import scipy.stats (0.6 s) and fit scikit-learn; imbalance and stages
# take p-values from scipy.special (0.15 s). A report computes them in its second process, which loads
# scipy.stats for the step-time model anyway, so its first process, which draws, loads no scipy at all
# (see report/numbers.py).
SCIPY_ANALYSES = ("drift", "fit", "imbalance", "stages")

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
    """Every analysis in `ANALYSES` order, whichever modules were imported before."""
    for module in ANALYSES:
        importlib.import_module(f"polytrace_cli.analyze.{module}")
    unlisted = set(_ANALYSES) - set(ANALYSES)
    if unlisted:
        raise ValueError(f"analyses registered but not listed in ANALYSES: {', '.join(sorted(unlisted))}")
    return {name: _ANALYSES[name] for name in ANALYSES}


def named_analyses(names: list[str]) -> dict[str, Analysis]:
    """The named analyses in the given order, importing only their modules; unknown names are left
    out."""
    for name in names:
        if name in ANALYSES:
            importlib.import_module(f"polytrace_cli.analyze.{name}")
    return {name: _ANALYSES[name] for name in names if name in _ANALYSES}
