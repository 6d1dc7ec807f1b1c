"""Walking paths, grouping files into runs and loading each file in its own transaction.

Consecutive small plain files of one bulk JSON-lines format (PolyTrace step files) are read as a
batch: one `read_json` over all of them and one transaction that stores every file with its own
`files` row, as if each had been loaded alone. A batch is all-or-nothing; a file with a bad line
leaves the batch and is loaded alone, and a batch that fails as a whole is loaded file by file.
"""

from __future__ import annotations

import errno
import functools
import json
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from polytrace_cli.errors import IngestError, PolytraceError
from polytrace_cli.ingest.base import FileContext, Ingester, file_owned_tables
from polytrace_cli.ingest.files import (
    CorruptFile, FileHashes, RangeHashes, Readable, Skip, UnreadableFile, block_sha, byte_range_copy,
    hash_and_count_bytes, hash_range, is_compressed, last_newline_end, path_text, readable, state_kept_for, walk,
)
from polytrace_cli.ingest.jsonl import (
    BulkJsonlIngester, create_stored_keyed, delete_records_of, few_refused, insert_typed_rows,
    load_batch_records, refused, stored_counts, strict_file_records,
)
from polytrace_cli.ingest.registry import (
    DEEP_SNIFF_BYTES, SNIFF_BYTES, detect, detect_deep, get_ingester, is_binary, is_log_like, read_head,
)
from polytrace_cli.ingest.unchanged import StoredFile, is_unchanged, reads_the_same, stored_file, stored_files
from polytrace_cli.store.step_timers import NULL_MEANS_CANNOT_TELL
from polytrace_cli.store.connection import fetch_first, rollback, stops_the_store

# Folder names that say what a folder holds rather than which run it is.
GENERIC_FOLDERS = {
    "profile", "packed_length_log", "multiturn_workload_log", "logs", "log", "files", "media",
    "table", "tables", "output", "outputs", "rollout_data", "validation_data", "rollout_data_dir",
    "validation_data_dir", "tensorboard", "tensorboard_log", "tb", "events", "runs", "wandb",
}
_TIMESTAMP_LIKE = re.compile(r"[\d_\-.:T]+")
# transformers' TensorBoard folder `runs/Nov26_15-55-36_host` names a start time, and its
# `checkpoint-N` folders a point of the run in its output folder.
_TRAINER_TIMESTAMP = re.compile(r"[A-Z][a-z]{2}\d{2}_\d{2}-\d{2}-\d{2}_.+")
_CHECKPOINT_FOLDER = re.compile(r"checkpoint-\d+")
# The folders of an MLflow file-store run (`mlruns/<experiment>/<run>/metrics/<key>`) below the run's.
_MLFLOW_RUN_PARTS = {"metrics", "params", "tags", "artifacts"}


@dataclass
class FileReport:
    """What happened to one input file."""

    path: str
    status: str  # ingested, appended, replaced, truncated, unchanged, rejected, skipped, error
    format: str | None = None
    run: str | None = None
    bytes: int = 0
    lines: int = 0
    stored: int = 0
    ignored: int = 0
    rejected: int = 0
    rows: int = 0
    seconds: float = 0.0
    message: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    @property
    def failed(self) -> bool:
        return self.status in ("rejected", "error")

    @property
    def unread(self) -> bool:
        """True when the file could not be opened at all (missing, unreadable): nothing of it was read."""
        return self.status == "error" and self.format is None and self.lines == 0


def derive_run(file: Path, resolved: bool = False) -> tuple[str, Path]:
    """A run's name and root folder from a file's location.

    Walks up from the file's folder past generic names (`files`, `profile`, `logs`, ...) and
    timestamp folders; the first other folder names the run. The deepest timestamp folder passed
    on the way, if any, is the run's root, so two timestamped runs under one folder stay apart.
    `resolved` says `file` is already a resolved path. Files under a `media` folder (wandb's `files/media/table/<key>/...`) belong to the folder that
    holds `media`: the key folders below it name a logged key, not a run. transformers' `checkpoint-N` folders are passed like generic ones
    and its TensorBoard `MonDD_HH-MM-SS_host` folders like timestamp folders, and the files of an
    MLflow file-store run (`<run>/metrics/<key>`, `params/`, `tags/`, `artifacts/`) belong to the run's folder.
    """
    return _run_of_folder((file if resolved else file.resolve()).parent)


@functools.lru_cache(maxsize=4096)
def _run_of_folder(folder: Path) -> tuple[str, Path]:
    media = next((current for current in (folder, *folder.parents) if current.name.lower() == "media"), None)
    if media is not None:
        folder = media.parent
    mlflow = next((current for current in (folder, *folder.parents)
                   if current.name in _MLFLOW_RUN_PARTS and (current.parent / "meta.yaml").is_file()), None)
    if mlflow is not None:
        return mlflow.parent.name, mlflow.parent
    timestamp_root = None
    for current in (folder, *folder.parents):
        name = current.name
        if not name:
            break
        if _TIMESTAMP_LIKE.fullmatch(name) or _TRAINER_TIMESTAMP.fullmatch(name):
            timestamp_root = timestamp_root or current
            continue
        if name.lower() in GENERIC_FOLDERS or _CHECKPOINT_FOLDER.fullmatch(name):
            continue
        return name, timestamp_root or current
    return (folder.name or "run"), folder


