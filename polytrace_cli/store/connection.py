"""Opening the store: path resolution, clear errors for locks and permissions, migration."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import duckdb

from polytrace_cli.errors import StoreError
from polytrace_cli.store.catalog import MetricNamesSource, catalog_is_current, hand_down
from polytrace_cli.scratch import clear_scratch
from polytrace_cli.store.sandbox import check_whole, read_through_own_views
from polytrace_cli.store.sql import connect_duckdb, fetch_first
from polytrace_cli.store.migrations import SCHEMA_VERSION, check_not_newer, has_ledger, migrate, schema_version

DEFAULT_DB = "polytrace.duckdb"
ENV_VAR = "POLYTRACE_DB"


def resolve_db_path(db: str | os.PathLike | None = None) -> Path:
    """The store path: the explicit argument, else $POLYTRACE_DB, else ./polytrace.duckdb."""
    if db:
        return Path(db)
    return Path(os.environ.get(ENV_VAR) or DEFAULT_DB)


def _can_create_in(folder: Path) -> bool:
    # os.access says yes to root even on read-only mounts; trying is the only reliable check.
    probe = folder / f".polytrace-write-test-{os.getpid()}"
    try:
        probe.touch()
    except OSError:
        return False
    probe.unlink()
    return True


def store_problem(path: Path | str, error: Exception, opening: bool = False) -> str | None:
    """A plain explanation of a DuckDB error that is about the store file itself, or None.

    A damaged file (checksum mismatch, not a DuckDB file), a full disk and (when `opening`) a lock
    held by another process each get their own message; they must not be mistaken for one another.
    """
    text = str(error)
    lower = text.lower()
    first_line = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    if "no space left on device" in lower or "disk is full" in lower or "disk full" in lower:
        return (f"the disk holding {path} is full ({first_line}); free space or choose another place with --db,"
                " then run again")
    if "corrupt database" in lower or re.search(r"checksum \d+ does not match", lower):
        return (f"{path} is damaged ({first_line}); restore it from a copy, or ingest the logs again into a new"
                " store with --db")
    if "could not read enough bytes" in lower:
        return (f"{path} is cut short (damaged: {first_line}); restore it from a copy, or ingest the logs again"
                " into a new store with --db")
    if "not a valid duckdb database file" in lower:
        return f"{path} is not a DuckDB database file (or it is damaged); point --db at a polytrace store"
    if opening and re.search(r"could not set lock|conflicting lock|\block(ed)?\b", lower):
        pid = re.search(r"PID (\d+)", text)
        holder = f" (held by process {pid.group(1)})" if pid else ""
        return f"{path} is locked by another process{holder}; wait for it or use --db"
    return None


def stops_the_store(error: Exception) -> bool:
    """True when a DuckDB error during an ingest is about the store rather than the file being read
    (a full disk, a damaged or invalidated database): the command stops instead of going on."""
    lower = str(error).lower()
    return (store_problem("", error) is not None or "database has been invalidated" in lower
            or "fatal error" in lower or type(error).__name__ == "FatalException")


def _explain_open_failure(path: Path, error: Exception) -> StoreError:
    explained = store_problem(path, error, opening=True)
    if explained:
        return StoreError(explained)
    text = str(error)
    if "permission" in text.lower() or "read-only" in text.lower():
        return StoreError(f"cannot write {path}: permission denied; choose a writable place with --db")
    first_line = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return StoreError(f"cannot open store {path}: {first_line}")


def _remove_new_store(path: Path) -> None:
    # A store this call created and could not finish is removed, never left empty or half-written.
    for leftover in (path, Path(f"{path}.wal")):
        try:
            leftover.unlink()
        except OSError:
            pass


def _has_foreign_tables(con: duckdb.DuckDBPyConnection, besides: tuple[str, ...] = ()) -> bool:
    """True when the database holds tables or views (other than `besides`): with no polytrace ledger,
    someone else's database."""
    return bool(con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE NOT temporary AND database_name = current_database()"
        " AND table_name NOT IN (SELECT unnest(?::VARCHAR[]))", [list(besides)]
    ).fetchall()[0][0] + con.execute(
        "SELECT count(*) FROM duckdb_views() WHERE NOT internal AND NOT temporary AND database_name = current_database()"
    ).fetchall()[0][0])


def _has_core_tables(con: duckdb.DuckDBPyConnection) -> bool:
    """True when the database has the `runs` and `files` tables every polytrace store has."""
    return fetch_first(con, "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database()"
                            " AND schema_name = current_schema() AND table_name IN ('runs', 'files')")[0] == 2


