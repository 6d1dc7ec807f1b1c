"""Ingest fanned out on Ray: files are parsed by Ray tasks, the driver commits them into the store.

The shape, and why it stores exactly what the local ingest stores:

- The driver (`driver.ingest_paths`, the loop of both engines) walks the paths and `RayParsing.plan`
  sniffs each file's format. A file whose stored version has the
  same format, size, parser version, read options and sha256 is unchanged and is not dispatched;
  files the tasks cannot take (unknown format, unreadable, compressed, a text to rewrite) are left to the local
  ingest's own `driver.ingest_one`, on the driver.
- The remaining files go to Ray tasks in batches. A task runs the local ingester
  (`runner.ingest_file`) for each of its files into a private in-memory store (the same schema,
  with a placeholder run) and returns, per file, the rows of every file-owned table and of `files`
  as Arrow tables, the file's report (lines, stored, ignored, rejected), the run fields the
  ingester set (framework, model, meta), or the reason the file was rejected as a whole.
- The driver handles the files in walk order, as the local ingest does: it resolves each file's
  run (creating runs in the same order), then commits the file in one transaction (the previous
  version, if any, is deleted, the rows are inserted with the store's run id and a new file id,
  the run fields merged with the ledger's own rules), or hands a file the driver reads to
  `driver.ingest_one`. A file rejected as a whole is recorded with `ledger.record_failures` once
  every file is handled, and never creates a run; a file whose task failed stores nothing.

Ray is an optional dependency (`pip install 'polytrace[ray]'`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from polytrace_cli.errors import IngestError, PolytraceError
from polytrace_cli.ingest.base import Ingester, counting_tokens_with, file_owned_tables, load_tokenizer
from polytrace_cli.ingest.driver import PlannedFile, ingest_paths
from polytrace_cli.ingest.files import FileHashes, hash_and_count, is_compressed, needs_text_rewrite, path_text
from polytrace_cli.ingest.sniffing import detect_deep, get_ingester, read_head
from polytrace_cli.ingest.unchanged import is_unchanged, stored_file
from polytrace_cli.ingest.ledger import (
    FileReport, RunResolver, WholeFileFailure, claim_run_framework, delete_file_rows, merge_run_meta, reject_whole_file,
)
from polytrace_cli.ingest.runner import ingest_file
from polytrace_cli.store.sql import fetch_first, rollback

# Files per Ray task: enough tasks to keep every worker busy (and balance uneven files), few enough
# that the per-task cost (scheduling, a private store per worker) stays small.
TASKS_PER_WORKER = 4


# The run every file of a task's private store belongs to; the driver stores the rows under the real run.
PRIVATE_RUN_ID = 1


@dataclass(frozen=True)
class FileJob:
    """One file for a Ray task: its place in the walk, its resolved path and its format."""

    index: int
    path: str  # resolved
    format: str
    given: str  # as walked, which names the file in a failure's report


@dataclass
class ParsedFile:
    """What a Ray task sends back for one file."""

    index: int
    report: FileReport
    tables: dict[str, Any] = field(default_factory=dict)  # table -> pyarrow.Table (rows of this file only)
    framework: str | None = None
    model: str | None = None
    meta: str = "{}"
    rejection: tuple[str, str, str, int, int] | None = None  # reason, code, sha256, bytes, lines


def require_ray():
    """The ray module; a one-line error when Ray is not installed."""
    try:
        import ray
    except ModuleNotFoundError:
        raise PolytraceError("--engine ray needs Ray: pip install 'polytrace[ray]'") from None
    return ray


def _arrow(con: duckdb.DuckDBPyConnection, sql: str):
    relation = con.sql(sql)
    to_table = getattr(relation, "to_arrow_table", None) or relation.fetch_arrow_table
    return to_table()


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


_PRIVATE: duckdb.DuckDBPyConnection | None = None


def _private_store() -> duckdb.DuckDBPyConnection:
    """This worker process' in-memory store (migrated once, emptied before each file)."""
    global _PRIVATE
    if _PRIVATE is None:
        from polytrace_cli.store.migrations import migrate

        _PRIVATE = duckdb.connect(":memory:")
        _PRIVATE.execute("SET enable_progress_bar = false")
        migrate(_PRIVATE, "private store")
    con = _PRIVATE
    for table in [*file_owned_tables(con), "files", "runs"]:
        con.execute(f"DELETE FROM {table}")
    return con