class RunResolver:
    """Finds or creates the run a file belongs to."""

    def __init__(self, con: duckdb.DuckDBPyConnection, run_name: str | None, task: str | None):
        self.con = con
        self.run_name = run_name
        self.task = task
        self._cache: dict[Path, tuple[int, str]] = {}

    def _identity(self, file: Path, resolved: bool = False) -> tuple[str, str, Path | None]:
        name, root = derive_run(file, resolved)
        if self.run_name:
            return self.run_name, path_text(root), None
        return path_text(name), path_text(root), root

    def resolve(self, file: Path, framework: str | None, resolved: bool = False) -> tuple[int, str]:
        name, source_dir, key = self._identity(file, resolved)
        cache_key = key or Path("::" + name)
        if cache_key not in self._cache:
            self._cache[cache_key] = self._find_or_create(name, source_dir, framework, explicit=key is None)
        return self._cache[cache_key]

    def existing(self, file: Path) -> tuple[int, str] | None:
        """The run the file belongs to if it is already in the store (never creates one)."""
        name, source_dir, key = self._identity(file)
        if key is None:
            return fetch_first(self.con, "SELECT run_id, name FROM runs WHERE name = ?", [name])
        return fetch_first(self.con, "SELECT run_id, name FROM runs WHERE source_dir = ?", [source_dir])

    def drop_if_empty(self, run_id: int) -> None:
        """Delete a run that holds no file (one whose only file just failed), so failures create no run."""
        if fetch_first(self.con, "SELECT 1 FROM files WHERE run_id = ? LIMIT 1", [run_id]):
            return
        self.con.execute("DELETE FROM runs WHERE run_id = ?", [run_id])
        self._cache = {key: value for key, value in self._cache.items() if value[0] != run_id}

    def _find_or_create(self, name: str, source_dir: str, framework: str | None, explicit: bool) -> tuple[int, str]:
        con = self.con
        if explicit:
            row = fetch_first(con, "SELECT run_id, name FROM runs WHERE name = ?", [name])
        else:
            row = fetch_first(con, "SELECT run_id, name FROM runs WHERE source_dir = ?", [source_dir])
        if row:
            if self.task:
                con.execute("UPDATE runs SET task = ? WHERE run_id = ?", [self.task, row[0]])
            return row[0], row[1]
        unique = name
        suffix = Path(source_dir).name
        attempt = 1
        while con.execute("SELECT count(*) FROM runs WHERE name = ?", [unique]).fetchall()[0][0]:
            attempt += 1
            unique = f"{name}-{suffix}" if attempt == 2 and suffix != name else f"{name}-{attempt}"
        run_id = con.execute("SELECT nextval('run_id_seq')").fetchall()[0][0]
        con.execute(
            "INSERT INTO runs (run_id, name, framework, task, source_dir, meta) VALUES (?, ?, ?, ?, ?, ?)",
            [run_id, unique, framework, self.task, source_dir, "{}"],
        )
        return run_id, unique


def claim_run_framework(con: duckdb.DuckDBPyConnection, run_id: int, framework: str | None) -> None:
    """Set a run's framework from a file's content (a wandb or TensorBoard log whose keys name verl or
    OpenRLHF) unless a file of a training framework has already set it."""
    if framework:
        con.execute("UPDATE runs SET framework = ? WHERE run_id = ?"
                    " AND (framework IS NULL OR framework IN ('wandb', 'tensorboard'))", [framework, run_id])


# Run facts each file counts on its own, of which the run's is the largest any of its files gave.
LARGEST_OVER_FILES = frozenset({"dp_ranks_seen"})


def fold_meta(merged: dict, meta: dict) -> dict:
    """`merged` with a file's run metadata folded in: a value overwrites, a null never erases a value,
    and a fact of LARGEST_OVER_FILES keeps the largest value (the same whatever order files are read in)."""
    for key, value in meta.items():
        if value is None:
            continue
        if key in LARGEST_OVER_FILES and isinstance(merged.get(key), (int, float)) and isinstance(value, (int, float)):
            value = max(merged[key], value)
        merged[key] = value
    return merged


def merge_run_meta(con: duckdb.DuckDBPyConnection, run_id: int, framework: str | None, meta: dict,
                   file_id: int | None = None, again: bool = False) -> None:
    """Merge a file's run metadata into its run's `meta`: the run's meta is the fold (`fold_meta`, in
    the order the files were read) of what each of its files gave (`file_run_meta`); a key of
    NULL_MEANS_CANNOT_TELL that some file left undecided is stored as null when no file decided it.
    The run's framework is set to `framework` if it has none.

    `meta` is all file `file_id` gives the run, kept as its row. A file read for the first time folds
    in last; one read `again` (grown, or replaced: its earlier row is gone or replaced) has the run's
    meta folded anew from every row, so nothing its earlier text gave stays behind."""
    if file_id is not None:
        con.execute("DELETE FROM file_run_meta WHERE file_id = ? AND run_id = ?", [file_id, run_id])
        con.execute("INSERT INTO file_run_meta (file_id, run_id, meta) VALUES (?, ?, ?)",
                    [file_id, run_id, json.dumps(meta, sort_keys=True)])
    current_framework, current_meta = fetch_first(con, "SELECT framework, meta FROM runs WHERE run_id = ?", [run_id])
    if again:
        merged, undecided = {}, set()
        for (text,) in con.execute("SELECT meta FROM file_run_meta WHERE run_id = ? ORDER BY file_id NULLS FIRST",
                                   [run_id]).fetchall():
            given = json.loads(text)
            fold_meta(merged, given)
            undecided |= {key for key, value in given.items() if value is None}
    else:
        merged = fold_meta(json.loads(current_meta or "{}"), meta)
        undecided = {key for key, value in meta.items() if value is None}
    for key in NULL_MEANS_CANNOT_TELL & undecided:
        if merged.get(key) is None:
            merged[key] = None  # undecided is stored as null; a decided value stays
    con.execute(
        "UPDATE runs SET framework = ?, meta = ? WHERE run_id = ?",
        [current_framework or framework, json.dumps(merged, sort_keys=True), run_id],
    )


def delete_file_rows(con: duckdb.DuckDBPyConnection, file_id: int) -> None:
    """Remove everything one file contributed to the store."""
    for table in file_owned_tables(con):
        con.execute(f"DELETE FROM {table} WHERE file_id = ?", [file_id])
    con.execute("DELETE FROM files WHERE file_id = ?", [file_id])


