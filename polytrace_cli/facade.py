"""`Store`: polytrace from Python (a notebook, a script) over the same library the CLI calls.

    from polytrace_cli import Store

    with Store.open("runs.duckdb") as store:
        store.ingest(["logs/run_a"], task="math")
        store.runs()                                  # polars DataFrame, as `polytrace runs`
        store.analyze("lengths", steps="10:50")       # as `polytrace analyze --only lengths`
        store.steps("run_a")                          # as `polytrace steps run_a`
        store.explain("run_a").findings               # as `polytrace explain run_a`
        store.whatif("run_a", ["balance"]).table()    # as `polytrace whatif run_a --policy balance`
        store.report(out="reports")                   # path of index.html, as `polytrace report`
        store.query("SELECT count(*) FROM samples")   # read-only SQL

This module imports nothing heavy: DuckDB, polars and the analyses load when a method needs them.

Adding a method is three lines (and a docstring): import one library function and call it with
the store's connection, the run ids and the step range, e.g.

    def stage_times(self, runs: Runs = None, steps: Steps = None) -> pl.DataFrame:
        from polytrace_cli.analyze.stages import per_step
        return per_step(self.connection, self.run_ids(runs), self.step_range(steps))
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from polytrace_cli.errors import PolytraceError

if TYPE_CHECKING:
    import duckdb
    import polars as pl

    from polytrace_cli.analyze.common import StepRange
    from polytrace_cli.diagnose import Explanation
    from polytrace_cli.ingest.runner import FileReport
    from polytrace_cli.simulate import BacktestResult, WhatIfResult

    Steps = StepRange | str | int | None

Runs = str | Iterable[str] | None


def _names(runs: Runs) -> list[str] | None:
    if runs is None:
        return None
    return [runs] if isinstance(runs, str) else list(runs)


class Store:
    """An open polytrace store (a DuckDB file). Open it with `Store.open`; close it with `close()`
    or a `with` block."""

    def __init__(self, connection: duckdb.DuckDBPyConnection, path: Path, read_only: bool):
        self._connection: duckdb.DuckDBPyConnection | None = connection
        self.path = path
        self.read_only = read_only

    @classmethod
    def open(cls, path: str | Path | None = None, read_only: bool = False) -> Store:
        """Open (creating and migrating when needed) the store at `path`; by default, as the CLI,
        $POLYTRACE_DB or ./polytrace.duckdb."""
        from polytrace_cli.store import open_store, resolve_db_path

        resolved = resolve_db_path(path)
        return cls(open_store(resolved, read_only=read_only), resolved, read_only)

    @property
    def connection(self) -> duckdb.DuckDBPyConnection:
        """The DuckDB connection the library functions take."""
        if self._connection is None:
            raise PolytraceError(f"the store {self.path} is closed")
        return self._connection

    def run_ids(self, runs: Runs = None) -> list[int]:
        """Ids of the named runs (every run when None); an unknown name is an error."""
        from polytrace_cli.store.queries import run_ids

        return run_ids(self.connection, _names(runs))

    @staticmethod
    def step_range(steps: Steps = None) -> StepRange:
        """A StepRange from "A:B", "A:", ":B", a step number, a StepRange or None (every step)."""
        from polytrace_cli.analyze.common import StepRange

        return StepRange.of(steps)

    def ingest(self, paths: str | Path | Iterable[str | Path], run: str | None = None, task: str | None = None,
               format: str | None = None) -> list[FileReport]:
        """Read files and folders into the store, one transaction per file, as `polytrace ingest`.
        Returns one report per file: path, run, format, status, lines, rows, ignored, rejected, ..."""
        from polytrace_cli.ingest.runner import ingest_paths

        if self.read_only:
            raise PolytraceError(f"the store {self.path} is open read-only; open it with read_only=False to ingest")
        targets = [paths] if isinstance(paths, (str, Path)) else list(paths)
        return ingest_paths(self.connection, [Path(p) for p in targets], run_name=run, task=task, format_name=format)

    def runs(self) -> pl.DataFrame:
        """One row per run with its files, samples, steps and rejected lines, and `semantics` (a struct:
        what the run's numbers mean), as `polytrace runs --json`."""
        import polars as pl

        from polytrace_cli.analyze.semantics import SEMANTICS_COLUMNS, records_by_name
        from polytrace_cli.store.queries import runs_frame

        frame = runs_frame(self.connection)
        records = records_by_name(self.connection, self.run_ids())
        fields = pl.Struct({name: dtype for name, dtype in SEMANTICS_COLUMNS.items() if name != "run"})
        return frame.with_columns(pl.Series("semantics", [records.get(run) for run in frame["run"]], dtype=fields))

    def semantics(self, runs: Runs = None) -> pl.DataFrame:
        """What each run's numbers mean, one row per run (`analyze.semantics.SEMANTICS_COLUMNS`):
        step-time basis, balancing and the λ that sets time, responses per step and its source,
        samples by split, cut lines, crash, partial steps, length collapse; as the `semantics`
        object of `polytrace runs --json`."""
        from polytrace_cli.analyze.semantics import semantics

        return semantics(self.connection, self.run_ids(runs))

    def step_frame(self, runs: Runs = None, steps: Steps = None) -> pl.DataFrame:
        """The canonical per-step frame every view of step time and λ reads
        (`analyze.step_frame.STEP_FRAME_COLUMNS`)."""
        from polytrace_cli.analyze.step_frame import step_frame

        return step_frame(self.connection, self.run_ids(runs), self.step_range(steps))

    def analyze(self, name: str, runs: Runs = None, steps: Steps = None) -> pl.DataFrame:
        """The summary of one analysis (lengths, drift, longtail, fit, imbalance, stages, tools,
        filtering) over the runs and steps ("A:B", a step number or a StepRange), as
        `polytrace analyze --only NAME --json`."""
        from polytrace_cli.analyze.results import summaries

        return summaries(self.connection, _names(runs), name, steps)[name]

    def report(self, runs: Runs = None, out: str | Path = "reports", name: str | None = None,
               steps: Steps = None, svg: bool = False) -> Path:
        """Write the HTML report of the runs under `out/name/`, as `polytrace report` (each figure as
        PNG; as SVG too with `svg`, as `--svg`); returns the path of its index.html."""
        from polytrace_cli.report import write_runs_report

        return write_runs_report(self.connection, _names(runs), out, name, steps, svg=svg)

    def steps(self, run: str, steps: Steps = None) -> pl.DataFrame:
        """One row per step of the run (stage seconds, lengths, load balance, flags, the model's
        expected seconds and, on a slow step, its top cause), as `polytrace steps RUN --json`."""
        from polytrace_cli.diagnose.per_step import steps_with_causes

        return steps_with_causes(self.connection, self.run_ids(run), self.step_range(steps))

    def explain(self, run: str, step: int | None = None, top: int | None = None) -> Explanation:
        """Why the run's steps took their time: an `Explanation` (`.steps`, `.findings`, `.notes`;
        `.to_json()` is `polytrace explain RUN --json`)."""
        from polytrace_cli.diagnose import explain_run

        return explain_run(self.connection, run, step=step, top=top)

    def whatif(self, run: str, policies: str | Iterable[str] | None = None,
               backtest: bool = False) -> WhatIfResult | BacktestResult:
        """The run's predicted wall time under the policies ("balance", "no-validation",
        "max-response-len=N", ...), a `WhatIfResult`; with backtest=True the model's accuracy on
        held-out steps, a `BacktestResult`. `.to_json()` is `polytrace whatif --json`'s text, `.to_dict()` its document."""
        from polytrace_cli.simulate import backtest_run, parse_policy, whatif_run

        chosen = _names(policies) or []
        if backtest == bool(chosen):
            raise PolytraceError("give either backtest=True or at least one policy")
        if backtest:
            return backtest_run(self.connection, run)
        return whatif_run(self.connection, run, [parse_policy(text) for text in chosen])

    def query(self, sql: str) -> pl.DataFrame:
        """The rows of read-only SQL over the store's tables and views, as `polytrace query`."""
        from polytrace_cli.store.queries import query_frame

        return query_frame(self.connection, sql)

    def close(self) -> None:
        """Close the connection (closing twice is harmless)."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._connection is None else ("read-only" if self.read_only else "open")
        return f"Store({str(self.path)!r}, {state})"
