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
ANALYSES = ("lengths", "drift", "longtail", "fit", "imbalance", "stages", "tools", "filtering", "timeline", "engine",
            "consistency")
# Those that load scipy: drift and fit import scipy.stats (0.6 s) and fit scikit-learn; imbalance and stages
# take p-values from scipy.special (0.15 s). A report computes them in its second process, which loads
# scipy.stats for the step-time model anyway, so its first process, which draws, loads no scipy at all
# (see report/numbers.py).
SCIPY_ANALYSES = ("drift", "fit", "imbalance", "stages")
# Those that read the samples through `common.samples_sql` and so answer on either split of them
# (training or validation); the others read step metrics or training batches and apply to training alone.
SAMPLE_ANALYSES = ("lengths", "drift", "longtail", "fit")

_ANALYSES: dict[str, Analysis] = {}
# The entry-point group through which another package adds analyses: each entry point names a module
# whose import registers its summary with `@register`. They come after the built-in ones, in entry
# point name order, in `analyze` and `compare` (the report shows the built-in analyses).
ENTRY_POINT_GROUP = "polytrace.analyses"
_PLUGINS: list[str] = []
_plugins_loaded = False


def register(name: str, description: str) -> Callable[[SummaryFunction], SummaryFunction]:
    """Decorator registering a module's summary function under `name`."""

    def decorate(function: SummaryFunction) -> SummaryFunction:
        if name in _ANALYSES:
            raise ValueError(f"analysis {name!r} registered twice")
        _ANALYSES[name] = Analysis(name, description, function)
        return function

    return decorate


def plugin_analyses() -> list[str]:
    """Names of the analyses other installed packages add through the `polytrace.analyses` entry points.
    A plugin that cannot be loaded is an error naming it."""
    global _plugins_loaded
    if not _plugins_loaded:
        from polytrace_cli.plugins import load_plugins

        _plugins_loaded = True
        before = set(_ANALYSES)
        load_plugins(ENTRY_POINT_GROUP, "analysis", lambda module: None)
        _PLUGINS.extend(name for name in _ANALYSES if name not in before and name not in ANALYSES)
    return list(_PLUGINS)


def all_analyses() -> dict[str, Analysis]:
    """Every analysis: the built-in ones in `ANALYSES` order, whichever modules were imported before,
    then the plugins'."""
    for module in ANALYSES:
        importlib.import_module(f"polytrace_cli.analyze.{module}")
    plugins = plugin_analyses()
    unlisted = set(_ANALYSES) - set(ANALYSES) - set(plugins)
    if unlisted:
        raise ValueError(f"analyses registered but not listed in ANALYSES: {', '.join(sorted(unlisted))}")
    return {name: _ANALYSES[name] for name in (*ANALYSES, *plugins)}


def named_analyses(names: list[str]) -> dict[str, Analysis]:
    """The named analyses in the given order, importing only their modules (and the plugins, for a name
    that is not built in); unknown names are left out."""
    for name in names:
        if name in ANALYSES:
            importlib.import_module(f"polytrace_cli.analyze.{name}")
        elif name not in _ANALYSES:
            plugin_analyses()
    return {name: _ANALYSES[name] for name in names if name in _ANALYSES}
