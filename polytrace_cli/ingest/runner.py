"""Walking paths, grouping files into runs and loading each file in its own transaction."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from polytrace_cli.errors import IngestError, PolytraceError
from polytrace_cli.ingest.base import FileContext, Ingester, file_owned_tables
from polytrace_cli.ingest.files import CorruptFile, FileHashes, Readable, UnreadableFile, path_text, readable, walk
from polytrace_cli.ingest.registry import detect, get_ingester, is_binary, read_head
from polytrace_cli.ingest.run_metadata import NULL_MEANS_CANNOT_TELL
from polytrace_cli.store.connection import fetch_first

# Folder names that say what a folder holds rather than which run it is.
GENERIC_FOLDERS = {
    "profile", "packed_length_log", "multiturn_workload_log", "logs", "log", "files", "media",
    "table", "tables", "output", "outputs", "rollout_data", "validation_data", "rollout_data_dir",
    "validation_data_dir", "tensorboard", "tensorboard_log", "tb", "events", "runs", "wandb",
}
_TIMESTAMP_LIKE = re.compile(r"[\d_\-.:T]+")


@dataclass
class FileReport:
    """What happened to one input file."""

    path: str
    status: str  # ingested, replaced, unchanged, rejected, skipped, error
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


def derive_run(file: Path) -> tuple[str, Path]:
    """A run's name and root folder from a file's location.

    Walks up from the file's folder past generic names (`files`, `profile`, `logs`, ...) and
    timestamp folders; the first other folder names the run. The deepest timestamp folder passed
    on the way, if any, is the run's root, so two timestamped runs under one folder stay apart.
    Files under a `media` folder (wandb's `files/media/table/<key>/...`) belong to the folder that
    holds `media`: the key folders below it name a logged key, not a run.
    """
    folder = file.resolve().parent
    media = next((current for current in (folder, *folder.parents) if current.name.lower() == "media"), None)
    if media is not None:
        folder = media.parent
    timestamp_root = None
    for current in (folder, *folder.parents):
        name = current.name
        if not name:
            break
        if _TIMESTAMP_LIKE.fullmatch(name):
            timestamp_root = timestamp_root or current
            continue
        if name.lower() in GENERIC_FOLDERS:
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

    def _identity(self, file: Path) -> tuple[str, str, Path | None]:
        name, root = derive_run(file)
        if self.run_name:
            return self.run_name, path_text(root), None
        return path_text(name), path_text(root), root

    def resolve(self, file: Path, framework: str | None) -> tuple[int, str]:
        name, source_dir, key = self._identity(file)
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


def _merge_run_meta(con: duckdb.DuckDBPyConnection, run_id: int, framework: str | None, meta: dict) -> None:
    current_framework, current_meta = fetch_first(con, 
        "SELECT framework, meta FROM runs WHERE run_id = ?", [run_id]
    )
    merged = json.loads(current_meta or "{}")
    merged.update({k: v for k, v in meta.items() if v is not None})
    for key in NULL_MEANS_CANNOT_TELL & {k for k, v in meta.items() if v is None}:
        merged.setdefault(key, None)  # undecided is stored as null; a decided value stays
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
        con.execute("ROLLBACK")
        raise


def ingest_file(
    con: duckdb.DuckDBPyConnection, path: Path, ingester: Ingester, run_id: int, run_name: str, head: bytes,
    hashes: FileHashes, source: Readable | None = None,
) -> FileReport:
    """Load one file in one transaction; a file read before the same way (same sha256, format, parser
    version and row-changing options) is skipped.

    `path` is the input file as given (its path and sha256 are its provenance); `source` what the
    ingester reads (the decompressed text of a compressed file), by default `path` itself. A new or
    changed file is hashed in `hashes`' thread while DuckDB parses it (hashlib releases the GIL).
    """
    path = path.resolve()
    source = source or Readable(path, path, False)
    started = time.perf_counter()
    existing = fetch_first(
        con, "SELECT file_id, sha256, format, parser_version, read_options, bytes FROM files"
        " WHERE run_id = ? AND path = ?",
        [run_id, path_text(path)],
    )
    options = ingester.read_options()
    report = FileReport(path=path_text(path), status="ingested", format=ingester.name, run=run_name,
                        bytes=path.stat().st_size)
    if existing and tuple(existing[2:]) == (ingester.name, ingester.version, options, report.bytes):
        sha, _, _ = hashes.result(path)
        if existing[1] == sha:
            report.status = "unchanged"
            report.seconds = time.perf_counter() - started
            return report
    file_id = fetch_first(con, "SELECT nextval('file_id_seq')")[0]
    counting = hashes.future(source.path) if source.compressed else None
    return _load_in_transaction(con, path, source, ingester, run_id, run_name, head, file_id, existing,
                                hashes.future(path), counting, report, started, options)


def _load_in_transaction(con, path, source, ingester, run_id, run_name, head, file_id, existing, hashing, counting,
                         report, started, options) -> FileReport:
    def replace_previous_version() -> None:
        if existing:
            delete_file_rows(con, existing[0])
            report.status = "replaced"

    # Lines are counted on the text the ingester reads; the hash is of the input file's bytes.
    ctx = FileContext(con=con, path=source.path, run_id=run_id, file_id=file_id, run_name=run_name,
                      head=head, line_count=counting or hashing, on_begin=replace_previous_version)
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
        con.execute(
            "INSERT INTO files (file_id, run_id, path, sha256, bytes, format, format_version, parser_version,"
            " read_options, lines, stored, ignored, rejected, rows, seconds)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [file_id, run_id, path_text(path), sha, size, ingester.name, ctx.format_version, ingester.version,
             options, ctx.lines, ctx.stored, ctx.ignored_total, ctx.rejected, ctx.rows, seconds],
        )
        _merge_run_meta(con, run_id, ingester.framework, ctx.run_meta)
        con.execute("COMMIT")
    except BaseException:
        if ctx.in_transaction:
            con.execute("ROLLBACK")
        raise
    report.lines, report.stored, report.ignored = ctx.lines, ctx.stored, ctx.ignored_total
    report.rejected, report.rows, report.notes = ctx.rejected, ctx.rows, ctx.notes
    report.seconds = time.perf_counter() - started
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
) -> list[FileReport]:
    """Ingest every file under `paths`; return one report per file seen.

    A file that cannot be read is an error, whether named or met while walking a folder; a file
    met in a folder whose format is unknown is skipped and reported as such. A file rejected as a
    whole (unknown format when named, binary, damaged archive, a format's whole-file error) is
    stored with its reason once every file is read, under its run if that run exists: a failure
    never creates a run. One bad file never stops the others.
    `hashes` may already hold (or be computing) files' hashes; by default each file is hashed as
    it is loaded.
    """
    if hashes is None:
        with FileHashes() as own:
            return ingest_paths(con, paths, run_name=run_name, task=task, format_name=format_name,
                                on_file=on_file, hashes=own)
    forced = None
    if format_name:
        forced = get_ingester(format_name)
        if forced is None:
            raise PolytraceError(f"unknown format {format_name!r}; see `polytrace formats`")
    resolver = RunResolver(con, run_name, task)
    reports: list[FileReport] = []
    failed_whole: list[_WholeFileFailure] = []
    for path, explicit, problem in walk(paths):
        report = _ingest_one(con, path, explicit, problem, forced, resolver, hashes, failed_whole)
        reports.append(report)
        if on_file:
            on_file(report)
    _record_failures(con, resolver, failed_whole)
    return reports


@dataclass
class _WholeFileFailure:
    """A file rejected as a whole, recorded once every file has been read (see `_record_failures`)."""

    path: Path
    sha: str
    size: int
    lines: int
    format: str
    reason: str
    code: str
    report: FileReport


def _record_failures(con: duckdb.DuckDBPyConnection, resolver: RunResolver, failures: list[_WholeFileFailure]) -> None:
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


def _ingest_one(con, path: Path, explicit: bool, problem: str | None, forced: Ingester | None,
                resolver: RunResolver, hashes: FileHashes, failed_whole: list[_WholeFileFailure]) -> FileReport:
    shown = path_text(path)
    if problem:
        return FileReport(path=shown, status="error", message=problem)
    try:
        with readable(path) as source:
            return _ingest_source(con, path, source, explicit, forced, resolver, hashes, failed_whole)
    except UnreadableFile as error:
        return FileReport(path=shown, status="error", message=f"cannot read: {error}")
    except CorruptFile as error:
        return _reject_whole(path, None, "unknown", str(error), "corrupt-file", hashes, failed_whole)


def _reject_whole(path: Path, source: Readable | None, fmt: str, reason: str, code: str, hashes: FileHashes,
                  failed_whole: list[_WholeFileFailure]) -> FileReport:
    sha, size, lines = hashes.result(path)
    if source is not None and source.compressed:
        lines = hashes.result(source.path)[2]
    elif source is None and code == "corrupt-file":
        lines = 0  # the text of a damaged archive cannot be counted
    report = FileReport(path=path_text(path), status="rejected", format=None if fmt == "unknown" else fmt,
                        bytes=size, lines=lines, rejected=lines, message=reason)
    failed_whole.append(_WholeFileFailure(path, sha, size, lines, fmt, reason, code, report))
    return report


def _ingest_source(con, path: Path, source: Readable, explicit: bool, forced: Ingester | None,
                   resolver: RunResolver, hashes: FileHashes, failed_whole: list[_WholeFileFailure]) -> FileReport:
    shown = path_text(path)
    try:
        head = read_head(source.path)
    except OSError as error:
        return FileReport(path=shown, status="error", message=f"cannot read: {error.strerror or error}")
    ingester = forced or detect(source.name_path, head)
    if ingester is None:
        if not explicit:
            return FileReport(path=shown, status="skipped", message="unknown format")
        binary = bool(head) and is_binary(head)
        reason = "empty file of unknown format" if not head else (
            "binary file of unknown format" if binary else "unknown format (use --format to name it)")
        return _reject_whole(path, source, "unknown", reason, "binary-file" if binary else "unknown-format", hashes,
                             failed_whole)
    run_id, run = resolver.resolve(path, ingester.framework)
    try:
        return ingest_file(con, path, ingester, run_id, run, head, hashes, source)
    except IngestError as error:
        resolver.drop_if_empty(run_id)
        return _reject_whole(path, source, ingester.name, str(error), error.code, hashes, failed_whole)
    except OSError as error:
        resolver.drop_if_empty(run_id)
        return FileReport(path=shown, status="error", format=ingester.name,
                          message=f"cannot read: {error.strerror or error}")
    except BaseException:
        # The command stops (interrupt, full disk, a bug): leave no run that only this file created.
        try:
            resolver.drop_if_empty(run_id)
        except Exception:
            pass
        raise
