"""The low-level SQL helpers every layer shares, at the bottom of the store: a DuckDB connection made the
way polytrace makes every one, confined to its store, and small statements (the first row, a rollback,
whole row groups, rows folded into a table). This module imports nothing of polytrace but its errors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import duckdb

from polytrace_cli.errors import PolytraceError


# Every connection polytrace opens: DuckDB never fetches or loads an extension on its own (a file
# of another kind, a SQLite database say, would otherwise make it download one).
CONNECTION_CONFIG = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}


def connect_duckdb(database: str = ":memory:", read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """duckdb.connect with `CONNECTION_CONFIG` and no progress bar (stdout belongs to the commands)."""
    con = duckdb.connect(database, read_only=read_only, config=dict(CONNECTION_CONFIG))
    con.execute("SET enable_progress_bar = false")
    return con


# Settings that keep a connection inside its store: no files read or written (read_csv, COPY,
# ATTACH, EXPORT), no extension installed or loaded, and no way to change these back.
CONFINED_SETTINGS = (
    "SET enable_external_access = false",
    "SET autoinstall_known_extensions = false",
    "SET autoload_known_extensions = false",
    "SET lock_configuration = true",
)


def confine(con: duckdb.DuckDBPyConnection, memory_limit: str | None = None) -> duckdb.DuckDBPyConnection:
    """Lock `con` to the store it has open: no file access, no extensions, configuration frozen.
    With `memory_limit`, its queries hold at most that much memory and spill nothing (no temporary
    folder either: none can be read). A connection already confined (a lake is opened confined,
    with its own limit) is returned as it is."""
    if fetch_first(con, "SELECT current_setting('lock_configuration')")[0]:
        return con
    if memory_limit is not None:
        try:
            con.execute("SET memory_limit = ?", [memory_limit])
        except duckdb.Error as error:
            raise PolytraceError(f"memory limit {memory_limit!r} is not a size DuckDB reads (say 4GB):"
                                 f" {str(error).strip().splitlines()[0]}") from None
        con.execute("SET temp_directory = ''")
    for statement in CONFINED_SETTINGS:
        con.execute(statement)
    return con


@contextmanager
def time_limit(con: duckdb.DuckDBPyConnection, seconds: float | None) -> Iterator[None]:
    """Within the block, `con`'s running query is interrupted once `seconds` have passed (None: no
    limit); the interruption, and a query that ran out of the memory limit, raise PolytraceError."""
    import threading

    timer = threading.Timer(seconds, con.interrupt) if seconds else None
    if timer:
        timer.daemon = True
        timer.start()
    try:
        yield
    except duckdb.InterruptException:
        if timer is None:
            raise
        raise PolytraceError(f"the query ran past its time limit of {seconds:g} s (--time-limit) and was"
                             " stopped") from None
    except duckdb.OutOfMemoryException as error:
        raise PolytraceError(f"the query needs more memory than its limit allows (--memory-limit):"
                             f" {str(error).strip().splitlines()[0][:200]}") from None
    finally:
        if timer:
            timer.cancel()


# Rows of a DuckDB row group: the unit a checkpoint rewrites when it merges row groups left part-filled.
ROW_GROUP_ROWS = 122_880


@contextmanager
def whole_row_groups(con: duckdb.DuckDBPyConnection, rows: int) -> Iterator[None]:
    """Inside: an INSERT of about `rows` rows fills whole row groups, going on from the rows the
    transaction inserted before.

    On several threads DuckDB writes a large INSERT's rows as row groups of their own and keeps them
    so, leaving the last one part-filled after every such statement; each later checkpoint (every
    close of a written store) then merges some of them, rewriting whole row groups of rows that did
    not change. On one thread the rows are appended after the transaction's earlier rows. A small
    INSERT (under a row group) is appended so anyway, and keeps its threads; as does a connection
    whose settings are locked (`confine`).
    """
    if rows < ROW_GROUP_ROWS:
        yield
        return
    threads = fetch_first(con, "SELECT current_setting('threads'), current_setting('lock_configuration')")
    if threads[0] == 1 or threads[1]:
        yield
        return
    con.execute("SET threads = 1")
    try:
        yield
    finally:
        con.execute(f"SET threads = {threads[0]}")


def fold_added_rows(con: duckdb.DuckDBPyConnection, table: str, added: str, keys: tuple[str, ...], group: str,
                    aggregates: str) -> None:
    """Fold the rows of the temporary table `added` (the columns of `table`, in its order) into
    `table`: the rows of `table` that share `keys` with an added row, and the added rows, are
    replaced by `SELECT {group}, {aggregates} ... GROUP BY {group}` over them. For aggregates kept
    per key and grown by later rows (a largest value, a count), so only the keys the rows touch are
    rewritten. `added` is dropped."""
    combined = f"{added}_combined"
    matching = " AND ".join(f"t.{key} = a.{key}" for key in keys)
    try:
        con.execute(f"CREATE OR REPLACE TEMP TABLE {combined} AS SELECT {group}, {aggregates}"
                    f" FROM (SELECT t.* FROM {table} t SEMI JOIN {added} a ON {matching}"
                    f" UNION ALL SELECT * FROM {added}) GROUP BY {group}")
        con.execute(f"DELETE FROM {table} t USING {combined} a WHERE {matching}")
        con.execute(f"INSERT INTO {table} SELECT * FROM {combined}")
    finally:
        con.execute(f"DROP TABLE IF EXISTS {combined}")
        con.execute(f"DROP TABLE IF EXISTS {added}")


def rollback(con: duckdb.DuckDBPyConnection) -> None:
    """Roll back the open transaction; when DuckDB has already ended it (a failed commit, a full
    disk), there is nothing to roll back and the error that ended it is the one to report."""
    try:
        con.execute("ROLLBACK")
    except duckdb.Error:
        pass


def fetch_first(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None) -> tuple | None:
    """The first row of a query, or None, leaving no unfinished result on the connection."""
    rows = con.execute(sql, params or []).fetchall()
    return rows[0] if rows else None


def database_file(con: duckdb.DuckDBPyConnection) -> str | None:
    """The file of the database `con` has open (its current database), or None for one in memory."""
    row = fetch_first(con, "SELECT path FROM duckdb_databases() WHERE database_name = current_database()")
    return row[0] if row and row[0] else None
