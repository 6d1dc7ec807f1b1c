"""`polytrace runs`, `query`, `errors`, `rm` and `rename`: looking into the store and tidying it."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from polytrace_cli.commands.common import (RUNS_ORDER, CsvOption, DbOption, JsonOption, WaitOption, WideOption, console,
                                          emit_frame, emit_rows, user_errors)
from polytrace_cli.commands.tables import cell


@user_errors
def runs(db: DbOption = None, as_json: JsonOption = False, as_csv: CsvOption = False, wide: WideOption = False,
         wait: WaitOption = 0) -> None:
    """List the runs in the store with their sample, step and file counts."""
    from polytrace_cli.facade import Store

    with Store.open(db, read_only=True, wait=wait) as store:
        # What each run's numbers mean (`analyze.semantics`), for scripts.
        columns, rows = store.run_rows(with_semantics=as_json)
    if not (as_json or as_csv) and "missing_steps" in columns:
        # For people the holes are a column only when some run has them.
        at = columns.index("missing_steps")
        if not any(row[at] for row in rows):
            columns = columns[:at] + columns[at + 1:]
            rows = [row[:at] + row[at + 1:] for row in rows]
    emit_rows(columns, rows, as_json=as_json, as_csv=as_csv, title="runs", identity=["run"], order=RUNS_ORDER,
              wide=wide)


# A table for people shows at most this many rows (a rich table of 230,000 rows took two minutes).
TABLE_ROWS = 1_000
# The limits `query` runs under unless told otherwise.
QUERY_TIME_LIMIT_S = 300.0
QUERY_MEMORY_LIMIT = "4GB"


@user_errors
def query(
    sql: Annotated[str, typer.Argument(help="A read-only SQL statement over the store's tables.")],
    db: DbOption = None,
    as_json: JsonOption = False,
    as_csv: CsvOption = False,
    wide: WideOption = False,
    wait: WaitOption = 0,
    time_limit: Annotated[float, typer.Option("--time-limit", help="Stop the query after this many seconds"
                                              " (0: no limit).")] = QUERY_TIME_LIMIT_S,
    memory_limit: Annotated[str, typer.Option("--memory-limit", help="The most memory the query may hold"
                                              " (DuckDB's spelling: 4GB, 512MB); it spills nothing to disk.")]
    = QUERY_MEMORY_LIMIT,
) -> None:
    """Run read-only SQL on the store (tables: runs, files, samples, steps, step_metrics, ...).

    One SELECT (or EXPLAIN) statement; it cannot read or write files, attach databases or load
    extensions, and it is stopped with a one-line error past its time or memory limit.
    """
    from polytrace_cli.facade import Store

    with Store.open(db, read_only=True, wait=wait).confined(memory_limit) as store, \
            store.time_limit(time_limit or None):
        relation = store.query_relation(sql)
        for_people = not (as_json or as_csv)
        if for_people and relation.columns == ["explain_key", "explain_value"]:
            # A plan is drawn text: printed as it is, not squeezed into a table's cell.
            for _, plan in relation.fetchall():
                console.print(plan, highlight=False, markup=False, crop=False, soft_wrap=True)
            return
        rows = relation.limit(TABLE_ROWS + 1).fetchall() if for_people else relation.fetchall()
        more = for_people and len(rows) > TABLE_ROWS
        emit_rows(relation.columns, rows[:TABLE_ROWS] if more else rows, _numeric_columns(relation),
                  as_json=as_json, as_csv=as_csv, wide=wide)
    if more:
        console.print(f"the first {TABLE_ROWS:,} rows; more follow (--csv or --json print every row)",
                      style="dim", highlight=False, markup=False)


def _numeric_columns(relation) -> set[str]:
    numeric = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER",
               "UBIGINT", "UHUGEINT", "FLOAT", "DOUBLE")
    return {name for name, kind in zip(relation.columns, relation.types)
            if str(kind) in numeric or str(kind).startswith("DECIMAL")}


# The columns of `errors` a narrow table keeps whatever the width, then the others while they fit.
ERRORS_KEPT = ("file", "line", "reason")
ERRORS_ORDER = ("code", "raw", "run")


@user_errors
def errors(
    run: Annotated[str | None, typer.Argument(help="Only this run.")] = None,
    db: DbOption = None,
    limit: Annotated[int, typer.Option(help="Show at most this many.")] = 50,
    as_json: JsonOption = False,
    as_csv: CsvOption = False,
    wide: WideOption = False,
    wait: WaitOption = 0,
) -> None:
    """Show quarantined lines: file, line, reason and the raw text."""
    from polytrace_cli.facade import Store

    with Store.open(db, read_only=True, wait=wait) as store:
        frame = store.errors(run, limit)
        total = store.errors_count(run) if not (as_json or as_csv) else frame.height
    where = f"run {run}" if run else "the store"
    if total == 0 and not (as_json or as_csv):
        console.print(f"no rejected lines in {where}", highlight=False, markup=False)
        return
    # A narrow table keeps where the line is and why it was rejected; the raw text and the rest go first.
    emit_frame(frame, as_json=as_json, as_csv=as_csv, title="rejected lines", wide=wide, identity=ERRORS_KEPT,
               order=ERRORS_ORDER, wrap=["reason"])
    if total > frame.height:
        console.print(f"{frame.height:,} of {total:,} rejected lines in {where} shown; --limit N shows more",
                      style="dim", highlight=False, markup=False)


@user_errors
def rm(
    runs: Annotated[list[str], typer.Argument(metavar="RUN", help="Runs to remove (see `polytrace runs`).", show_default=False)],
    db: DbOption = None,
    as_json: JsonOption = False,
    as_csv: CsvOption = False,
    wait: WaitOption = 0,
) -> None:
    """Remove runs and every row they hold, in one transaction; their files ingest again afterwards."""
    from polytrace_cli.facade import Store

    with Store.open(db, wait=wait) as store:
        removed = store.remove(runs)
    if as_json:
        sys.stdout.write(json.dumps([{"run": r.name, "rows": r.rows} for r in removed], indent=2) + "\n")
        return
    if as_csv:
        emit_rows(["run", "table", "rows"], [(r.name, table, n) for r in removed for table, n in r.rows.items()],
                  as_csv=True)
        return
    for run in removed:
        data = ", ".join(f"{table} {cell(n)}" for table, n in run.data_rows.items())
        derived = f"; and {cell(run.derived_rows)} rows of step facts kept from them" if run.derived_rows else ""
        console.print(f"removed run {run.name}: {cell(run.total_rows)} rows ({data}){derived}", highlight=False)


@user_errors
def rename(
    old: Annotated[str, typer.Argument(metavar="OLD", help="The run's current name.", show_default=False)],
    new: Annotated[str, typer.Argument(metavar="NEW", help="Its new name.", show_default=False)],
    db: DbOption = None,
    wait: WaitOption = 0,
) -> None:
    """Give a run a new name."""
    from polytrace_cli.facade import Store

    with Store.open(db, wait=wait) as store:
        store.rename(old, new)
    console.print(f"renamed run {old} to {new}", highlight=False)
