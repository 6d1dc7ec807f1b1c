"""Removing and renaming runs.

Every table of the store is keyed by `run_id` or by `file_id` (rows that belong to a file of the
run: ignored-line counts, quarantined lines). Removing a run deletes its rows from every base table
that has either column, found in the catalog so that tables added by later schema versions are
covered too, and its `files` rows, so that ingesting the same files again reads them again. Renaming
changes only `runs.name`: every other table refers to the run by id.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from polytrace_cli.errors import PolytraceError
from polytrace_cli.store.connection import rollback
from polytrace_cli.store.migrations import DERIVED_TABLES
from polytrace_cli.store.queries import run_ids


@dataclass(frozen=True)
class RemovedRun:
    name: str
    rows: dict[str, int]

    @property
    def data_rows(self) -> dict[str, int]:
        """Rows removed per table that holds the run's data (`rows` without its derived step facts)."""
        return {table: n for table, n in self.rows.items() if table not in DERIVED_TABLES}

    @property
    def total_rows(self) -> int:
        """Rows removed from the tables that hold the run's data."""
        return sum(self.data_rows.values())

    @property
    def derived_rows(self) -> int:
        """Rows removed from the step facts kept from the run's data (`step_facts.DERIVED_TABLES`)."""
        return sum(n for table, n in self.rows.items() if table in DERIVED_TABLES)


def _keyed_tables(con: duckdb.DuckDBPyConnection) -> tuple[list[str], list[str]]:
    """(tables with a run_id column, tables with a file_id column but no run_id), base tables only."""
    rows = con.execute(
        """
        SELECT c.table_name, list(c.column_name) AS names
        FROM information_schema.columns c JOIN information_schema.tables t
          ON t.table_name = c.table_name AND t.table_schema = c.table_schema
        WHERE t.table_type = 'BASE TABLE' AND t.table_schema = 'main' AND c.column_name IN ('run_id', 'file_id')
        GROUP BY c.table_name ORDER BY c.table_name
        """
    ).fetchall()
    by_run = [name for name, columns in rows if "run_id" in columns and name != "runs"]
    by_file = [name for name, columns in rows if "run_id" not in columns]
    return by_run, by_file


def remove_runs(con: duckdb.DuckDBPyConnection, names: list[str]) -> list[RemovedRun]:
    """Delete the named runs and every row that belongs to them, in one transaction.

    Unknown names are an error and nothing is deleted. Returns, per run, the rows deleted per table."""
    ids = run_ids(con, names)
    by_run, by_file = _keyed_tables(con)
    removed = []
    con.execute("BEGIN TRANSACTION")
    try:
        for name, run_id in zip(names, ids):
            counts: dict[str, int] = {}
            for table in by_file:
                counts[table] = con.execute(
                    f'DELETE FROM "{table}" WHERE file_id IN (SELECT file_id FROM files WHERE run_id = ?)', [run_id]
                ).fetchone()[0]
            for table in by_run:
                counts[table] = con.execute(f'DELETE FROM "{table}" WHERE run_id = ?', [run_id]).fetchone()[0]
            counts["runs"] = con.execute("DELETE FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]
            removed.append(RemovedRun(name, {table: n for table, n in counts.items() if n}))
        con.execute("COMMIT")
    except BaseException:
        rollback(con)
        raise
    return removed


def rename_run(con: duckdb.DuckDBPyConnection, old: str, new: str) -> None:
    """Give run `old` the name `new` (an error when `old` is unknown or `new` is taken or empty)."""
    if not new.strip():
        raise PolytraceError("the new run name is empty")
    [run_id] = run_ids(con, [old])
    if old == new:
        return
    taken = con.execute("SELECT count(*) FROM runs WHERE name = ?", [new]).fetchone()[0]
    if taken:
        raise PolytraceError(f"a run named {new} already exists; remove it first (polytrace rm {new})")
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute("UPDATE runs SET name = ? WHERE run_id = ?", [new, run_id])
        con.execute("COMMIT")
    except BaseException:
        rollback(con)
        raise