def _record_whole_file_rejection(
    con: duckdb.DuckDBPyConnection, run_id: int, path: Path, sha: str, size: int, lines: int, fmt: str, reason: str,
    code: str,
) -> None:
    """Store a file that failed as a whole: all its lines count as rejected, under one error with line NULL."""
    con.execute("BEGIN TRANSACTION")
    try:
        old = fetch_first(con, "SELECT file_id FROM files WHERE run_id = ? AND path = ?", [run_id, path_text(path)])
        if old:
            delete_file_rows(con, old[0])
        file_id = con.execute("SELECT nextval('file_id_seq')").fetchall()[0][0]
        con.execute(
            "INSERT INTO files (file_id, run_id, path, sha256, bytes, format, parser_version, lines, stored,"
            " ignored, rejected, rows, seconds) VALUES (?, ?, ?, ?, ?, ?, '-', ?, 0, 0, ?, 0, 0)",
            [file_id, run_id, path_text(path), sha, size, fmt, lines, lines],
        )
        con.execute("INSERT INTO ingest_errors (file_id, line_no, reason, code) VALUES (?, NULL, ?, ?)",
                    [file_id, reason, code])
        con.execute("COMMIT")
    except BaseException:
        rollback(con)
        raise


class _ReadWhole(Exception):
    """An appended read found that the file must be read whole after all (the reason is the message)."""


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
            ranges = RangeHashes(*counted, complete=limit if _ends_a_line(path, limit) else 0)
            try:
                return _append_in_transaction(con, path, ingester, run_id, run_name, stored, ranges, report,
                                              started)
            except _ReadWhole as why:
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
        with byte_range_copy(path, 0, limit) as part:
            report = _load_in_transaction(con, path, Readable(part, path, False), ingester, run_id, run_name, head,
                                          file_id, existing, _done(ranges.counted), None, report, started, options,
                                          limit)
    else:
        counting = hashes.future(source.path) if source.rewritten else None
        report = _load_in_transaction(con, path, source, ingester, run_id, run_name, head, file_id, existing,
                                      hashes.future(path), counting, report, started, options,
                                      _complete_bytes(path, size) if growing else None)
    if whole_note:
        report.status = "truncated" if whole_note.startswith("truncated") else "replaced"
        report.notes.insert(0, whole_note)
    return report


def _done(value) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


def _ends_a_line(path: Path, size: int) -> bool:
    """Whether the first `size` bytes of the file end with a newline."""
    if not size:
        return False
    with open(path, "rb") as handle:
        handle.seek(size - 1)
        return handle.read(1) == b"\n"


def _complete_bytes(path: Path, size: int) -> int | None:
    """`size` when the file ends with a newline (an appended read may start there), else None."""
    return size if _ends_a_line(path, size) else None


def _growth_check(path: Path, size: int, sha: str, complete: int | None) -> dict:
    """What the file's next read needs to take it as grown and hash only its growth: the sha256 of its
    last block read (`block_sha`) and the hash state after its last whole 64-byte block (`sha_state`),
    when the read ended at a newline (`complete`, the bytes read); else nothing to go on from."""
    if not complete:
        return {"block_sha": None}
    return {"block_sha": block_sha(path, complete), "sha_state": state_kept_for(path, size, sha)}


def _append_in_transaction(con, path: Path, ingester: Ingester, run_id: int, run_name: str, stored: StoredFile,
                           ranges: RangeHashes, report: FileReport, started: float) -> FileReport:
    """Read the lines appended to a file since its last read (bytes `stored.bytes` to `ranges.size`)
    and add them to its rows and counts, in one transaction.

    The lines are numbered on from the file's stored lines, and the reader gets the state the last
    read left (`files.resume_state`) and the format version it found. The file's run metadata must come out as a whole read would
    give it: when the new lines give a value that differs from the one the file gave before (a
    restarted job printing other settings), the transaction is rolled back and `_ReadWhole` raised.
    """
    file_id, offset = stored.file_id, stored.bytes
    state = stored.state
    previous_meta = state.pop("meta", {})
    previous_version = state.pop("format_version", None)
    state.pop("block_sha", None)
    state.pop("sha_state", None)
    added_lines = ranges.lines - stored.lines
    with byte_range_copy(path, offset, ranges.size) as part:
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
                raise _ReadWhole(f"the appended lines change {', '.join(changed)}" if changed
                                 else "the appended lines cannot follow the lines read before")
            # A fact the grammar decides over the whole file again (`recomputed_meta`) is as this read
            # says, null included; any other fact the earlier lines gave stays.
            recomputed = set(state.get("recomputed_meta", ()))
            meta = {**previous_meta, **{k: v for k, v in ctx.run_meta.items() if v is not None or k in recomputed}}
            version = ctx.format_version or previous_version
            seconds = time.perf_counter() - started
            complete = ranges.size if ranges.complete == ranges.size else None
            con.execute(
                "UPDATE files SET sha256 = ?, bytes = ?, complete_bytes = ?, format_version = ?, lines = lines + ?,"
                " stored = stored + ?, ignored = ignored + ?, rejected = rejected + ?, rows = rows + ?,"
                " seconds = seconds + ?, resume_state = ?, ingested_at = current_timestamp WHERE file_id = ?",
                [ranges.sha, ranges.size, complete, version, ctx.lines, ctx.stored, ctx.ignored_total,
                 ctx.rejected, ctx.rows, seconds,
                 json.dumps({**ctx.resume_state, "meta": meta, "format_version": version,
                             **_growth_check(path, ranges.size, ranges.sha, complete)}, sort_keys=True),
                 file_id])
            _commit(con, ctx, run_id, ingester.framework, meta, again=True)
        except BaseException:
            _roll_back(con, ctx)
            raise
    report.status, report.bytes = "appended", ranges.size - offset
    _count(report, ctx, started)
    report.notes.insert(0, f"read from byte {offset:,} (line {stored.lines + 1:,}) on")
    return report


