"""Finding input files and hashing them, with the standard library only.

This module is imported before the heavy libraries (DuckDB, polars) so that `polytrace ingest`
can start hashing the files it was named while those libraries load: hashing and counting lines
take a core for about 1.5 s per GB, which would otherwise compete with the parse for the same cores.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

STORE_SUFFIXES = (".duckdb", ".duckdb.wal")


def hash_and_count(path: Path, chunk_size: int = 8 << 20) -> tuple[str, int, int]:
    """sha256, size in bytes and number of lines (a last line without newline counts)."""
    digest = hashlib.sha256()
    size = newlines = 0
    last = b""
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
            size += len(chunk)
            newlines += chunk.count(b"\n")
            last = chunk[-1:]
    lines = newlines + (1 if size and last != b"\n" else 0)
    return digest.hexdigest(), size, lines


def walk(paths: Iterable[str | Path]) -> Iterator[tuple[Path, bool, str | None]]:
    """(file, named_explicitly, problem) for every file under the given paths, sorted.

    Hidden files and folders below a given folder, and DuckDB store files, are left out.
    """
    for given in paths:
        path = Path(given)
        if not path.exists():
            yield path, True, "no such file or directory"
        elif path.is_dir():
            for child in sorted(path.rglob("*")):
                relative = child.relative_to(path)
                if any(part.startswith(".") for part in relative.parts):
                    continue
                if child.is_file() and not child.name.endswith(STORE_SUFFIXES):
                    yield child, False, None
        elif path.is_file():
            yield path, True, None
        else:
            yield path, True, "not a regular file"


class FileHashes:
    """`hash_and_count` of files, computed one at a time in a background thread.

    `prefetch` queues files before they are needed; `future` returns a file's pending or finished
    result, queueing it if it was not. Results are keyed by resolved path.
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="polytrace-hash")
        self._jobs: dict[Path, Future] = {}

    def future(self, path: Path) -> Future:
        """The (maybe still running) `hash_and_count` of `path`."""
        key = Path(path).resolve()
        if key not in self._jobs:
            self._jobs[key] = self._pool.submit(hash_and_count, key)
        return self._jobs[key]

    def result(self, path: Path) -> tuple[str, int, int]:
        """`hash_and_count(path)`, waiting for it if needed."""
        return self.future(path).result()

    def prefetch(self, paths: Iterable[Path]) -> None:
        """Queue every given file."""
        for path in paths:
            self.future(path)

    def close(self) -> None:
        """Drop queued work that has not started; a running hash finishes in the background."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> FileHashes:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
