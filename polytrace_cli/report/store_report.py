"""A report written from a store opened for it, on two cores: what `polytrace report` runs (through
`Store.write_report`, which opens the store; this module never does).

The page's work has two halves that share nothing but the store: the figures with the numbers that
read the same frames (matplotlib, polars), and the modelled numbers (`numbers.ModelledNumbers`: the
analyses that need scipy and scikit-learn, explain and what-if on the step-time model). Before this process opens the store or loads any of those libraries, it forks
(`side_process`): the child opens the store read-only on its own connection and computes the
modelled numbers while this process draws and paints the figures and computes the other numbers.
Each half imports only its own libraries. When there is no second core, or the child fails, this
process computes the modelled numbers itself, so the page is the same either way.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from polytrace_cli.analyze.common import StepRange
from polytrace_cli.errors import PolytraceError
from polytrace_cli import side_process
from polytrace_cli.report.folder import check_report_name

if TYPE_CHECKING:
    import duckdb


@contextmanager
def without_automatic_gc() -> Iterator[None]:
    """Python's cyclic garbage collector off while the report is written (its processes inherit that),
    back as it was afterwards. A report creates matplotlib artists by the thousand over a heap of
    imported modules, and each automatic full collection walks that whole heap. On the `make demo`
    store, collections took 0.4 s of CPU in one process; across the report's processes, turning them
    off saved 0.3 s of CPU, and the peak memory stayed at about 310 MB (every figure is held until it
    is painted anyway)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class StoreReader(Protocol):
    """What a forked report needs of an open store: its connection, its run ids, closing it."""

    connection: duckdb.DuckDBPyConnection

    def run_ids(self, runs: list[str] | None) -> list[int]: ...

    def close(self) -> None: ...


def write_forked_report(open_reader: Callable[[bool], StoreReader], runs: list[str] | None = None,
                        out_dir: Path | str = "reports", name: str | None = None,
                        steps: StepRange | str | None = None, svg: bool = False, may_fork: bool = True) -> Path:
    """`writer.write_runs_report` on a store opened read-only by `open_reader(upgrade)` (a store that needs
    an upgrade is upgraded with upgrade=True, refused with False), with the modelled numbers computed in a
    second process when `may_fork` (no store opened in this process yet) and Python's cyclic garbage
    collector off (`without_automatic_gc`); returns index.html."""
    check_report_name(name)
    step_range = StepRange.of(steps)

    def modelled_on_own_connection():
        from polytrace_cli.report.numbers import modelled_numbers

        # An older store is left to this process's parent to upgrade; the child then bows out.
        store = open_reader(False)
        try:
            return modelled_numbers(store.connection, store.run_ids(runs), step_range)
        finally:
            store.close()

    with without_automatic_gc():
        fork = side_process.fresh() and may_fork
        pending = side_process.start(modelled_on_own_connection) if fork else None
        try:
            store = open_reader(True)
            try:
                from polytrace_cli.report.numbers import compute_numbers, modelled_numbers
                from polytrace_cli.report.writer import write_runs_report

                def numbers(con, run_ids, steps):
                    return compute_numbers(con, run_ids, steps, lambda: side_process.finish(
                        pending, lambda: modelled_numbers(con, run_ids, steps)))

                return write_runs_report(store.connection, store.run_ids(runs), out_dir, name, step_range, svg,
                                         numbers)
            finally:
                store.close()
        finally:
            if pending is not None:
                pending.cancel()