def _commit(con, ctx: FileContext, run_id: int, framework: str | None, meta: dict | None = None,
            again: bool = False) -> None:
    """Merge the file's run facts (`meta`, by default what this read found) into its run and commit its
    transaction; `again`: the file was read before (`merge_run_meta`)."""
    merge_run_meta(con, run_id, framework, ctx.run_meta if meta is None else meta, ctx.file_id, again)
    con.execute("COMMIT")


def _roll_back(con, ctx: FileContext) -> None:
    if ctx.in_transaction:
        rollback(con)


def _count(report: FileReport, ctx: FileContext, started: float) -> None:
    """Fill `report` with what the file's read accounted for."""
    report.lines, report.stored, report.ignored = ctx.lines, ctx.stored, ctx.ignored_total
    report.rejected, report.rows, report.notes = ctx.rejected, ctx.rows, list(ctx.notes)
    report.seconds = time.perf_counter() - started


def _changed_meta(before: dict, after: dict, recomputed: set[str]) -> list[str]:
    """Keys whose value the appended lines give differently from the file's earlier lines (keys
    `recomputed` from the whole file's stored rows may change: a whole read would change them too)."""
    return sorted(key for key, value in after.items() if key not in recomputed
                  and value is not None and before.get(key) is not None and before[key] != value)


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
                                **_growth_check(path, size, sha, complete_bytes)}, sort_keys=True)
        con.execute(
            "INSERT INTO files (file_id, run_id, path, sha256, bytes, format, format_version, parser_version,"
            " read_options, lines, stored, ignored, rejected, rows, seconds, complete_bytes, resume_state)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [file_id, run_id, path_text(path), sha, size, ingester.name, ctx.format_version, ingester.version,
             options, ctx.lines, ctx.stored, ctx.ignored_total, ctx.rejected, ctx.rows, seconds, complete_bytes,
             state],
        )
        _commit(con, ctx, run_id, ingester.framework, again=existing is not None)
    except BaseException:
        _roll_back(con, ctx)
        raise
    _count(report, ctx, started)
    return report


def ingest_paths(
    con: duckdb.DuckDBPyConnection,
    paths: Iterable[str | Path],
    *,
    run_name: str | None = None,
    task: str | None = None,
    format_name: str | None = None,
    on_file: Callable[[FileReport], None] | None = None,
    hashes: FileHashes | None = None,
    batch: bool = True,
    complete_lines: bool = False,
) -> list[FileReport]:
    """Ingest every file under `paths`; return one report per file seen.

    A file that cannot be read is an error, whether named or met while walking a folder; a file
    met in a folder whose format is unknown is skipped and reported as such. A file rejected as a
    whole (unknown format when named, binary, damaged archive, a format's whole-file error) is
    stored with its reason once every file is read, under its run if that run exists: a failure
    never creates a run. One bad file never stops the others.
    `hashes` may already hold (or be computing) files' hashes; by default each file is hashed as
    it is loaded. With `batch` (the default), small step files are read in batches (see the module
    docstring); the store ends the same either way. With `complete_lines` (logs still being
    written), a log of an appendable format is read up to its last newline (`ingest_file`).
    """
    if hashes is None:
        with FileHashes() as own:
            return ingest_paths(con, paths, run_name=run_name, task=task, format_name=format_name,
                                on_file=on_file, hashes=own, batch=batch, complete_lines=complete_lines)
    forced = None
    if format_name:
        forced = get_ingester(format_name)
        if forced is None:
            raise PolytraceError(f"unknown format {format_name!r}; see `polytrace formats`")
    resolver = RunResolver(con, run_name, task)
    reports: list[FileReport] = []
    failed_whole: list[WholeFileFailure] = []

    def done(report: FileReport) -> None:
        reports.append(report)
        if on_file:
            on_file(report)

    def load_alone(member: _BatchMember) -> None:
        done(ingest_one(con, member.path, member.explicit, None, forced, resolver, hashes, failed_whole,
                        complete_lines))

    pending: list[_BatchMember] = []
    pending_bytes = 0
    for path, explicit, problem in walk(paths):
        member = _batch_member(path, explicit, forced, hashes) if batch and not problem else None
        if member and pending and (member.ingester is not pending[0].ingester or len(pending) >= BATCH_MAX_FILES
                                   or pending_bytes + member.size > BATCH_MAX_BYTES):
            _ingest_batch(con, pending, resolver, hashes, done, load_alone)
            pending, pending_bytes = [], 0
        if member:
            pending.append(member)
            pending_bytes += member.size
            continue
        if pending:
            _ingest_batch(con, pending, resolver, hashes, done, load_alone)
            pending, pending_bytes = [], 0
        done(ingest_one(con, path, explicit, problem, forced, resolver, hashes, failed_whole, complete_lines))
    if pending:
        _ingest_batch(con, pending, resolver, hashes, done, load_alone)
    record_failures(con, resolver, failed_whole)
    decide_semantics(con, reports)
    return reports


def decide_semantics(con: duckdb.DuckDBPyConnection, reports: list[FileReport]) -> None:
    """The end-of-ingest hook: decide again the semantics record of every run a file was added to,
    replaced in, or grew in (`store.semantics`), and of every run whose record is missing or older
    than its files (an ingest killed before this hook ran)."""
    from polytrace_cli.store.semantics import decide_runs, runs_without_current_record

    names = sorted({report.run for report in reports if report.run and report.status in ("ingested", "replaced", "appended", "truncated")})
    run_ids = set(runs_without_current_record(con))
    if names:
        rows = con.execute("SELECT run_id FROM runs WHERE name IN (SELECT unnest(?))", [names]).fetchall()
        run_ids |= {row[0] for row in rows}
    if run_ids:
        decide_runs(con, sorted(run_ids))