def _runs_holding_nothing(con: duckdb.DuckDBPyConnection) -> list[int]:
    """Runs without any file and without a row in any table with a `run_id` column: what an ingest
    killed between creating a run and committing its first file leaves (a file's rows are committed
    with its `files` row). Cheap when every run has a file: only `files` is read."""
    candidates = {run_id for (run_id,) in con.execute(
        "SELECT run_id FROM runs WHERE run_id NOT IN (SELECT run_id FROM files WHERE run_id IS NOT NULL)").fetchall()}
    if not candidates:
        return []
    tables = [name for (name,) in con.execute(
        "SELECT DISTINCT c.table_name FROM duckdb_columns() c JOIN duckdb_tables() t"
        " USING (database_name, schema_name, table_name) WHERE c.column_name = 'run_id'"
        " AND c.table_name NOT IN ('runs', 'files') AND c.database_name = current_database()"
        " AND c.schema_name = current_schema() ORDER BY 1").fetchall()]
    for name in tables:
        candidates -= {run_id for (run_id,) in con.execute(
            f'SELECT DISTINCT run_id FROM "{name}" WHERE run_id IN (SELECT unnest(?::BIGINT[]))',
            [sorted(candidates)]).fetchall()}
        if not candidates:
            break
    return sorted(candidates)


def _drop_runs_without_files(con: duckdb.DuckDBPyConnection) -> None:
    """Remove the runs that hold nothing (`_runs_holding_nothing`)."""
    empty = _runs_holding_nothing(con)
    if empty:
        con.execute("DELETE FROM runs WHERE run_id IN (SELECT unnest(?::BIGINT[]))", [empty])


SQLITE_MAGIC = b"SQLite format 3\x00"
# A DuckDB file carries "DUCK" at bytes 8..12; its write-ahead log opens with a WAL_VERSION entry.
DUCKDB_MAGIC, DUCKDB_MAGIC_AT = b"DUCK", 8
WAL_START = b"d\x00b"


def _check_store_file(path: Path) -> None:
    """Refuse, before DuckDB opens it, a --db that is not a DuckDB file: a FIFO or device (opening it
    would block), a folder that is no lake, a SQLite or other file, or a store whose write-ahead log
    is not one (DuckDB would drop it without a word)."""
    if not path.exists():
        return
    if path.is_dir():
        raise StoreError(f"{path} is a folder, neither a store file nor a lake (no manifest.json)")
    if not path.is_file():
        raise StoreError(f"{path} is not a regular file (a pipe, socket or device); point --db at a store file")
    try:
        with open(path, "rb") as handle:
            head = handle.read(16)
    except OSError as error:
        raise StoreError(f"cannot read {path}: {error.strerror or error}") from None
    if head.startswith(SQLITE_MAGIC):
        raise StoreError(f"{path} is a SQLite database, not a polytrace store; point --db at a polytrace store")
    if head and head[DUCKDB_MAGIC_AT:DUCKDB_MAGIC_AT + 4] != DUCKDB_MAGIC:
        raise StoreError(f"{path} is not a DuckDB database file (or it is damaged); point --db at a polytrace store")
    wal = Path(f"{path}.wal")
    try:
        with open(wal, "rb") as handle:
            wal_head = handle.read(len(WAL_START))
    except OSError:
        return
    if wal_head and wal_head != WAL_START:
        raise StoreError(f"{wal} is not a DuckDB write-ahead log (damaged, or left by another file); move it"
                         f" away to open {path} as it was last checkpointed")


def _is_lock_error(error: Exception) -> bool:
    return bool(re.search(r"could not set lock|conflicting lock|\block(ed)?\b", str(error).lower()))


_OPENED = 0
# How long an upgrade waits for another reader at least (a report's second process looks at the
# store and lets go of an older one at once).
UPGRADE_WAIT_S = 2.0


def connections_opened() -> int:
    """How many store connections this process has opened (a forked child must not inherit one)."""
    return _OPENED


def _connect(path: Path, read_only: bool, wait: float) -> duckdb.DuckDBPyConnection:
    """duckdb.connect, retried while another process holds the lock, for up to `wait` seconds
    (pauses of 0.05 s doubling up to 1 s); the first time the lock is found held, one line on stderr says
    that the command waits."""
    global _OPENED
    deadline = time.monotonic() + wait
    pause = 0.05
    told = False
    while True:
        try:
            _OPENED += 1
            return connect_duckdb(str(path), read_only=read_only)
        except (duckdb.Error, OSError) as error:
            left = deadline - time.monotonic()
            if not _is_lock_error(error) or left <= 0:
                raise
        if not told:
            # Said once, on stderr: a command that waits is not taken for one that hangs.
            print(f"{path} is locked by another process; waiting up to {wait:g} s", file=sys.stderr, flush=True)
            told = True
        time.sleep(min(pause, left))
        pause = min(pause * 2, 1.0)


