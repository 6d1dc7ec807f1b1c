"""The strict decoding of step files done ahead, in a forked child, while this process opens the
store and sniffs and hashes the files.

A batch of JSON-lines step files is read by DuckDB's typed reader and checked by the strict
decoder (`jsonl.strict_file_records`), which holds the interpreter. Beside DuckDB's read (which uses
every core) the decoder only takes cores from it; before the read, this process mostly waits on
one core (imports, opening the store, sniffing), so the command line starts a child that walks
the same paths and decodes the files a batch will decode, in the order the batches come:

    ahead = StrictAhead.start(paths, forced)    # before the store is opened (`side_process.fresh`)
    ...
    counts = ahead.counts(batch_paths, ingester) # the child's counts, waiting for them; the rest here
    ahead.close()

The child sends a message for every file it walks past, in walking order: the file's strict count
with the size and modification time it saw before and after decoding it, or that it left the file
(not a batch's, too small to be decoded as JSON records, changed while decoded), so a batch waits
for no more than its own files. A count is used only when the file still has that size and time
and was decoded as the format asked; any other file is decoded here, as is every file when the
child failed. Without a child (a library call, one core), `counts` decodes everything here.

This module imports only `side_process` at first: the command line forks before DuckDB, the readers
and the formats are loaded, and each process then loads them on a core of its own (0.04 s sooner
done for 400 step files).
"""

from __future__ import annotations

import os
import pickle
import signal
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from polytrace_cli import side_process

if TYPE_CHECKING:
    from polytrace_cli.ingest.jsonl import BulkJsonlIngester


def _stamp(path: Path | str) -> tuple[int, int] | None:
    """(size, mtime_ns) of a file, or None when it cannot be stat'ed."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_size, stat.st_mtime_ns


class StrictAhead:
    """A forked child's strict counts of the files a batch will read (see the module docstring)."""

    def __init__(self, pid: int | None = None, read_end: int | None = None) -> None:
        self.pid = pid  # the child's, None when none was started
        self._pipe = os.fdopen(read_end, "rb") if read_end is not None else None
        # path -> ((size, mtime_ns), records, the format it was decoded as), or None when left
        self._sent: dict[str, tuple[tuple[int, int], int | None, str] | None] = {}
        self.served = 0  # how many files' counts came from the child

    @classmethod
    def start(cls, paths: Iterable[str | Path], forced=None) -> StrictAhead:
        """Fork the child when this process is the command line's and has run nothing yet and a
        second core exists; else an object that decodes every file when asked."""
        if not (side_process.fresh() and side_process.can_fork()):
            return cls()
        targets = list(paths)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                os.close(read_end)
                with os.fdopen(write_end, "wb") as pipe:
                    _decode_ahead(targets, forced, pipe)
                status = 0
            except BaseException:  # noqa: BLE001 - the parent decodes whatever was not sent
                pass
            finally:
                os._exit(status)
        os.close(write_end)
        return cls(pid, read_end)

    def counts(self, paths: list[Path], ingester: BulkJsonlIngester) -> dict[str, int | None]:
        """`strict_file_records` of each file (as `ingester`'s format) by its name as DuckDB reports
        it: the child's count when it decoded the file so and the file has not changed since, else
        decoded here."""
        from polytrace_cli.ingest.jsonl import strict_file_records

        wanted = {str(path) for path in paths}
        self._receive_until(wanted)
        found: dict[str, int | None] = {}
        for path in paths:
            key = str(path)
            sent = self._sent.get(key)
            if sent is not None and sent[2] == ingester.name and sent[0] == _stamp(path):
                found[key] = sent[1]
                self.served += 1
            else:
                found[key] = strict_file_records(path, ingester.spec)
        return found

    def _receive_until(self, wanted: set[str]) -> None:
        missing = wanted - self._sent.keys()
        while missing and self._pipe is not None:
            try:
                path, sent = pickle.load(self._pipe)
            except Exception:  # noqa: BLE001 - the child ended (EOF) or failed: the rest is decoded here
                self._end_child(kill=False)
                return
            self._sent[path] = sent
            missing.discard(path)

    def _end_child(self, kill: bool) -> None:
        if self._pipe is None:
            return
        if kill:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._pipe.close()
        self._pipe = None
        os.waitpid(self.pid, 0)

    def close(self) -> None:
        """Stop the child (it may still be decoding files no batch asked for) and reap it."""
        self._end_child(kill=True)

    def __enter__(self) -> StrictAhead:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _decode_ahead(paths: list, forced, pipe) -> None:
    """The child's work: each file a batch would decode strictly, in walking order, sent as it is done."""
    from polytrace_cli.ingest.files import walk
    from polytrace_cli.ingest.jsonl import strict_file_records
    from polytrace_cli.ingest.runner import BATCH_JSON_MIN_MEAN_BYTES, batchable
    for path, explicit, problem in walk(paths):
        resolved = path.resolve() if explicit else path
        sent = None
        before = None if problem else _stamp(resolved)
        # A small file is not sniffed: a batch of such files is read as text lines, without the decoder.
        sniffed = (batchable(path, forced, keep_text=False)
                   if before is not None and before[0] >= BATCH_JSON_MIN_MEAN_BYTES else None)
        if sniffed is not None:
            records = strict_file_records(resolved, sniffed[0].spec)
            if _stamp(resolved) == before:
                sent = (before, records, sniffed[0].name)
        pickle.dump((str(resolved), sent), pipe, protocol=pickle.HIGHEST_PROTOCOL)
        pipe.flush()
