"""Opening the store: path resolution, clear errors for locks and permissions, migration."""

from __future__ import annotations

import os
import re
from pathlib import Path

import duckdb

from polytrace_cli.errors import StoreError
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


def _explain_open_failure(path: Path, error: Exception) -> StoreError:
    text = str(error)
    if "lock" in text.lower():
        pid = re.search(r"PID (\d+)", text)
        holder = f" (held by process {pid.group(1)})" if pid else ""
        return StoreError(f"{path} is locked by another process{holder}; wait for it or use --db")
    if "permission" in text.lower() or "read-only" in text.lower() or "Read-only" in text:
        return StoreError(f"cannot write {path}: permission denied; choose a writable place with --db")
    first_line = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return StoreError(f"cannot open store {path}: {first_line}")


def open_store(db: str | os.PathLike | None = None, *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open (and for writers create and migrate) the store.

    Read-only opens never create a store: a missing one is an error that tells the user what to
    run. An older store is upgraded first, whichever way it is opened.
    """
    path = resolve_db_path(db)
    if path.is_dir() and (path / "manifest.json").is_file():
        # A folder with a manifest.json is a lake: Parquet files read through views, never written.
        from polytrace_cli.store.lake import open_lake

        if not read_only:
            raise StoreError(f"{path} is a Parquet lake, which is read-only; write into a store file "
                             "and export it again with `polytrace lake`")
        return open_lake(path)
    if read_only and not path.exists():
        raise StoreError(f"no store at {path}; run `polytrace ingest PATH` first (or pass --db)")
    if not read_only:
        parent = path.resolve().parent
        if not parent.exists():
            raise StoreError(f"cannot create {path}: folder {parent} does not exist")
        if not path.exists() and not _can_create_in(parent):
            raise StoreError(f"cannot create {path}: folder {parent} is not writable; use --db")
    try:
        con = duckdb.connect(str(path), read_only=read_only)
    except (duckdb.Error, OSError) as error:
        raise _explain_open_failure(path, error) from None
    # DuckDB draws a progress bar on stdout for long queries; stdout belongs to the commands.
    con.execute("SET enable_progress_bar = false")
    try:
        if read_only:
            version = check_not_newer(con, str(path))
            if version == 0 and not has_ledger(con):
                raise StoreError(f"{path} is not a polytrace store (no schema ledger)")
            if version < SCHEMA_VERSION:
                # An older store is upgraded in place before it is read.
                con.close()
                open_store(path).close()
                return open_store(path, read_only=True)
        else:
            migrate(con, str(path))
    except StoreError:
        con.close()
        raise
    except duckdb.Error as error:
        con.close()
        raise _explain_open_failure(path, error) from None
    return con


__all__ = ["DEFAULT_DB", "ENV_VAR", "open_store", "resolve_db_path", "schema_version"]


def fetch_first(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None) -> tuple | None:
    """The first row of a query, or None, leaving no unfinished result on the connection."""
    rows = con.execute(sql, params or []).fetchall()
    return rows[0] if rows else None
