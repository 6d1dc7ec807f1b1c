"""Loading one file in its own transaction (`ingest_file`): skipped when unchanged, read on from where it
ended when it only grew (`append`), otherwise read whole, its earlier rows replaced.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import Future
from pathlib import Path

import duckdb

from polytrace_cli.ingest.base import FileContext, Ingester
from polytrace_cli.ingest.files import (
    FileHashes, RangeHashes, Readable, block_sha, byte_range_copy, hash_range, last_newline_end, path_text,
)
from polytrace_cli.ingest.unchanged import is_unchanged, reads_the_same, stored_file
from polytrace_cli.store.sql import database_file, fetch_first
from polytrace_cli.ingest.append import ReadWhole, append_in_transaction, complete_bytes, ends_a_line
from polytrace_cli.ingest.ledger import (
    FileReport, FileRow, commit_file, delete_file_rows, fill_report, growth_check, insert_files, roll_back_file,
)


def ingest_file(
    con: duckdb.DuckDBPyConnection, path: Path, ingester: Ingester, run_id: int, run_name: str, head: bytes,
    hashes: FileHashes, source: Readable | None = None, complete_lines: bool = False,
) -> FileReport:
    """Load one file in one transaction; a file read before the same way (same sha256, format, parser
    version and row-changing options) is skipped.

    `path` is the input file as given (its path and sha256 are its provenance); `source` what the
    ingester reads (the decompressed text of a compressed file), by default `path` itself. A new or
    changed file is hashed in `hashes`' thread while DuckDB parses it (hashlib releases the GIL).

    A file of an appendable format (`Ingester.appendable`), read as it is (not from a decompressed or
    rewritten copy, `files.readable`: such a file is read whole), that only grew since it was read (the
    last 64 KB it read still hash the same, `block_sha` in `files.resume_state`, and that read
    ended at a newline) is read from there on (status `appended`); one that shrank is read whole
    (`truncated`), as is one whose last block read changed (`replaced`). New bytes without a
    newline (a progress bar redrawn by carriage returns) are read with the whole file: alone they
    would read as lines ended by carriage returns. With `complete_lines` (a log being written), the
    file is read up to its last newline only: a line still being written is read once finished.
    """
    path = path.resolve()
    plain = source is None or not source.rewritten
    source = source or Readable(path, path, False)
    started = time.perf_counter()
    stored = stored_file(con, run_id, path_text(path))
    options = ingester.read_options()
    size = path.stat().st_size
    report = FileReport(path=path_text(path), status="ingested", format=ingester.name, run=run_name, bytes=size)
    growing = plain and ingester.appendable
    limit = last_newline_end(path, size) if complete_lines and growing else size
    if complete_lines:  # a log being written: its complete lines, or its last block read, as when it grew
        unchanged = is_unchanged(stored, ingester, limit, lambda: hash_range(path, limit=limit).sha,
                                 last_block=lambda: block_sha(path, limit))
    else:
        unchanged = is_unchanged(stored, ingester, limit, lambda: hashes.result(path)[0])
    if unchanged:
        report.status, report.bytes = "unchanged", limit
        report.seconds = time.perf_counter() - started
        return report
    whole_note = None
    same_reading = growing and reads_the_same(stored, ingester)
    if same_reading and limit < stored.bytes:
        whole_note = f"truncated: {limit:,} bytes, {stored.bytes:,} when last read; read again whole"
    elif same_reading and stored.resume_state is not None and stored.complete_bytes == stored.bytes \
            and limit > stored.bytes and last_newline_end(path, limit) > stored.bytes:
        if stored.state.get("block_sha") == block_sha(path, stored.bytes):
            # Only the growth is hashed, on from the hash state kept with the file's record. The last
            # read ended at a newline: the prefix holds its lines' newlines.
            counted = hash_range(path, limit=limit, state=stored.state.get("sha_state"), prefix=stored.bytes,
                                 prefix_lines=stored.lines, prefix_sha=stored.sha256).counted
            ranges = RangeHashes(*counted, complete=limit if ends_a_line(path, limit) else 0)
            try:
                return append_in_transaction(con, path, ingester, run_id, run_name, stored, ranges, report,
                                              started)
            except ReadWhole as why:
                whole_note = f"read again whole: {why}"
        else:
            whole_note = (f"its bytes up to {stored.bytes:,} changed since it was read (the last block read"
                          " hashes differently); read again whole")
    file_id = fetch_first(con, "SELECT nextval('file_id_seq')")[0]
    existing = stored.file_id if stored else None
    if complete_lines and growing:
        # A file being written is read from a copy of its complete lines: the hash, the counts and
        # the rows then all see the same bytes.
        ranges = hash_range(path, limit=limit)
        with byte_range_copy(path, 0, limit, database_file(con)) as part:
            report = _load_in_transaction(con, path, Readable(part, path, False), ingester, run_id, run_name, head,
                                          file_id, existing, _done(ranges.counted), None, report, started, options,
                                          limit)
    else:
        counting = hashes.future(source.path) if source.rewritten else None
        report = _load_in_transaction(con, path, source, ingester, run_id, run_name, head, file_id, existing,
                                      hashes.future(path), counting, report, started, options,
                                      complete_bytes(path, size) if growing else None)
    if whole_note:
        report.status = "truncated" if whole_note.startswith("truncated") else "replaced"
        report.notes.insert(0, whole_note)
    return report


def _done(value) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


def _load_in_transaction(con, path, source, ingester, run_id, run_name, head, file_id, existing, hashing, counting,
                         report, started, options, complete_bytes=None) -> FileReport:
    def replace_previous_version() -> None:
        if existing is not None:
            delete_file_rows(con, existing)
            report.status = "replaced"

    # Lines are counted on the text the ingester reads; the hash is of the input file's bytes.
    ctx = FileContext(con=con, path=source.path, run_id=run_id, file_id=file_id, run_name=run_name,
                      head=head, line_count=counting or hashing, on_begin=replace_previous_version,
                      input_path=path if source.path != path else None)
    try:
        ingester.load(ctx)
        ctx.flush()
        if ctx.lines != ctx.stored + ctx.ignored_total + ctx.rejected:
            raise RuntimeError(
                f"{ingester.name} lost lines in {path}: {ctx.lines} read, {ctx.stored} stored, "
                f"{ctx.ignored_total} ignored, {ctx.rejected} rejected"
            )
        sha, size, _ = hashing.result()
        report.bytes = size
        seconds = time.perf_counter() - started
        state = None
        if ctx.resume_state is not None and complete_bytes is not None:
            state = json.dumps({**ctx.resume_state, "meta": ctx.run_meta, "format_version": ctx.format_version,
                                **growth_check(path, size, sha, complete_bytes)}, sort_keys=True)
        insert_files(con, [FileRow(
            file_id, run_id, path_text(path), sha, size, ingester.name, ingester.version, ctx.lines, ctx.stored,
            ctx.ignored_total, ctx.rejected, ctx.rows, seconds, format_version=ctx.format_version,
            read_options=options, complete_bytes=complete_bytes, resume_state=state)])
        commit_file(con, ctx, run_id, ingester.framework, again=existing is not None)
    except BaseException:
        roll_back_file(con, ctx)
        raise
    fill_report(report, ctx, started)
    return report