def open_store(db: str | os.PathLike | None = None, *, read_only: bool = False,
               wait: float = 0, upgrade: bool = True,
               metric_names: MetricNamesSource | None = None) -> duckdb.DuckDBPyConnection:
    """Open (and for writers create and migrate) the store.

    `metric_names`: the function returning the formats' metric names, from which the store's aliases and
    `steps` view are generated (`catalog.hand_down`; `Store.open` gives the ingest registry's). Without
    it, the one handed down before in this process.

    Read-only opens never create a store: a missing one is an error that tells the user what to
    run. An older store is upgraded first, whichever way it is opened (with `upgrade=False`, a
    read-only open of an older store is an error instead); the upgrade waits at least
    `UPGRADE_WAIT_S` for readers to let go of the store. A DuckDB file that is not a
    polytrace store is refused, never altered; runs left without any file (an ingest killed between
    creating a run and committing its first file) are removed at any open that may upgrade, and the
    copies a killed ingest left in the store's scratch folder (`scratch.clear_scratch`) at a writer's
    open; a store
    this call creates and cannot finish (a full disk) is removed; a 0-byte file (left by a crash) holds nothing and is created afresh. While
    another process holds the store's lock, the open is retried for up to `wait` seconds.
    """
    if metric_names is not None:
        hand_down(metric_names)
    path = resolve_db_path(db)
    if path.is_dir() and (path / "manifest.json").is_file():
        # A folder with a manifest.json is a lake: Parquet files read through views, never written.
        from polytrace_cli.store.lake import open_lake

        if not read_only:
            raise StoreError(f"{path} is a Parquet lake, which is read-only; write into a store file "
                             "and export it again with `polytrace lake`")
        return open_lake(path)
    _check_store_file(path)
    empty_file = path.is_file() and path.stat().st_size == 0
    if read_only and (not path.exists() or empty_file):
        what = "an empty file" if empty_file else "no store"
        raise StoreError(f"{what} at {path}; run `polytrace ingest PATH` first (or pass --db)")
    creating = not path.exists() or empty_file
    if not read_only:
        parent = path.resolve().parent
        if not parent.exists():
            raise StoreError(f"cannot create {path}: folder {parent} does not exist")
        if not path.exists() and not _can_create_in(parent):
            raise StoreError(f"cannot create {path}: folder {parent} is not writable; use --db")
        if empty_file:
            _remove_new_store(path)
    try:
        con = _connect(path, read_only, wait)
    except (duckdb.Error, OSError) as error:
        if creating and not read_only:
            _remove_new_store(path)
        raise _explain_open_failure(path, error) from None
    try:
        if not creating:
            check_whole(con, path)
        if read_only:
            version = check_not_newer(con, str(path))
            if version == 0 and not _has_foreign_tables(con, besides=("schema_migrations",)):
                raise StoreError(f"an empty store at {path} (an ingest stopped before it stored anything);"
                                 " run `polytrace ingest PATH` first (or pass --db)")
            if version == 0 and not has_ledger(con):
                raise StoreError(f"{path} is not a polytrace store (no schema ledger)")
            if not _has_core_tables(con):
                raise StoreError(f"{path} is a DuckDB database but not a polytrace store (its schema ledger"
                                 " names no runs and files tables); point --db at a polytrace store")
            if version < SCHEMA_VERSION or not catalog_is_current(con):
                if not upgrade:
                    raise StoreError(f"{path} is an older store; open it once without upgrade=False to upgrade it")
                # An older store (or one whose aliases and steps view predate the formats' declarations)
                # is upgraded in place before it is read.
                con.close()
                open_store(path, wait=max(wait, UPGRADE_WAIT_S)).close()
                return open_store(path, read_only=True, wait=max(wait, UPGRADE_WAIT_S))
            if upgrade and _runs_holding_nothing(con):
                # Runs a killed ingest left without files are removed (by a writer's open) before reading.
                con.close()
                try:
                    open_store(path, wait=max(wait, UPGRADE_WAIT_S)).close()
                except StoreError:
                    pass  # a store that cannot be written is read as it is
                return open_store(path, read_only=True, wait=max(wait, UPGRADE_WAIT_S), upgrade=False)
        elif creating:
            # A store this call creates holds nothing but what `migrate` writes: no foreign table, view or
            # macro to look for, no run without files.
            migrate(con, str(path), new_store=True)
            clear_scratch(path)
        else:
            ledger = has_ledger(con)
            if not ledger and _has_foreign_tables(con):
                raise StoreError(f"{path} is a DuckDB database but not a polytrace store (no schema ledger);"
                                 " refusing to change it: choose another --db")
            if ledger and schema_version(con, ledger=True) and not _has_core_tables(con):
                raise StoreError(f"{path} is a DuckDB database but not a polytrace store (its schema ledger"
                                 " names no runs and files tables); refusing to change it: choose another --db")
            migrate(con, str(path), ledger=ledger)
            _drop_runs_without_files(con)
            clear_scratch(path)
        if not creating or read_only:
            read_through_own_views(con, path, read_only)
    except StoreError:
        con.close()
        raise
    except duckdb.Error as error:
        con.close()
        if creating and not read_only:
            _remove_new_store(path)
        raise _explain_open_failure(path, error) from None
    return con


__all__ = ["DEFAULT_DB", "ENV_VAR", "open_store", "resolve_db_path", "schema_version"]