# A batch holds files of at most BATCH_FILE_MAX_BYTES each, up to BATCH_MAX_FILES files or
# BATCH_MAX_BYTES in all; a larger file is read alone (one file already makes a bulk read).
BATCH_FILE_MAX_BYTES = 4 << 20
BATCH_MAX_FILES = 10_000
BATCH_MAX_BYTES = 128 << 20
# A batch whose files hold this many bytes on average is read as JSON records, fewer as text lines.
BATCH_JSON_MIN_MEAN_BYTES = 64 << 10
# The text of a file this small is kept from sniffing for the batch read (DuckDB need not open it).
BATCH_TEXT_KEEP_BYTES = 64 << 10
# A batch of fewer bytes is decoded strictly before DuckDB reads it, not beside: the read is then
# skipped when the decoder refuses too many of its files, which costs more than the overlap saves.
BATCH_OVERLAP_MIN_BYTES = 8 << 20
# A batch whose read fails (a line that does not parse, in a file unknown) is split in halves
# until this many files remain, which are then read one by one.
BATCH_SPLIT_MIN_FILES = 4


@dataclass
class _BatchMember:
    """A file that may be read in a batch: plain, small, UTF-8-named, of a bulk JSON-lines format."""

    path: Path
    explicit: bool
    ingester: BulkJsonlIngester
    size: int
    text: str | None = None  # a small file's text, kept from sniffing and hashing for the batch read
    run_id: int = 0
    run: str = ""
    file_id: int = 0
    existing: int | None = None


def _batch_member(path: Path, explicit: bool, forced: Ingester | None, hashes: FileHashes) -> _BatchMember | None:
    if is_compressed(path) or path_text(path) != str(path):
        return None
    try:
        size = path.stat().st_size
        if not 0 < size <= BATCH_FILE_MAX_BYTES:
            return None
        with open(path, "rb") as handle:
            head = handle.read(SNIFF_BYTES)
            ingester = forced or detect(path, head)
            if not isinstance(ingester, BulkJsonlIngester):
                return None
            if size <= BATCH_TEXT_KEEP_BYTES and len(head) == SNIFF_BYTES:
                # small: read once for sniffing, hashing and counting lines (a shorter head ended the file)
                head += handle.read()
    except OSError:
        return None  # loaded alone, which reports why it cannot be read
    resolved = path.resolve() if explicit else path  # `walk` resolves the files it finds in folders
    if size > BATCH_TEXT_KEEP_BYTES:
        # The hashing thread reads and hashes it while this one sniffs the next file.
        hashes.of_resolved(resolved)
        return _BatchMember(resolved, explicit, ingester, size)
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return None  # loaded alone, which names the line that is not UTF-8 text
    if "\0" in text:
        return None
    hashes.known(resolved, hash_and_count_bytes(head))  # handing a tiny file to the thread costs more
    return _BatchMember(resolved, explicit, ingester, len(head), text)


def _ingest_batch(con: duckdb.DuckDBPyConnection, members: list[_BatchMember], resolver: RunResolver,
                  hashes: FileHashes, done: Callable[[FileReport], None],
                  load_alone: Callable[[_BatchMember], None]) -> None:
    """Store `members` in one read and one transaction; files it cannot take are loaded alone.

    Unchanged files are reported as such first. A file with a bad line, or every file of a batch
    whose transaction fails, is loaded alone; a batch whose read fails is split in halves. A format
    whose records are rows of one table (`row_table`) is read straight into it (`_store_batch_direct`);
    when that read fails beside the strict decoder (a line that is not JSON), the files the decoder
    accepted are read so again, unless more than a quarter were refused.
    """
    if len(members) == 1:
        load_alone(members[0])
        return
    started = time.perf_counter()
    ingester = members[0].ingester
    for member in members:
        member.run_id, member.run = resolver.resolve(member.path, ingester.framework, resolved=True)
    changed, unchanged = _drop_unchanged(con, members, hashes)
    for member in unchanged:
        done(FileReport(path=path_text(member.path), status="unchanged", format=ingester.name, run=member.run,
                        bytes=member.size))
    if not changed:
        return
    batch_bytes = sum(m.size for m in changed)
    whole_json = batch_bytes >= BATCH_JSON_MIN_MEAN_BYTES * len(changed)
    paths = [str(m.path) for m in changed]
    with ThreadPoolExecutor(max_workers=1) as decoding:
        if not whole_json:
            strict = None
        elif batch_bytes < BATCH_OVERLAP_MIN_BYTES:
            strict = _strict_counts([m.path for m in changed], ingester.spec)
        else:
            # The strict decoder (which holds the interpreter) runs while DuckDB reads the files (which does not).
            strict = decoding.submit(_strict_counts, [m.path for m in changed], ingester.spec).result
        if whole_json and ingester.row_table is not None:
            try:
                stored, tried = None, False
                if callable(strict):
                    stored, tried = _store_batch_direct(con, changed, ingester, hashes, strict, started), True
                    strict = strict()
                left_out = set(refused(paths, strict))
                accepted = [m for m in changed if str(m.path) not in left_out]
                if stored is None and few_refused(paths, strict) and len(accepted) > 1 and not (tried and not left_out):
                    # The files the decoder refused (a line that is not JSON fails the typed read) are read alone.
                    stored = _store_batch_direct(con, accepted, ingester, hashes, strict, started)
                    stored = None if stored is None else (stored[0], stored[1] | left_out)
            except Exception:
                stored = {}, set(paths)  # every file is loaded alone
            except BaseException:
                _drop_runs_left_empty(resolver, members)
                raise
            if stored is not None:
                reports, bad = stored
                for member in changed:
                    if str(member.path) in bad:
                        load_alone(member)
                    else:
                        done(reports[member.file_id])
                return
        try:
            read = load_batch_records(con, paths, ingester.spec, ingester.required,
                                      ingester.checks, whole_json=whole_json,
                                      texts={str(m.path): m.text for m in changed if m.text is not None},
                                      strict_counts=strict)
        except duckdb.Error:
            read = None  # handled like a read that fails: the batch is split
    if read is None:
        if len(changed) <= BATCH_SPLIT_MIN_FILES:
            for member in changed:
                load_alone(member)
            return
        half = len(changed) // 2
        _ingest_batch(con, changed[:half], resolver, hashes, done, load_alone)
        _ingest_batch(con, changed[half:], resolver, hashes, done, load_alone)
        return
    bad, line_counts = read
    uncounted = _uncounted(changed, bad, line_counts, hashes)
    if uncounted:
        delete_records_of(con, uncounted)
        bad |= uncounted
    clean = [m for m in changed if str(m.path) not in bad]
    try:
        reports = _store_batch(con, clean, ingester, hashes, line_counts, started) if len(clean) > 1 else None
    except Exception:
        reports = None
    except BaseException:
        _drop_runs_left_empty(resolver, members)
        raise
    if reports is None:
        for member in changed:
            load_alone(member)
        return
    for member in changed:
        if str(member.path) in bad:
            load_alone(member)
        else:
            done(reports[member.file_id])


