"""`polytrace runs`, `polytrace query` and `polytrace errors`: looking into the store."""

from __future__ import annotations

from typing import Annotated

import typer

from polytrace_cli.commands.common import CsvOption, DbOption, JsonOption, emit_frame, emit_rows, user_errors


@user_errors
def runs(db: DbOption = None, as_json: JsonOption = False, as_csv: CsvOption = False) -> None:
    """List the runs in the store with their sample, step and file counts."""
    from polytrace_cli.store import open_store
    from polytrace_cli.store.queries import runs_frame

    con = open_store(db, read_only=True)
    try:
        emit_frame(runs_frame(con), as_json=as_json, as_csv=as_csv, title="runs")
    finally:
        con.close()


@user_errors
def query(
    sql: Annotated[str, typer.Argument(help="A read-only SQL statement over the store's tables.")],
    db: DbOption = None,
    as_json: JsonOption = False,
    as_csv: CsvOption = False,
) -> None:
    """Run read-only SQL on the store (tables: runs, files, samples, steps, step_metrics, ...).

    One SELECT (or EXPLAIN) statement; it cannot read or write files, attach databases or load
    extensions.
    """
    from polytrace_cli.store import open_store
    from polytrace_cli.store.connection import confine
    from polytrace_cli.store.queries import read_only_relation

    con = confine(open_store(db, read_only=True))
    try:
        relation = read_only_relation(con, sql)
        emit_rows(relation.columns, relation.fetchall(), _numeric_columns(relation),
                  as_json=as_json, as_csv=as_csv)
    finally:
        con.close()


def _numeric_columns(relation) -> set[str]:
    numeric = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER",
               "UBIGINT", "UHUGEINT", "FLOAT", "DOUBLE")
    return {name for name, kind in zip(relation.columns, relation.types)
            if str(kind) in numeric or str(kind).startswith("DECIMAL")}


@user_errors
def errors(
    run: Annotated[str | None, typer.Argument(help="Only this run.")] = None,
    db: DbOption = None,
    limit: Annotated[int, typer.Option(help="Show at most this many.")] = 50,
    as_json: JsonOption = False,
    as_csv: CsvOption = False,
) -> None:
    """Show quarantined lines: file, line, reason and the raw text."""
    from polytrace_cli.store import open_store
    from polytrace_cli.store.queries import ingest_errors_frame

    con = open_store(db, read_only=True)
    try:
        emit_frame(ingest_errors_frame(con, run, limit), as_json=as_json, as_csv=as_csv, title="rejected lines")
    finally:
        con.close()
