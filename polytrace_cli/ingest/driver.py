"""Walking paths and ingesting every file found: the one loop over files of both engines (`ingest_paths`:
local, or with the parsing on Ray), sending small step files to the batch path (`batch`), each other file
to its own transaction (`runner.ingest_file`) or to the remote engine, and deciding the semantics of the
runs that changed at the end.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import duckdb

from polytrace_cli.errors import ErrorCode, IngestError, PolytraceError
from polytrace_cli.ingest.base import Ingester
from polytrace_cli.ingest.batch import BATCH_MAX_BYTES, BATCH_MAX_FILES, BatchMember, batch_member, ingest_batch
from polytrace_cli.ingest.files import (
    CorruptFile, FileHashes, Readable, Skip, UnreadableFile, is_log_like, path_text, readable, side_file_rule, walk,
)
from polytrace_cli.ingest.ledger import FileReport, RunResolver, WholeFileFailure, record_failures, reject_whole_file
from polytrace_cli.ingest.registry import is_binary
from polytrace_cli.ingest.runner import ingest_file
from polytrace_cli.ingest.sniffing import DEEP_SNIFF_BYTES, detect_deep, get_ingester, read_head
from polytrace_cli.store.connection import stops_the_store
from polytrace_cli.store.sql import database_file


@dataclass
class PlannedFile:
    """One file of the walk, in walk order, and the path it takes: `batch` (a small step file, `member`),
    `remote` (parsed by the remote engine, `job`), `unchanged` (the store holds it read the same way,
    `ingester`) or `alone` (read in its own transaction here, `problem` from `walk`)."""

    kind: str
    path: Path
    explicit: bool = False
    problem: str | None = None
    member: BatchMember | None = None
    job: Any = None
    ingester: Ingester | None = None


class RemoteParsing(Protocol):
    """An engine that parses files elsewhere (Ray tasks: `ray_engine.RayParsing`) while the driver commits them
    in walk order."""

    def plan(self, con: duckdb.DuckDBPyConnection, index: int, path: Path, explicit: bool, problem: str | None,
             forced: Ingester | None, resolver: RunResolver, hashes: FileHashes) -> PlannedFile: ...

    def parsed_in_order(self, jobs: list) -> Iterator: ...

    def commit(self, con: duckdb.DuckDBPyConnection, resolver: RunResolver, job, parsed,
               failed_whole: list[WholeFileFailure]) -> FileReport: ...


def _local_plan(paths: Iterable[str | Path], forced: Ingester | None, hashes: FileHashes,
                batch: bool) -> Iterator[PlannedFile]:
    for path, explicit, problem in walk(paths):
        member = batch_member(path, explicit, forced, hashes) if batch and not problem else None
        if member:
            yield PlannedFile("batch", path, explicit, member=member)
        else:
            yield PlannedFile("alone", path, explicit, problem)


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
    remote: RemoteParsing | None = None,
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

    One loop for both engines: locally the walk is planned as the loop goes (a small step file joins the
    batch being gathered); with `remote` (Ray), the whole walk is planned first, the files the engine
    takes are sent to it, and the loop commits each as it arrives, in walk order, beside the files read
    here.
    """
    if hashes is None:
        with FileHashes() as own:
            return ingest_paths(con, paths, run_name=run_name, task=task, format_name=format_name,
                                on_file=on_file, hashes=own, batch=batch, complete_lines=complete_lines,
                                remote=remote)
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

    def load_alone(member: BatchMember) -> None:
        done(ingest_one(con, member.path, member.explicit, None, forced, resolver, hashes, failed_whole,
                        complete_lines))

    parsed: Iterator | None = None
    if remote is None:
        planned: Iterable[PlannedFile] = _local_plan(paths, forced, hashes, batch)
    else:
        planned = [remote.plan(con, index, path, explicit, problem, forced, resolver, hashes)
                   for index, (path, explicit, problem) in enumerate(walk(paths))]
        parsed = remote.parsed_in_order([item.job for item in planned if item.kind == "remote"])
    pending: list[BatchMember] = []
    pending_bytes = 0
    try:
        for item in planned:
            member = item.member
            if member and pending and (member.ingester is not pending[0].ingester
                                       or len(pending) >= BATCH_MAX_FILES
                                       or pending_bytes + member.size > BATCH_MAX_BYTES):
                ingest_batch(con, pending, resolver, hashes, done, load_alone)
                pending, pending_bytes = [], 0
            if member:
                pending.append(member)
                pending_bytes += member.size
                continue
            if pending:
                ingest_batch(con, pending, resolver, hashes, done, load_alone)
                pending, pending_bytes = [], 0
            if item.kind == "remote":
                done(remote.commit(con, resolver, item.job, next(parsed), failed_whole))
            elif item.kind == "unchanged":
                _, run = resolver.resolve(item.path, item.ingester.framework, resolved=True)
                done(FileReport(path=path_text(item.path), status="unchanged", format=item.ingester.name, run=run,
                                bytes=item.path.stat().st_size))
            else:
                done(ingest_one(con, item.path, item.explicit, item.problem, forced, resolver, hashes, failed_whole,
                                complete_lines))
        if pending:
            ingest_batch(con, pending, resolver, hashes, done, load_alone)
    finally:
        if parsed is not None:
            parsed.close()
    record_failures(con, resolver, failed_whole)
    decide_semantics(con, reports)
    return reports


