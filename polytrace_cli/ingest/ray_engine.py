"""Ingest fanned out on Ray: files are parsed by Ray tasks, the driver commits them into the store.

The shape, and why it stores exactly what the local ingest stores:

- The driver walks the paths, sniffs each file's format, resolves its run (creating runs in walk
  order, as the local ingest does) and skips a file whose stored version has the same size, parser
  version and sha256 before anything is dispatched. Files of unknown format are handled on the
  driver as the local ingest handles them.
- The remaining files go to Ray tasks in batches. A task runs the local ingester
  (`runner.ingest_file`) for each of its files into a private in-memory store (the same schema,
  with the file's run as its only run) and returns, per file, the rows of every file-owned table
  and of `files` as Arrow tables, the file's report (lines, stored, ignored, rejected), the run
  fields the ingester set (framework, model, meta), or the reason the file was rejected as a whole.
- The driver commits the files in walk order, each in one transaction: the previous version of the
  file (if any) is deleted, the rows are inserted with the store's run id and a new file id, and
  the run fields are merged as the local ingest merges them. A file whose task failed stores nothing.

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
from polytrace_cli.ingest.base import file_owned_tables
from polytrace_cli.ingest.files import FileHashes, hash_and_count, walk
from polytrace_cli.ingest.registry import detect, get_ingester, read_head
from polytrace_cli.ingest.runner import (
    FileReport,
    RunResolver,
    _ingest_one,
    _merge_run_meta,
    _record_whole_file_rejection,
    delete_file_rows,
    ingest_file,
)
from polytrace_cli.store.connection import fetch_first

# Files per Ray task: enough tasks to keep every worker busy (and balance uneven files), few enough
# that the per-task cost (scheduling, a private store per worker) stays small.
TASKS_PER_WORKER = 4


@dataclass(frozen=True)
class FileJob:
    """One file for a Ray task: its place in the walk, format and run."""

    index: int
    path: str
    format: str
    run_id: int
    run_name: str


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
    from polytrace_cli.ingest.formats import verl_rollout

    verl_rollout.set_tokenizer(tokenizer)
    path = Path(job.path)
    ingester = get_ingester(job.format)
    con = _private_store()
    con.execute("INSERT INTO runs (run_id, name, source_dir, meta) VALUES (?, ?, '', '{}')",
                [job.run_id, job.run_name])
    try:
        with FileHashes() as hashes:
            report = ingest_file(con, path, ingester, job.run_id, job.run_name, read_head(path), hashes)
    except IngestError as error:
        sha, size, lines = hash_and_count(path)
        report = FileReport(path=str(path), status="rejected", format=ingester.name, run=job.run_name, bytes=size,
                            lines=lines, rejected=lines, message=str(error))
        return ParsedFile(job.index, report, rejection=(str(error), error.code, sha, size, lines))
    except OSError as error:
        report = FileReport(path=str(path), status="error", format=ingester.name, run=job.run_name,
                            message=f"cannot read: {error.strerror or error}")
        return ParsedFile(job.index, report)
    tables = {}
    for table in [*file_owned_tables(con), "files"]:
        rows = _arrow(con, f"SELECT * FROM {table}")
        if rows.num_rows:
            tables[table] = rows
    framework, model, meta = fetch_first(con, "SELECT framework, model, meta FROM runs WHERE run_id = ?",
                                         [job.run_id])
    return ParsedFile(job.index, report, tables, framework, model, meta or "{}")


def parse_batch(jobs: list[FileJob], tokenizer: str | None) -> list[ParsedFile]:
    """`parse_file` for each job of a Ray task; a job that fails with a bug is an error report."""
    parsed = []
    for job in jobs:
        try:
            parsed.append(parse_file(job, tokenizer))
        except Exception as error:  # one file's failure must not lose the batch's other files
            message = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
            parsed.append(ParsedFile(job.index, FileReport(path=job.path, status="error", format=job.format,
                                                           run=job.run_name, message=message)))
    return parsed


def commit(con: duckdb.DuckDBPyConnection, job: FileJob, parsed: ParsedFile) -> FileReport:
    """Store one parsed file in one transaction (see the module docstring); returns its report."""
    report = parsed.report
    path = Path(job.path)
    if parsed.rejection:
        reason, code, sha, size, lines = parsed.rejection
        _record_whole_file_rejection(con, job.run_id, path, sha, size, lines, job.format, reason, code)
        return report
    if report.status == "error":
        return report
    ingester = get_ingester(job.format)
    con.execute("BEGIN TRANSACTION")
    try:
        existing = fetch_first(con, "SELECT file_id FROM files WHERE run_id = ? AND path = ?", [job.run_id, job.path])
        if existing:
            delete_file_rows(con, existing[0])
            report.status = "replaced"
        file_id = fetch_first(con, "SELECT nextval('file_id_seq')")[0]
        # `files` last: the file's rows exist before the row that says it was read.
        for table in sorted(parsed.tables, key=lambda name: name == "files"):
            rows = parsed.tables[table]
            replaced = [f"{file_id} AS file_id"] + ([f"{job.run_id} AS run_id"] if "run_id" in rows.column_names else [])
            con.register("polytrace_incoming", rows)
            try:
                con.execute(f"INSERT INTO {table} BY NAME SELECT * REPLACE ({', '.join(replaced)}) "
                            "FROM polytrace_incoming")
            finally:
                con.unregister("polytrace_incoming")
        if parsed.framework and parsed.framework != ingester.framework:
            # The ingester claimed the run's framework from the file's content (tensorboard, wandb).
            con.execute("UPDATE runs SET framework = ? WHERE run_id = ? AND (framework IS NULL OR framework IN "
                        "('wandb', 'tensorboard'))", [parsed.framework, job.run_id])
        if parsed.model:
            con.execute("UPDATE runs SET model = coalesce(model, ?) WHERE run_id = ?", [parsed.model, job.run_id])
        _merge_run_meta(con, job.run_id, ingester.framework, json.loads(parsed.meta))
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return report


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
    """Ray started (or joined) for the duration of the block; shut down after it if started here."""
    ray = require_ray()
    started_here, _ = _connect(ray, settings or RaySettings())
    try:
        yield ray
    finally:
        if started_here:
            ray.shutdown()


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
    """`runner.ingest_paths` with the parsing fanned out as Ray tasks; same reports, same store.

    Ray is joined (or started, and shut down afterwards) before the store is touched, so that a
    cluster that cannot be reached leaves no trace in the store.
    """
    with ray_session(settings) as ray:
        return _ingest_paths_ray(ray, con, paths, run_name=run_name, task=task, format_name=format_name,
                                 tokenizer=tokenizer, on_file=on_file, hashes=hashes)


def _ingest_paths_ray(ray, con, paths, *, run_name, task, format_name, tokenizer, on_file, hashes):
    own_hashes = hashes is None
    hashes = hashes or FileHashes()
    try:
        forced = None
        if format_name:
            forced = get_ingester(format_name)
            if forced is None:
                raise PolytraceError(f"unknown format {format_name!r}; see `polytrace formats`")
        resolver = RunResolver(con, run_name, task)
        reports: dict[int, FileReport] = {}
        jobs: list[FileJob] = []
        seen: set[str] = set()
        for index, (path, explicit, problem) in enumerate(walk(paths)):
            ingester = None
            if not problem:
                try:
                    ingester = forced or detect(path, read_head(path))
                except OSError:
                    ingester = None
            if ingester is None or problem:
                # Unknown formats, unreadable paths: the local ingest's own handling, on the driver.
                reports[index] = _ingest_one(con, path, explicit, problem, forced, resolver, hashes)
                continue
            run_id, run = resolver.resolve(path, ingester.framework)
            resolved = str(path.resolve())
            if resolved in seen or _unchanged(con, resolved, run_id, ingester, hashes):
                reports[index] = FileReport(path=resolved, status="unchanged", format=ingester.name, run=run,
                                            bytes=path.stat().st_size)
                continue
            seen.add(resolved)
            jobs.append(FileJob(index, resolved, ingester.name, run_id, run))
        if jobs:
            _dispatch(ray, con, jobs, tokenizer, reports, on_file)
        ordered = [reports[index] for index in sorted(reports)]
        if on_file:
            for index in sorted(reports):
                if index not in {job.index for job in jobs}:
                    on_file(reports[index])
        return ordered
    finally:
        if own_hashes:
            hashes.close()


def _unchanged(con, resolved: str, run_id: int, ingester, hashes: FileHashes) -> bool:
    existing = fetch_first(con, "SELECT sha256, parser_version, bytes FROM files WHERE run_id = ? AND path = ?",
                           [run_id, resolved])
    if not existing or existing[1] != ingester.version or existing[2] != Path(resolved).stat().st_size:
        return False
    return existing[0] == hashes.result(Path(resolved))[0]


def _dispatch(ray, con, jobs: list[FileJob], tokenizer: str | None, reports: dict[int, FileReport],
              on_file) -> None:
    cpus = int(ray.cluster_resources().get("CPU", 1))
    per_task = max(1, math.ceil(len(jobs) / (max(cpus, 1) * TASKS_PER_WORKER)))
    batches = [jobs[i:i + per_task] for i in range(0, len(jobs), per_task)]
    remote = ray.remote(num_cpus=1, max_retries=1)(parse_batch)
    pending = {remote.remote(batch, tokenizer): batch for batch in batches}
    ready: dict[int, ParsedFile] = {}
    next_job = 0
    while pending or next_job < len(jobs):
        if pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for reference in done:
                batch = pending.pop(reference)
                try:
                    results = ray.get(reference)
                except Exception as error:  # the task died: its files store nothing and say why
                    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                    results = [ParsedFile(job.index, FileReport(path=job.path, status="error", format=job.format,
                                                                run=job.run_name, message=f"Ray task failed: {first}"))
                               for job in batch]
                for parsed in results:
                    ready[parsed.index] = parsed
        # Commit in walk order, so that run fields merge as they do in the local ingest.
        while next_job < len(jobs) and jobs[next_job].index in ready:
            job = jobs[next_job]
            parsed = ready.pop(job.index)
            report = commit(con, job, parsed)
            reports[job.index] = report
            if on_file:
                on_file(report)
            next_job += 1
        if not pending and next_job < len(jobs):
            raise RuntimeError("a Ray task returned no result for some files")
