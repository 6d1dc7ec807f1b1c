"""The one rule that lets a file be skipped on re-ingest.

A file the store already holds for the run, read the same way (same format, parser version and
row-changing read options) and with the same size and sha256, is unchanged: it is not read again.
Anything else is read again, and its earlier rows are replaced. The sha256 is asked for only when
everything cheaper already matches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import duckdb

from polytrace_cli.ingest.base import Ingester

# The `files` columns the rule reads, in `StoredFile`'s field order.
STORED_FILE_COLUMNS = "file_id, sha256, format, parser_version, read_options, bytes"


@dataclass(frozen=True)
class StoredFile:
    """What the store recorded of a file when it was last read."""

    file_id: int
    sha256: str
    format: str
    parser_version: str
    read_options: str | None
    bytes: int


def stored_file(con: duckdb.DuckDBPyConnection, run_id: int, path: str) -> StoredFile | None:
    """The store's record of the file at `path` (as `path_text` writes it) in the run, or None."""
    rows = con.execute(f"SELECT {STORED_FILE_COLUMNS} FROM files WHERE run_id = ? AND path = ?",
                       [run_id, path]).fetchall()
    return StoredFile(*rows[0]) if rows else None


def stored_files(con: duckdb.DuckDBPyConnection, keys: list[tuple[int, str]]) -> dict[tuple[int, str], StoredFile]:
    """`stored_file` for many (run_id, path) pairs in one query."""
    columns = ", ".join(f"f.{column.strip()}" for column in STORED_FILE_COLUMNS.split(","))
    rows = con.execute(
        f"SELECT f.run_id, f.path, {columns} FROM files f"
        " JOIN (SELECT unnest(?::BIGINT[]) AS run_id, unnest(?::VARCHAR[]) AS path) w"
        " ON f.run_id = w.run_id AND f.path = w.path",
        [[run_id for run_id, _ in keys], [path for _, path in keys]]).fetchall()
    return {(run_id, path): StoredFile(*rest) for run_id, path, *rest in rows}


def is_unchanged(stored: StoredFile | None, ingester: Ingester, size: int, sha256: Callable[[], str]) -> bool:
    """The module's rule: `stored` matches the ingester's name, version and read options and the file's
    `size`, and then `sha256()` (called only in that case) equals the stored hash."""
    if stored is None:
        return False
    if (stored.format, stored.parser_version, stored.read_options, stored.bytes) != (
            ingester.name, ingester.version, ingester.read_options(), size):
        return False
    return stored.sha256 == sha256()

