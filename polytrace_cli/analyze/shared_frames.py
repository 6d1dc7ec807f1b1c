"""Analysis results that more than one part of a report reads, computed once per report: the stages
analysis' per-step seconds (its summary, three of its detail frames, F4 and the findings) and each
run's step-time inclusion decided from them; imbalance's per-step λ with its balanced counterfactual
(F6, F12 and the imbalance summary); longtail's per-rank batches (F7 and the longtail summary);
each run's workload frame (`model.read_workload`: explain, whatif and the backtest).

    with once_per_report():
        shared(stages.per_step, con, run_ids, steps)   # computed
        shared(stages.per_step, con, run_ids, steps)   # the same frame again

Outside `once_per_report()`, `shared` just calls the function. The store is only read meanwhile, so
the same call gives the same frame.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

import duckdb

T = TypeVar("T")
_FRAMES: ContextVar[dict[tuple, Any] | None] = ContextVar("report_frames", default=None)


@contextmanager
def once_per_report() -> Iterator[None]:
    """The block inside which `shared` computes each (function, arguments) once (inside another such
    block, the outer block's frames are kept and shared)."""
    if _FRAMES.get() is not None:
        yield
        return
    token = _FRAMES.set({})
    try:
        yield
    finally:
        _FRAMES.reset(token)


def shared(function: Callable[..., T], con: duckdb.DuckDBPyConnection, *args) -> T:
    """`function(con, *args)`, computed once per function and arguments inside `once_per_report()` (list
    arguments such as run ids are compared by value). The result is shared: it must not be changed."""
    frames = _FRAMES.get()
    if frames is None:
        return function(con, *args)
    key = (function, id(con), *(tuple(arg) if isinstance(arg, list) else arg for arg in args))
    if key not in frames:
        frames[key] = function(con, *args)
    return frames[key]