def _drop_runs_left_empty(resolver: RunResolver, members: list[_BatchMember]) -> None:
    """The command stops (interrupt, full disk): leave no run that only this batch created."""
    for run_id in {m.run_id for m in members}:
        try:
            resolver.drop_if_empty(run_id)
        except Exception:
            pass


def _uncounted(members: list[_BatchMember], bad: set[str], line_counts: dict[str, tuple[int, int]],
               hashes: FileHashes) -> set[str]:
    """The files, not already `bad`, whose lines as read (`line_counts`: lines, blank lines) are not
    the lines counted by hashing. Read as JSON records, a file's blank lines were skipped unseen: they
    are counted here (and set in `line_counts`), and a file whose lines still do not add up is read alone."""
    uncounted = set()
    for member in members:
        name = str(member.path)
        if name in bad:
            continue  # read alone, which hashes it then
        lines = hashes.result(member.path)[2]
        read_lines, blank = line_counts.get(name, (0, 0))
        if read_lines == lines:
            continue
        blank = _blank_lines(member.path)
        if blank is not None and read_lines + blank == lines:
            line_counts[name] = (lines, blank)
        else:
            uncounted.add(name)
    return uncounted


def _strict_counts(paths: list[Path], spec: dict) -> dict[str, int | None]:
    """`strict_file_records` of each file, by its name as DuckDB reports it."""
    return {str(path): strict_file_records(path, spec) for path in paths}


def _blank_lines(path: Path) -> int | None:
    """How many lines of a small file hold only white space, or None when it cannot be read again."""
    try:
        with open(path, "rb") as handle:
            return sum(1 for line in handle if not line.strip())
    except OSError:
        return None


def _drop_unchanged(con: duckdb.DuckDBPyConnection, members: list[_BatchMember],
                    hashes: FileHashes) -> tuple[list[_BatchMember], list[_BatchMember]]:
    """(changed or new, unchanged) members: a file the store holds read the same way (format, parser
    version, options, size) with the same sha256 is unchanged and is not read again. Notes each
    member's previous `file_id`, if any."""
    known = stored_files(con, [(m.run_id, path_text(m.path)) for m in members])
    changed, unchanged = [], []
    for member in members:
        stored = known.get((member.run_id, path_text(member.path)))
        member.existing = stored.file_id if stored else None
        same = is_unchanged(stored, member.ingester, member.size, lambda m=member: hashes.result(m.path)[0])
        (unchanged if same else changed).append(member)
    return changed, unchanged


def _store_batch(con: duckdb.DuckDBPyConnection, members: list[_BatchMember], ingester: BulkJsonlIngester,
                 hashes: FileHashes, line_counts: dict[str, tuple[int, int]], started: float) -> dict[int, FileReport]:
    """Write every member's rows, `files` row, ignored lines and run metadata in one transaction.

    `records` holds the members' records with their `file_index` (`record_files` names them); `line_counts` each file's lines
    and blank lines as the batch read them, which must agree with the lines counted by hashing
    and the records stored (else nothing is written and the files are loaded alone). A file's
    `seconds` is its share, by bytes, of the batch's time.
    """
    _number_files(con, members, ingester)
    con.execute("CREATE OR REPLACE TEMP TABLE batch_keys AS SELECT r.file_index, f.file_id, f.run_id, f.file_rank"
                " FROM record_files r JOIN batch_files f USING (filename)")
    con.execute("CREATE OR REPLACE TEMP VIEW keyed AS SELECT f.file_id, f.run_id, f.file_rank,"
                " r.* EXCLUDE (file_index) FROM records r JOIN batch_keys f USING (file_index)")
    stored = dict(con.execute("SELECT f.file_id, count(*) FROM records r JOIN batch_keys f USING (file_index)"
                              " GROUP BY f.file_id").fetchall())
    with _batch_transaction(con, ("batch_keys", "batch_files", "records", "record_files")):
        _delete_replaced(con, members)
        ingester.write(con)
        reports = _record_batch_files(con, members, ingester, hashes, line_counts, stored, started)
        con.execute("COMMIT")
    return reports


