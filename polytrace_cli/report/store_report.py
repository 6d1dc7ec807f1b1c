"""A report written straight from a store file, on two cores: what `polytrace report` runs.

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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from polytrace_cli.analyze.common import StepRange
from polytrace_cli.errors import PolytraceError
from polytrace_cli.report import side_process


def check_report_name(name: str | None) -> None:
    """Refuse a report folder name that is not a plain folder name."""
    if name is not None and (not name.strip() or "/" in name or name in {".", ".."}):
        raise PolytraceError(f"--name must be a plain folder name, not {name!r}")


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


def write_store_report(db: str | os.PathLike | None, runs: list[str] | None = None, out_dir: Path | str = "reports",
                       name: str | None = None, steps: StepRange | str | None = None, svg: bool = False,
                       wait: float = 0) -> Path:
    """`writer.write_runs_report` on the store at `db` (opened read-only, waiting up to `wait` seconds
    for a writer), with the modelled numbers computed in a second process and Python's cyclic garbage
    collector off (`without_automatic_gc`); returns index.html."""
    from polytrace_cli.store import open_store
    from polytrace_cli.store.connection import connections_opened

    check_report_name(name)
    step_range = StepRange.of(steps)

    def modelled_on_own_connection():
        from polytrace_cli.report.numbers import modelled_numbers
        from polytrace_cli.store.queries import run_ids

        # An older store is left to this process's parent to upgrade; the child then bows out.
        con = open_store(db, read_only=True, wait=wait, upgrade=False)
        try:
            return modelled_numbers(con, run_ids(con, runs), step_range)
        finally:
            con.close()

    with without_automatic_gc():
        fork = side_process.fresh() and not connections_opened()
        pending = side_process.start(modelled_on_own_connection) if fork else None
        try:
            con = open_store(db, read_only=True, wait=wait)
            try:
                from polytrace_cli.report.numbers import compute_numbers, modelled_numbers
                from polytrace_cli.report.writer import write_runs_report

                def numbers(con, run_ids, steps):
                    return compute_numbers(con, run_ids, steps, lambda: side_process.finish(
                        pending, lambda: modelled_numbers(con, run_ids, steps)))

                return write_runs_report(con, runs, out_dir, name, step_range, svg, numbers)
            finally:
                con.close()
        finally:
            if pending is not None:
                pending.cancel()
