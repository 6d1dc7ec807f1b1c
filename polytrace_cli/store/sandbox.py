"""What a store file from elsewhere may not do to the connection that reads it.

A store is a DuckDB file anyone can write: its views and macros run inside every query polytrace makes
of it, with the reading connection's rights (`ingest_errors` redefined as a view over `read_text`
would print a local file through `polytrace errors`; a macro named like a built-in function would
change the numbers). So every store connection reads through polytrace's own definitions:

- the views polytrace defines (`samples` from the migrations, `named_step_metrics` and `steps` from the
  formats' declarations) are compared with the file's: where they differ, a writer rebuilds them by name and
  a reader reads through its own, created as temporary views (which DuckDB resolves first);
- a store holding any other view (a table of polytrace's replaced by a view, or a view of someone
  else's), or any macro, is refused with one line;
- a store file shorter than its blocks in use (cut short) is refused before anything is read.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import duckdb

from polytrace_cli.errors import StoreError

# DuckDB's file: three 4 KiB headers, then `total_blocks` blocks of `block_size` bytes.
HEADER_BYTES = 3 * 4096
_VIEW = re.compile(r"^\s*CREATE\s+(?:OR\s+REPLACE\s+)?VIEW\s+(\w+)\s+AS\b(.*?);\s*$", re.I | re.S | re.M)


@functools.cache
def migration_views() -> dict[str, str]:
    """The views the schema files create (name -> the query after AS), the last definition of each."""
    from polytrace_cli.store.migrations import available_migrations

    views: dict[str, str] = {}
    for migration in available_migrations():
        for name, body in _VIEW.findall(migration.sql):
            views[name.lower()] = body
        for name in re.findall(r"DROP\s+VIEW\s+(?:IF\s+EXISTS\s+)?(\w+)", migration.sql, re.I):
            views.pop(name.lower(), None)
    return views


def own_view_statements() -> dict[str, str]:
    """polytrace's own views as CREATE TEMP VIEW statements (name -> statement)."""
    from polytrace_cli.store.catalog import declared_catalog

    statements = {name: f"CREATE OR REPLACE TEMP VIEW {name} AS {body}" for name, body in migration_views().items()}
    for name, statement in declared_catalog()[1].items():
        statements[name] = re.sub(r"CREATE\s+OR\s+REPLACE\s+VIEW", "CREATE OR REPLACE TEMP VIEW", statement, count=1)
    return statements