@contextmanager
def _batch_transaction(con: duckdb.DuckDBPyConnection, temp_tables: tuple[str, ...]) -> Iterator[None]:
    """A batch's transaction, begun here and ended by the caller (COMMIT or `rollback`), or rolled back
    here when the caller raises; the view `keyed` and `temp_tables` are dropped after it either way."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield
    except BaseException:
        rollback(con)
        raise
    finally:
        con.execute("DROP VIEW IF EXISTS keyed")
        for table in temp_tables:
            con.execute(f"DROP TABLE IF EXISTS {table}")


def _number_files(con: duckdb.DuckDBPyConnection, members: list[_BatchMember], ingester: BulkJsonlIngester) -> None:
    """Give each member a new `file_id`; temp table `batch_files`: each member's filename (as DuckDB
    reports it), its `file_index` (its position in `members`), file_id, run_id and file_rank."""
    ids = fetch_first(con, "SELECT list(id ORDER BY id) FROM (SELECT nextval('file_id_seq') AS id FROM range(?))",
                      [len(members)])[0]
    for member, file_id in zip(members, ids):
        member.file_id = file_id
    con.execute(
        "CREATE OR REPLACE TEMP TABLE batch_files AS SELECT unnest(?::VARCHAR[]) AS filename,"
        " (unnest(range(?)))::UBIGINT AS file_index, unnest(?::BIGINT[]) AS file_id, unnest(?::BIGINT[]) AS run_id,"
        " unnest(?::INTEGER[]) AS file_rank",
        [[str(m.path) for m in members], len(members), [m.file_id for m in members], [m.run_id for m in members],
         [ingester.file_rank(m.path) for m in members]])


def _delete_replaced(con: duckdb.DuckDBPyConnection, members: list[_BatchMember]) -> None:
    """Remove what the stored earlier versions of `members` contributed (inside the batch's transaction)."""
    replaced = [m.existing for m in members if m.existing is not None]
    if replaced:
        for table in [*file_owned_tables(con), "files"]:
            con.execute(f"DELETE FROM {table} WHERE file_id IN (SELECT unnest(?))", [replaced])


def _record_batch_files(con: duckdb.DuckDBPyConnection, members: list[_BatchMember], ingester: BulkJsonlIngester,
                        hashes: FileHashes, line_counts: dict[str, tuple[int, int]], stored: dict[int, int],
                        started: float) -> dict[int, FileReport]:
    """Inside the batch's transaction, once the members' rows are written (`keyed` shows them):
    every member's `files` row, ignored lines and run metadata; the members' reports by file_id.
    Raises when a member's lines counted by hashing are not its lines read, or not its records
    (`stored`, by file_id) and blank lines."""
    hashed = {m.file_id: hashes.result(m.path) for m in members}
    total_bytes = sum(m.size for m in members)
    summaries = ingester.summaries(con)
    seconds = time.perf_counter() - started
    files, ignored, reports, run_meta, file_metas = [], [], {}, {}, []
    for member in members:
        sha, size, lines = hashed[member.file_id]
        records = stored.get(member.file_id, 0)
        read_lines, blank = line_counts.get(str(member.path), (0, 0))
        if (lines, lines) != (read_lines, records + blank) or size != member.size:
            raise RuntimeError(f"{ingester.name} lost lines in {member.path}: {lines} counted, {read_lines} read,"
                               f" {records} stored, {blank} blank")
        rows, meta = summaries.get(member.file_id, (0, dict(ingester.meta_without_records)))
        share = seconds * size / total_bytes if total_bytes else 0.0
        files.append((member.file_id, member.run_id, path_text(member.path), sha, size, ingester.name, None,
                      ingester.version, ingester.read_options(), lines, records, blank, 0, rows, share))
        if blank:
            ignored.append((member.file_id, "blank line", blank))
        fold_meta(run_meta.setdefault(member.run_id, {}), meta)
        file_metas.append((member.file_id, member.run_id, json.dumps(meta, sort_keys=True)))
        reports[member.file_id] = FileReport(
            path=path_text(member.path), status="replaced" if member.existing is not None else "ingested",
            format=ingester.name, run=member.run, bytes=size, lines=lines, stored=records, ignored=blank,
            rows=rows, seconds=share)
    columns = ["file_id", "run_id", "path", "sha256", "bytes", "format", "format_version", "parser_version",
               "read_options", "lines", "stored", "ignored", "rejected", "rows", "seconds"]
    _insert_rows(con, "files", columns, files)
    if ignored:
        _insert_rows(con, "ignored_lines", ["file_id", "rule", "lines"], ignored)
    _insert_rows(con, "file_run_meta", ["file_id", "run_id", "meta"], file_metas)
    again = {m.run_id for m in members if m.existing is not None}
    for run_id, meta in run_meta.items():
        merge_run_meta(con, run_id, ingester.framework, meta, again=run_id in again)
    return reports


def _store_batch_direct(con: duckdb.DuckDBPyConnection, members: list[_BatchMember], ingester: BulkJsonlIngester,
                        hashes: FileHashes, strict: Callable[[], dict] | dict, started: float,
                        ) -> tuple[dict[int, FileReport], set[str]] | None:
    """Read the members straight into the ingester's `row_table` and store them in one transaction,
    as `_store_batch` stores them from `records`; (reports by file_id, the files left to be read
    alone), or None, with nothing written, when the batch must be read the other way
    (`load_batch_records`): DuckDB cannot read it typed, or the strict decoder (`strict`, its counts
    or a call that waits for them) refused more than a quarter of its files.

    The rows of a file are kept only when the strict decoder accepted every value of it, its rows
    are as many as the records the decoder counted (a record missing a required field is not
    inserted), no row fails one of the format's checks, and its lines counted by hashing are its
    records and blank lines; the other files' rows are deleted again before the commit and those
    files are left to be read alone, which names each bad line.
    """
    paths = [str(m.path) for m in members]
    _number_files(con, members, ingester)
    with _batch_transaction(con, ("batch_files",)):
        try:
            insert_typed_rows(con, paths, ingester)
        except duckdb.Error:
            rollback(con)
            return None
        known = strict if isinstance(strict, dict) else strict()
        if not few_refused(paths, known):
            rollback(con)
            return None
        create_stored_keyed(con, ingester)
        counts = stored_counts(con, ingester.checks)
        bad = set(refused(paths, known))
        for member in members:
            records, failing = counts.get(member.file_id, (0, 0))
            if failing or records != known.get(str(member.path)):
                bad.add(str(member.path))
        line_counts = {str(m.path): (counts.get(m.file_id, (0, 0))[0], 0) for m in members}
        bad |= _uncounted(members, bad, line_counts, hashes)
        clean = [m for m in members if str(m.path) not in bad]
        if bad:
            con.execute(f"DELETE FROM {ingester.row_table} WHERE file_id IN (SELECT unnest(?::BIGINT[]))",
                        [[m.file_id for m in members if str(m.path) in bad]])
        if not clean:
            rollback(con)
            return {}, bad
        _delete_replaced(con, clean)
        reports = _record_batch_files(con, clean, ingester, hashes, line_counts,
                                      {m.file_id: counts[m.file_id][0] for m in clean if m.file_id in counts}, started)
        con.execute("COMMIT")
    return reports, bad


def _insert_rows(con: duckdb.DuckDBPyConnection, table: str, columns: list[str], rows: list[tuple]) -> None:
    """Insert many rows in one statement (each column passed as one list), typed by the table's columns."""
    names = ", ".join(columns)
    unnested = ", ".join(f"unnest(?) AS {name}" for name in columns)
    con.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM (SELECT {unnested})",
                [[row[index] for row in rows] for index in range(len(columns))])


