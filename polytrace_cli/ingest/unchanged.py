"""The one rule that lets a file be skipped on re-ingest.

A file the store already holds for the run, read the same way (same format, parser version and
row-changing read options) and with the same size and sha256, is unchanged: it is not read again.
Anything else is read again, and its earlier rows are replaced (or, for a log that only grew, added
to: `runner.ingest_file`). The sha256 is asked for only when everything cheaper already matches.

A log still being written is read up to its last newline; it is unchanged when its complete lines
are as many bytes as the last read's and the last 64 KB of them hash as they did then (`block_sha`,
kept in `files.resume_state`), which spares hashing a large log again at every look.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import duckdb

from polytrace_cli.ingest.base import Ingester

# The `files` columns the rule and an appended read use, in `StoredFile`'s field order.
STORED_FILE_COLUMNS = ("file_id, sha256, format, parser_version, read_options, bytes, lines, complete_bytes,"
                       " resume_state, format_version")


@dataclass(frozen=True)
class StoredFile:
    """What the store recorded of a file when it was last read."""

    file_id: int
    sha256: str
    format: str
    parser_version: str
    read_options: str | None
    bytes: int
    lines: int = 0
    complete_bytes: int | None = None
    resume_state: str | None = None  # JSON, see the `files` table
    format_version: str | None = None

    @property
    def state(self) -> dict:
        """`resume_state` read (empty when the file is always read whole)."""
        return json.loads(self.resume_state) if self.resume_state else {}


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


def reads_the_same(stored: StoredFile | None, ingester: Ingester) -> bool:
    """`stored` was read with the ingester's name, version and read options."""
    return stored is not None and (stored.format, stored.parser_version, stored.read_options) == (
        ingester.name, ingester.version, ingester.read_options())


def is_unchanged(stored: StoredFile | None, ingester: Ingester, size: int, sha256: Callable[[], str],
                 last_block: Callable[[], str | None] | None = None) -> bool:
    """The module's rule: `stored` matches the ingester's name, version and read options and the file's
    `size`, and then `sha256()` (called only in that case) equals the stored hash. For a log being
    written, `last_block()` (the sha256 of the 64 KB before `size`) is compared with the `block_sha`
    stored instead, when there is one."""
    if not reads_the_same(stored, ingester) or stored.bytes != size:
        return False
    kept = stored.state.get("block_sha") if last_block is not None else None
    if kept:
        return kept == last_block()
    return stored.sha256 == sha256()