def foreign_objects(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The store's views polytrace does not define and its macros, as 'view NAME' / 'macro NAME'."""
    from polytrace_cli.store.catalog import CATALOG_VIEWS

    own = set(migration_views()) | set(CATALOG_VIEWS)
    views = [f"view {name}" for (name,) in con.execute(
        "SELECT view_name FROM duckdb_views() WHERE NOT internal AND NOT temporary"
        " AND database_name = current_database() ORDER BY view_name").fetchall() if name.lower() not in own]
    macros = [f"macro {name}" for (name,) in con.execute(
        "SELECT DISTINCT function_name FROM duckdb_functions() WHERE NOT internal"
        " AND function_type IN ('macro', 'table_macro') AND database_name = current_database()"
        " ORDER BY 1").fetchall()]
    return views + macros


def _view_bodies(con: duckdb.DuckDBPyConnection, temporary: bool) -> dict[str, str]:
    """The store's (or, `temporary`, the connection's own) views: name -> the query DuckDB keeps,
    with the names of an EXCLUDE list in order (DuckDB writes them in no fixed order)."""
    rows = con.execute("SELECT view_name, sql FROM duckdb_views() WHERE NOT internal AND temporary = ?"
                       " AND (temporary OR database_name = current_database())", [temporary]).fetchall()
    return {name.lower(): _EXCLUDE.sub(lambda m: "EXCLUDE (" + ", ".join(sorted(m.group(1).split(", "))) + ")",
                                       sql[sql.index(" AS ") + 4:]) for name, sql in rows}


_EXCLUDE = re.compile(r"EXCLUDE \(([^()]*)\)")


# The store files (path, inode, size, modification and change times) this process found holding
# polytrace's own views. Any write to the file, or a modification time set back, moves its change time.
_READ_THROUGH_OWN: set[tuple[str, int, int, int, int]] = set()


def _file_key(path: Path) -> tuple[str, int, int, int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    wal = Path(f"{path}.wal")
    # A write-ahead log can change the catalog without touching the file.
    return None if wal.exists() else (str(Path(path).resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns,
                                      stat.st_ctime_ns)


def trust_own_write(path: Path) -> None:
    """Take the store file at `path`, as this process's own connection just left it (closed), as
    holding polytrace's own views: a store followed by `watch`, opened at every poll, or opened again
    by the next command of a session, is not checked again for what only this process wrote."""
    key = _file_key(path)
    if key is not None:
        _READ_THROUGH_OWN.add(key)


def read_through_own_views(con: duckdb.DuckDBPyConnection, path: Path, read_only: bool) -> None:
    """Refuse a store holding views or macros polytrace does not define; make the connection read
    polytrace's own views by name. Each is created as a temporary view and compared with the
    store's: the same, the temporary one is dropped; another (or missing), a writer replaces the
    store's view with its own, a reader keeps the temporary one, which DuckDB resolves first."""
    key = _file_key(path)
    if key is not None and key in _READ_THROUGH_OWN:
        return  # this file, unchanged since, was found to hold polytrace's own views and no macro
    foreign = foreign_objects(con)
    if foreign:
        shown = ", ".join(foreign[:3]) + (" ..." if len(foreign) > 3 else "")
        raise StoreError(f"{path} holds SQL that polytrace does not define ({shown}), which would run inside its"
                         " queries; refusing to read it: ingest the logs again into a new store with --db")
    statements = own_view_statements()
    try:
        for statement in statements.values():
            con.execute(statement)
    except duckdb.Error as error:
        first = str(error).strip().splitlines()[0]
        raise StoreError(f"{path} lacks the tables polytrace's views read ({first}); it is not a whole"
                         " polytrace store") from None
    own, stored = _view_bodies(con, True), _view_bodies(con, False)
    differ = [name for name in statements if stored.get(name) != own.get(name)]
    if not differ and key is not None:
        _READ_THROUGH_OWN.add(key)
    if differ and read_only:
        for name in statements:
            if name not in differ:
                con.execute(f"DROP VIEW temp.main.{name}")
        return
    for name in statements:
        con.execute(f"DROP VIEW temp.main.{name}")
    if differ:
        from polytrace_cli.store.catalog import CATALOG_VIEWS, install_catalog

        for name in differ:
            if name not in CATALOG_VIEWS:
                con.execute(statements[name].replace("CREATE OR REPLACE TEMP VIEW", "CREATE OR REPLACE VIEW", 1))
        if set(differ) & set(CATALOG_VIEWS):
            con.execute("DROP VIEW IF EXISTS steps")  # its fingerprint comment goes with it: written again
            install_catalog(con)


def check_whole(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Refuse a store file shorter than its blocks in use take: a copy cut short, whichever table a
    command would read. Asked of a connection just opened, before it writes anything, and only when
    the store has no write-ahead log (replaying one may count blocks the file does not hold yet)."""
    if Path(f"{path}.wal").exists():
        return
    # Every block in use lies in the file, whatever order: the file holds at least that many (free
    # blocks at its end may have been cut off by DuckDB itself, so the total is no bound).
    block_size, blocks = con.execute("SELECT block_size, used_blocks FROM pragma_database_size()"
                                     " WHERE database_name = current_database()").fetchall()[0]
    expected = HEADER_BYTES + int(blocks) * int(block_size)
    size = os.path.getsize(path)
    if size < expected:
        raise StoreError(f"{path} is cut short (damaged: {size:,} bytes, fewer than the {expected:,} its blocks in"
                         " use take);"
                         " restore it from a copy, or ingest the logs again into a new store with --db")