def parse_file(job: FileJob, tokenizer: str | None = None) -> ParsedFile:
    """Run the local ingester for one file into the private store; its rows and accounting."""
    with counting_tokens_with(load_tokenizer(tokenizer) if tokenizer else None):
        return _parse_file(job)


def _parse_file(job: FileJob) -> ParsedFile:
    path = Path(job.path)
    ingester = get_ingester(job.format)
    con = _private_store()
    con.execute("INSERT INTO runs (run_id, name, source_dir, meta) VALUES (?, 'private', '', '{}')",
                [PRIVATE_RUN_ID])
    try:
        with FileHashes() as hashes:
            report = ingest_file(con, path, ingester, PRIVATE_RUN_ID, "private", read_head(path), hashes)
    except IngestError as error:
        sha, size, lines = hash_and_count(path)
        report = FileReport(path=job.path, status="rejected", format=ingester.name)
        return ParsedFile(job.index, report, rejection=(str(error), error.code, sha, size, lines))
    except OSError as error:
        report = FileReport(path=job.path, status="error", format=ingester.name,
                            message=f"cannot read: {error.strerror or error}")
        return ParsedFile(job.index, report)
    tables = {}
    for table in [*file_owned_tables(con), "files"]:
        rows = _arrow(con, f"SELECT * FROM {table}")
        if rows.num_rows:
            tables[table] = rows
    # The file's own run facts (as a local read keeps them), not the private run's fold of them.
    framework, model, meta = fetch_first(
        con, "SELECT framework, model, (SELECT any_value(meta) FROM file_run_meta WHERE run_id = r.run_id)"
             " FROM runs r WHERE run_id = ?", [PRIVATE_RUN_ID])
    return ParsedFile(job.index, report, tables, framework, model, meta or "{}")


def parse_batch(jobs: list[FileJob], tokenizer: str | None) -> list[ParsedFile]:
    """`parse_file` for each job of a Ray task; a job that fails with a bug is an error report."""
    parsed = []
    for job in jobs:
        try:
            parsed.append(parse_file(job, tokenizer))
        except Exception as error:  # one file's failure must not lose the batch's other files
            parsed.append(ParsedFile(job.index, FileReport(path=job.path, status="error", format=job.format,
                                                           message=_first_line(error))))
    return parsed


def commit(con: duckdb.DuckDBPyConnection, resolver: RunResolver, job: FileJob, parsed: ParsedFile,
           failed_whole: list[WholeFileFailure]) -> FileReport:
    """Resolve the file's run and store the parsed file in one transaction (see the module
    docstring), as `driver.ingest_one` stores a file it reads; returns the file's report."""
    ingester = get_ingester(job.format)
    path = Path(job.path)
    run_id, run = resolver.resolve(path, ingester.framework, resolved=True)
    report = parsed.report
    if parsed.rejection or report.status == "error":
        resolver.drop_if_empty(run_id)  # a failure never creates a run
        if parsed.rejection:
            reason, code, sha, size, lines = parsed.rejection
            return reject_whole_file(Path(job.given), ingester.name, reason, code, sha, size, lines, failed_whole)
        report.path = path_text(Path(job.given))
        return report
    report.path, report.run = path_text(path), run
    try:
        _store_parsed(con, job, parsed, ingester, run_id)
    except BaseException:
        # The command stops (interrupt, full disk, a bug): leave no run that only this file created.
        with contextlib.suppress(Exception):
            resolver.drop_if_empty(run_id)
        raise
    return report