@dataclass
class WholeFileFailure:
    """A file rejected as a whole, recorded once every file has been read (see `record_failures`)."""

    path: Path
    sha: str
    size: int
    lines: int
    format: str
    reason: str
    code: str
    report: FileReport


def record_failures(con: duckdb.DuckDBPyConnection, resolver: RunResolver, failures: list[WholeFileFailure]) -> None:
    """Store each file rejected whole under its run, when that run exists (other files of it were
    stored); a failure never creates a run, so such a file is only reported."""
    for failure in failures:
        run = resolver.existing(failure.path)
        if run is None:
            failure.report.notes.append("not stored: its run holds no other file")
            continue
        _record_whole_file_rejection(con, run[0], failure.path.resolve(), failure.sha, failure.size, failure.lines,
                                     failure.format, failure.reason, failure.code)
        failure.report.run = run[1]


def ingest_one(con, path: Path, explicit: bool, problem: str | None, forced: Ingester | None,
               resolver: RunResolver, hashes: FileHashes, failed_whole: list[WholeFileFailure],
               complete_lines: bool = False) -> FileReport:
    """Load one file as `ingest_paths` does outside a batch: `problem` (from `walk`) makes it an error,
    an unknown format skips it (rejects it when `explicit`), a whole-file rejection is appended to
    `failed_whole` for `record_failures`, and a run that only this file created is dropped if it fails."""
    shown = path_text(path)
    if problem:
        return FileReport(path=shown, status="skipped" if isinstance(problem, Skip) else "error", message=problem)
    try:
        with readable(path) as source:
            return _ingest_source(con, path, source, explicit, forced, resolver, hashes, failed_whole,
                                  complete_lines)
    except UnreadableFile as error:
        return FileReport(path=shown, status="error", message=f"cannot read: {error}")
    except CorruptFile as error:
        return _reject_whole(path, None, "unknown", str(error), "corrupt-file", hashes, failed_whole)


def _reject_whole(path: Path, source: Readable | None, fmt: str, reason: str, code: str, hashes: FileHashes,
                  failed_whole: list[WholeFileFailure]) -> FileReport:
    sha, size, lines = hashes.result(path)
    if source is not None and source.rewritten:
        lines = hashes.result(source.path)[2]
    elif source is None and code == "corrupt-file":
        lines = 0  # the text of a damaged archive cannot be counted
    return reject_whole_file(path, fmt, reason, code, sha, size, lines, failed_whole)


def reject_whole_file(path: Path, fmt: str, reason: str, code: str, sha: str, size: int, lines: int,
                      failed_whole: list[WholeFileFailure]) -> FileReport:
    """The report of a file rejected as a whole (all its `lines` rejected); the failure is appended to
    `failed_whole`, for `record_failures` once every file is read."""
    report = FileReport(path=path_text(path), status="rejected", format=None if fmt == "unknown" else fmt,
                        bytes=size, lines=lines, rejected=lines, message=reason)
    failed_whole.append(WholeFileFailure(path, sha, size, lines, fmt, reason, code, report))
    return report


def skip_reason(name_path: Path, head: bytes, binary: bool) -> str:
    """Why a file met in a folder was not read: empty, binary, or no record of a known format."""
    if not head:
        return "empty file"
    if binary:
        return "binary file of unknown format"
    if is_log_like(name_path):
        return f"log of unknown format: no line of a known format in its first {DEEP_SNIFF_BYTES >> 20} MB"
    return "unknown format"


def _ingest_source(con, path: Path, source: Readable, explicit: bool, forced: Ingester | None,
                   resolver: RunResolver, hashes: FileHashes, failed_whole: list[WholeFileFailure],
                   complete_lines: bool = False) -> FileReport:
    shown = path_text(path)
    try:
        head = read_head(source.path)
    except OSError as error:
        return FileReport(path=shown, status="error", message=f"cannot read: {error.strerror or error}")
    ingester = forced or detect_deep(source.name_path, source.path, head)
    if ingester is None:
        binary = bool(head) and is_binary(head)
        if not explicit:
            return FileReport(path=shown, status="skipped", message=skip_reason(source.name_path, head, binary))
        reason = "empty file of unknown format" if not head else (
            "binary file of unknown format" if binary else "unknown format (use --format to name it)")
        return _reject_whole(path, source, "unknown", reason, "binary-file" if binary else "unknown-format", hashes,
                             failed_whole)
    run_id, run = resolver.resolve(path, ingester.framework)
    try:
        return ingest_file(con, path, ingester, run_id, run, head, hashes, source, complete_lines)
    except IngestError as error:
        resolver.drop_if_empty(run_id)
        return _reject_whole(path, source, ingester.name, str(error), error.code, hashes, failed_whole)
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise
        resolver.drop_if_empty(run_id)
        return FileReport(path=shown, status="error", format=ingester.name,
                          message=f"cannot read: {error.strerror or error}")
    except Exception as error:
        if isinstance(error, duckdb.Error) and stops_the_store(error):
            raise
        # Anything else this file raised (it should not) is this file's failure, not the command's.
        resolver.drop_if_empty(run_id)
        text = str(error).strip()
        detail = f"{type(error).__name__}: {text.splitlines()[0][:200]}" if text else type(error).__name__
        return FileReport(path=shown, status="error", format=ingester.name, message=f"could not be read: {detail}")
    except BaseException:
        # The command stops (interrupt, full disk, a bug): leave no run that only this file created.
        try:
            resolver.drop_if_empty(run_id)
        except Exception:
            pass
        raise
