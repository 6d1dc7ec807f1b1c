"""Opening the store: path resolution, clear errors for locks and permissions, migration."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import duckdb

from polytrace_cli.errors import StoreError
from polytrace_cli.store.catalog import catalog_is_current
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
    if "not a valid duckdb database file" in lower:
        return f"{path} is not a DuckDB database file (or it is damaged); point --db at a polytrace store"
    if opening and re.search(r"could not set lock|conflicting lock|\block(ed)?\b", lower):
        pid = re.search(r"PID (\d+)", text)
        holder = f" (held by process {pid.group(1)})" if pid else ""
        return f"{path} is locked by another process{holder}; wait for it or use --db"
    return None


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


def _has_foreign_tables(con: duckdb.DuckDBPyConnection) -> bool:
    """True when the database holds tables or views but no polytrace ledger: someone else's database."""
    return bool(con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE NOT temporary AND database_name = current_database()"
    ).fetchall()[0][0] + con.execute(
        "SELECT count(*) FROM duckdb_views() WHERE NOT internal AND NOT temporary AND database_name = current_database()"
    ).fetchall()[0][0])


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
    (pauses of 0.05 s doubling up to 1 s)."""
    global _OPENED
    deadline = time.monotonic() + wait
    pause = 0.05
    while True:
        try:
            _OPENED += 1
            return duckdb.connect(str(path), read_only=read_only)
        except (duckdb.Error, OSError) as error:
            left = deadline - time.monotonic()
            if not _is_lock_error(error) or left <= 0:
                raise
        time.sleep(min(pause, left))
        pause = min(pause * 2, 1.0)


def open_store(db: str | os.PathLike | None = None, *, read_only: bool = False,
               wait: float = 0, upgrade: bool = True) -> duckdb.DuckDBPyConnection:
    """Open (and for writers create and migrate) the store.

    Read-only opens never create a store: a missing one is an error that tells the user what to
    run. An older store is upgraded first, whichever way it is opened (with `upgrade=False`, a
    read-only open of an older store is an error instead); the upgrade waits at least
    `UPGRADE_WAIT_S` for readers to let go of the store. A DuckDB file that is not a
    polytrace store is refused, never altered; a store this call creates and cannot finish (a full
    disk) is removed; a 0-byte file (left by a crash) holds nothing and is created afresh. While
    another process holds the store's lock, the open is retried for up to `wait` seconds.
    """
    path = resolve_db_path(db)
    if path.is_dir() and (path / "manifest.json").is_file():
        # A folder with a manifest.json is a lake: Parquet files read through views, never written.
        from polytrace_cli.store.lake import open_lake

        if not read_only:
            raise StoreError(f"{path} is a Parquet lake, which is read-only; write into a store file "
                             "and export it again with `polytrace lake`")
        return open_lake(path)
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
    # DuckDB draws a progress bar on stdout for long queries; stdout belongs to the commands.
    con.execute("SET enable_progress_bar = false")
    try:
        if read_only:
            version = check_not_newer(con, str(path))
            if version == 0 and not has_ledger(con):
                raise StoreError(f"{path} is not a polytrace store (no schema ledger)")
            if version < SCHEMA_VERSION or not catalog_is_current(con):
                if not upgrade:
                    raise StoreError(f"{path} is an older store; open it once without upgrade=False to upgrade it")
                # An older store (or one whose aliases and steps view predate the formats' declarations)
                # is upgraded in place before it is read.
                con.close()
                open_store(path, wait=max(wait, UPGRADE_WAIT_S)).close()
                return open_store(path, read_only=True, wait=max(wait, UPGRADE_WAIT_S))
        else:
            if not has_ledger(con) and _has_foreign_tables(con):
                raise StoreError(f"{path} is a DuckDB database but not a polytrace store (no schema ledger);"
                                 " refusing to change it: choose another --db")
            migrate(con, str(path))
    except StoreError:
        con.close()
        raise
    except duckdb.Error as error:
        con.close()
        if creating and not read_only:
            _remove_new_store(path)
        raise _explain_open_failure(path, error) from None
    return con


# Settings that keep a connection inside its store: no files read or written (read_csv, COPY,
# ATTACH, EXPORT), no extension installed or loaded, and no way to change these back.
CONFINED_SETTINGS = (
    "SET enable_external_access = false",
    "SET autoinstall_known_extensions = false",
    "SET autoload_known_extensions = false",
    "SET lock_configuration = true",
)


def confine(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """Lock `con` to the store it has open: no file access, no extensions, configuration frozen."""
    for statement in CONFINED_SETTINGS:
        con.execute(statement)
    return con


__all__ = ["DEFAULT_DB", "ENV_VAR", "confine", "open_store", "resolve_db_path", "schema_version"]


def fetch_first(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None) -> tuple | None:
    """The first row of a query, or None, leaving no unfinished result on the connection."""
    rows = con.execute(sql, params or []).fetchall()
    return rows[0] if rows else None