def _store_parsed(con: duckdb.DuckDBPyConnection, job: FileJob, parsed: ParsedFile, ingester: Ingester,
                  run_id: int) -> None:
    con.execute("BEGIN TRANSACTION")
    try:
        existing = fetch_first(con, "SELECT file_id FROM files WHERE run_id = ? AND path = ?",
                               [run_id, path_text(Path(job.path))])
        if existing:
            delete_file_rows(con, existing[0])
            parsed.report.status = "replaced"
        file_id = fetch_first(con, "SELECT nextval('file_id_seq')")[0]
        # `files` last: the file's rows exist before the row that says it was read.
        for table in sorted(parsed.tables, key=lambda name: name == "files"):
            rows = parsed.tables[table]
            replaced = [f"{file_id} AS file_id"] + ([f"{run_id} AS run_id"] if "run_id" in rows.column_names else [])
            con.register("polytrace_incoming", rows)
            try:
                con.execute(f"INSERT INTO {table} BY NAME SELECT * REPLACE ({', '.join(replaced)}) "
                            "FROM polytrace_incoming")
            finally:
                con.unregister("polytrace_incoming")
        if parsed.framework != ingester.framework:
            claim_run_framework(con, run_id, parsed.framework)
        if parsed.model:
            con.execute("UPDATE runs SET model = coalesce(model, ?) WHERE run_id = ?", [parsed.model, run_id])
        # The file's `file_run_meta` row came with its other file-owned rows.
        merge_run_meta(con, run_id, ingester.framework, json.loads(parsed.meta), again=bool(existing),
                       new_files=[file_id])
        con.execute("COMMIT")
    except BaseException:
        rollback(con)
        raise


@dataclass
class RaySettings:
    """Where to run: a cluster address (None: start a local Ray) and the local Ray's CPUs."""

    address: str | None = None
    workers: int | None = None


def _check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """A HOST:PORT or ray://HOST:PORT address whose port does not answer is a one-line error now
    (Ray itself would retry for minutes); other forms (`auto`) are left to Ray."""
    import socket

    target = address.removeprefix("ray://")
    host, separator, port = target.rpartition(":")
    if not separator or not port.isdigit() or not host:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as error:
        raise PolytraceError(f"cannot reach the Ray cluster at {address}: {error.strerror or error}") from None


def _connect(ray, settings: RaySettings) -> tuple[bool, int]:
    """Start or join Ray; returns (started here, CPUs available for tasks)."""
    if settings.address:
        _check_reachable(settings.address)
    if ray.is_initialized():
        return False, int(ray.cluster_resources().get("CPU", 1))
    import logging

    options = {"logging_level": logging.ERROR, "log_to_driver": False, "configure_logging": True}
    try:
        if settings.address:
            ray.init(address=settings.address, **options)
        else:
            ray.init(num_cpus=settings.workers or os.cpu_count() or 1, include_dashboard=False, **options)
    except Exception as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        where = f"the Ray cluster at {settings.address}" if settings.address else "a local Ray"
        raise PolytraceError(f"cannot start {where}: {first}") from None
    return True, int(ray.cluster_resources().get("CPU", 1))


@contextlib.contextmanager
def ray_session(settings: RaySettings | None = None):
    """Ray started (or joined) for the duration of the block; shut down after it if started here.

    Meanwhile file descriptor 1 points at stderr: what Ray and the processes it starts write to
    stdout (a dead worker's report, the raylet's notes) must not mix with a command's --json."""
    ray = require_ray()
    with stdout_to_stderr():
        started_here, _ = _connect(ray, settings or RaySettings())
        try:
            yield ray
        finally:
            if started_here:
                ray.shutdown()


@contextlib.contextmanager
def stdout_to_stderr():
    """Send everything written to file descriptor 1 (by this process, its threads or its children) to
    file descriptor 2 for the duration of the block."""
    import sys

    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no stdout to protect
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def ingest_paths_ray(
    con: duckdb.DuckDBPyConnection,
    paths: Iterable[str | Path],
    *,
    settings: RaySettings | None = None,
    run_name: str | None = None,
    task: str | None = None,
    format_name: str | None = None,
    tokenizer: str | None = None,
    on_file: Callable[[FileReport], None] | None = None,
    hashes: FileHashes | None = None,
) -> list[FileReport]:
    """`driver.ingest_paths` with the parsing fanned out as Ray tasks (`RayParsing`); same reports, same store.

    Ray is joined (or started, and shut down afterwards) before the store is touched, so that a
    cluster that cannot be reached leaves no trace in the store.
    """
    with ray_session(settings) as ray:
        return ingest_paths(con, paths, run_name=run_name, task=task, format_name=format_name, on_file=on_file,
                            hashes=hashes, remote=RayParsing(ray, tokenizer))