def decide_semantics(con: duckdb.DuckDBPyConnection, reports: list[FileReport]) -> None:
    """The end-of-ingest hook: decide again the semantics record of every run a file was added to,
    replaced in, or grew in (`semantics.record`), and of every run whose record is missing or older
    than its files (an ingest killed before this hook ran)."""
    from polytrace_cli.semantics.record import decide_runs, runs_without_current_record

    names = sorted({report.run for report in reports if report.run and report.status in ("ingested", "replaced", "appended", "truncated")})
    run_ids = set(runs_without_current_record(con))
    if names:
        rows = con.execute("SELECT run_id FROM runs WHERE name IN (SELECT unnest(?))", [names]).fetchall()
        run_ids |= {row[0] for row in rows}
    if run_ids:
        decide_runs(con, sorted(run_ids))


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
        with readable(path, database_file(con)) as source:
            return _ingest_source(con, path, source, explicit, forced, resolver, hashes, failed_whole,
                                  complete_lines)
    except UnreadableFile as error:
        return FileReport(path=shown, status="error", message=f"cannot read: {error}")
    except CorruptFile as error:
        return _reject_whole(path, None, "unknown", str(error), ErrorCode.CORRUPT_FILE, hashes, failed_whole)


def _reject_whole(path: Path, source: Readable | None, fmt: str, reason: str, code: ErrorCode, hashes: FileHashes,
                  failed_whole: list[WholeFileFailure]) -> FileReport:
    sha, size, lines = hashes.result(path)
    if source is not None and source.rewritten:
        lines = hashes.result(source.path)[2]
    elif source is None and code == ErrorCode.CORRUPT_FILE:
        lines = 0  # the text of a damaged archive cannot be counted
    return reject_whole_file(path, fmt, reason, code, sha, size, lines, failed_whole)


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
            rule = side_file_rule(source.name_path)
            if rule is not None:
                return FileReport(path=shown, status="skipped", message=f"ignored: {rule}", side_rule=rule)
            return FileReport(path=shown, status="skipped", message=skip_reason(source.name_path, head, binary))
        reason = "empty file of unknown format" if not head else (
            "binary file of unknown format" if binary else "unknown format (use --format to name it)")
        return _reject_whole(path, source, "unknown", reason, ErrorCode.BINARY_FILE if binary else ErrorCode.UNKNOWN_FORMAT, hashes,
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
