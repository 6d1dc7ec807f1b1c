"""The appended read: the lines a log gained since its last read, read on from the state that read left
(`files.resume_state`) and added to the file's rows and counts in one transaction (`append_in_transaction`).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path


from polytrace_cli.ingest.base import FileContext, Ingester
from polytrace_cli.ingest.files import RangeHashes, byte_range_copy, path_text
from polytrace_cli.ingest.unchanged import StoredFile
from polytrace_cli.store.sql import database_file
from polytrace_cli.ingest.ledger import (
    FileReport, FileRow, commit_file, fill_report, growth_check, record_growth, roll_back_file,
)


class ReadWhole(Exception):
    """An appended read found that the file must be read whole after all (the reason is the message)."""


def ends_a_line(path: Path, size: int) -> bool:
    """Whether the first `size` bytes of the file end with a newline."""
    if not size:
        return False
    with open(path, "rb") as handle:
        handle.seek(size - 1)
        return handle.read(1) == b"\n"


def complete_bytes(path: Path, size: int) -> int | None:
    """`size` when the file ends with a newline (an appended read may start there), else None."""
    return size if ends_a_line(path, size) else None


def append_in_transaction(con, path: Path, ingester: Ingester, run_id: int, run_name: str, stored: StoredFile,
                           ranges: RangeHashes, report: FileReport, started: float) -> FileReport:
    """Read the lines appended to a file since its last read (bytes `stored.bytes` to `ranges.size`)
    and add them to its rows and counts, in one transaction.

    The lines are numbered on from the file's stored lines, and the reader gets the state the last
    read left (`files.resume_state`) and the format version it found. The file's run metadata must come out as a whole read would
    give it: when the new lines give a value that differs from the one the file gave before (a
    restarted job printing other settings), the transaction is rolled back and `ReadWhole` raised.
    """
    file_id, offset = stored.file_id, stored.bytes
    state = stored.state
    previous_meta = state.pop("meta", {})
    previous_version = state.pop("format_version", None)
    state.pop("block_sha", None)
    state.pop("sha_state", None)
    added_lines = ranges.lines - stored.lines
    with byte_range_copy(path, offset, ranges.size, database_file(con)) as part:
        # The format version found so far goes on, as from one block of a whole read to the next.
        ctx = FileContext(con=con, path=part, run_id=run_id, file_id=file_id, run_name=run_name,
                          format_version=previous_version, line_count=added_lines, line_offset=stored.lines,
                          resume=state)
        try:
            ingester.load(ctx)
            ctx.begin_writes()
            # Counts per rule: the file's earlier counts are written again summed with this read's.
            before: Counter = Counter()
            for rule, lines in con.execute("DELETE FROM ignored_lines WHERE file_id = ? RETURNING rule, lines",
                                           [file_id]).fetchall():
                before[rule] += lines
            ctx.flush(ignored_before=before)
            if ctx.lines != added_lines or ctx.lines != ctx.stored + ctx.ignored_total + ctx.rejected:
                raise RuntimeError(
                    f"{ingester.name} lost lines appended to {path}: {added_lines} appended, {ctx.lines} read,"
                    f" {ctx.stored} stored, {ctx.ignored_total} ignored, {ctx.rejected} rejected")
            changed = _changed_meta(previous_meta, ctx.run_meta, set(state.get("recomputed_meta", ())))
            if previous_version and ctx.format_version and ctx.format_version != previous_version:
                changed.append("format version")
            if changed or ctx.resume_state is None:
                raise ReadWhole(f"the appended lines change {', '.join(changed)}" if changed
                                 else "the appended lines cannot follow the lines read before")
            # A fact the grammar decides over the whole file again (`recomputed_meta`) is as this read
            # says, null included; any other fact the earlier lines gave stays.
            recomputed = set(state.get("recomputed_meta", ()))
            meta = {**previous_meta, **{k: v for k, v in ctx.run_meta.items() if v is not None or k in recomputed}}
            version = ctx.format_version or previous_version
            seconds = time.perf_counter() - started
            complete = ranges.size if ranges.complete == ranges.size else None
            state = json.dumps({**ctx.resume_state, "meta": meta, "format_version": version,
                                **growth_check(path, ranges.size, ranges.sha, complete)}, sort_keys=True)
            record_growth(con, FileRow(file_id, run_id, path_text(path), ranges.sha, ranges.size, ingester.name,
                                       ingester.version, ctx.lines, ctx.stored, ctx.ignored_total, ctx.rejected,
                                       ctx.rows, seconds, format_version=version, complete_bytes=complete,
                                       resume_state=state))
            commit_file(con, ctx, run_id, ingester.framework, meta, again=True)
        except BaseException:
            roll_back_file(con, ctx)
            raise
    report.status, report.bytes = "appended", ranges.size - offset
    fill_report(report, ctx, started)
    report.notes.insert(0, f"read from byte {offset:,} (line {stored.lines + 1:,}) on")
    return report


def _changed_meta(before: dict, after: dict, recomputed: set[str]) -> list[str]:
    """Keys whose value the appended lines give differently from the file's earlier lines (keys
    `recomputed` from the whole file's stored rows may change: a whole read would change them too)."""
    return sorted(key for key, value in after.items() if key not in recomputed
                  and value is not None and before.get(key) is not None and before[key] != value)