class RayParsing:
    """The driver's remote engine on Ray (`driver.RemoteParsing`): which files Ray tasks parse, the tasks
    dispatched and their parsed files handed back in walk order, each committed by the driver."""

    def __init__(self, ray, tokenizer: str | None):
        self.ray = ray
        self.tokenizer = tokenizer
        self.seen: set[Path] = set()

    def plan(self, con: duckdb.DuckDBPyConnection, index: int, path: Path, explicit: bool, problem: str | None,
             forced: Ingester | None, resolver: RunResolver, hashes: FileHashes) -> PlannedFile:
        """A Ray task's file, one the store already holds, or one the driver reads itself (unknown format,
        unreadable, compressed, a text to rewrite first: a byte order mark, CR-only line ends)."""
        ingester = None
        if not problem and not is_compressed(path):
            try:
                head = read_head(path)
                ingester = None if needs_text_rewrite(head) else forced or detect_deep(path, path, head)
            except OSError:
                ingester = None
        if ingester is None:
            return PlannedFile("alone", path, explicit, problem)
        resolved = path.resolve()
        if resolved in self.seen or _unchanged(con, resolver, resolved, ingester, hashes):
            return PlannedFile("unchanged", resolved, ingester=ingester)
        self.seen.add(resolved)
        return PlannedFile("remote", resolved, job=FileJob(index, str(resolved), ingester.name, str(path)))

    def parsed_in_order(self, jobs: list[FileJob]):
        return _parsed_in_order(self.ray, jobs, self.tokenizer)

    def commit(self, con: duckdb.DuckDBPyConnection, resolver: RunResolver, job: FileJob, parsed: ParsedFile,
               failed_whole: list[WholeFileFailure]) -> FileReport:
        return commit(con, resolver, job, parsed, failed_whole)


def _unchanged(con, resolver: RunResolver, resolved: Path, ingester: Ingester, hashes: FileHashes) -> bool:
    """Whether the store holds this file read the same way (format, parser version, read options,
    size) with the same sha256, as `runner.ingest_file` decides it."""
    run = resolver.existing(resolved)
    if run is None:
        return False
    return is_unchanged(stored_file(con, run[0], path_text(resolved)), ingester, resolved.stat().st_size,
                        lambda: hashes.result(resolved)[0])


def _parsed_in_order(ray, jobs: list[FileJob], tokenizer: str | None):
    """Dispatch `jobs` as Ray tasks; yield their parsed files in the jobs' order as they arrive.
    A task that fails makes each of its files an error report; closing the generator cancels the
    tasks still running."""
    if not jobs:
        return
    cpus = int(ray.cluster_resources().get("CPU", 1))
    per_task = max(1, math.ceil(len(jobs) / (max(cpus, 1) * TASKS_PER_WORKER)))
    batches = [jobs[i:i + per_task] for i in range(0, len(jobs), per_task)]
    remote = ray.remote(num_cpus=1, max_retries=1)(parse_batch)
    pending = {remote.remote(batch, tokenizer): batch for batch in batches}
    ready: dict[int, ParsedFile] = {}
    try:
        for job in jobs:
            while job.index not in ready:
                if not pending:
                    raise RuntimeError(f"a Ray task returned no result for {job.path}")
                done, _ = ray.wait(list(pending), num_returns=1)
                for reference in done:
                    batch = pending.pop(reference)
                    try:
                        results = ray.get(reference)
                    except Exception as error:  # the task died: its files store nothing and say why
                        results = [ParsedFile(other.index, FileReport(
                            path=other.path, status="error", format=other.format,
                            message=f"Ray task failed: {_first_line(error)}")) for other in batch]
                    for parsed in results:
                        ready[parsed.index] = parsed
            yield ready.pop(job.index)
    finally:
        for reference in pending:
            with contextlib.suppress(Exception):
                ray.cancel(reference)
