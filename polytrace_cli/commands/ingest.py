"""`polytrace ingest` and `polytrace formats`."""

from __future__ import annotations

import errno
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rich.markup import escape

from polytrace_cli.commands.common import (CsvOption, DbOption, JsonOption, WaitOption, console, emit_frame, emit_rows,
                                          emit_table, err_console, fail, user_errors)
from polytrace_cli.errors import PolytraceError
from polytrace_cli.ingest.files import NOT_A_FAILURE, FileHashes, is_log_like, walk

if TYPE_CHECKING:
    from polytrace_cli.ingest.runner import FileReport


SUMMARY_COLUMNS = ["file", "run", "format", "status", "lines", "rows", "ignored", "rejected", "seconds", "MB/s"]
# What a narrow terminal keeps first: whether each file went in and what was lost.
SUMMARY_ORDER = ["file", "status", "lines", "rows", "ignored", "rejected", "run", "format", "seconds", "MB/s"]


# Skipped files named one per line on stderr; --json lists every one.
SKIPPED_SHOWN = 20
# Beyond this many files the table shows one row per run, format and status instead of one per file.
SUMMARY_MAX_FILES = 200


def _print_summary(reports: list[FileReport]) -> None:
    if len(reports) > SUMMARY_MAX_FILES:
        _print_grouped_summary(reports)
        return
    rows = [(Path(r.path).name, r.run, r.format, r.status, r.lines, r.rows, r.ignored, r.rejected,
             round(r.seconds, 3), round(r.mb_per_s, 1)) for r in reports]
    emit_table(SUMMARY_COLUMNS, rows, numeric=set(SUMMARY_COLUMNS[4:]), title="ingested files", order=SUMMARY_ORDER)


def _print_grouped_summary(reports: list[FileReport]) -> None:
    groups: dict[tuple, list[FileReport]] = {}
    for report in reports:
        groups.setdefault((report.run, report.format, report.status), []).append(report)
    rows = []
    for (run, fmt, status), members in groups.items():
        seconds = sum(r.seconds for r in members)
        size = sum(r.bytes for r in members)
        rows.append((f"{len(members):,} files", run, fmt, status, sum(r.lines for r in members),
                     sum(r.rows for r in members), sum(r.ignored for r in members), sum(r.rejected for r in members),
                     round(seconds, 3), round(size / 1e6 / seconds, 1) if seconds > 0 else 0.0))
    emit_table(SUMMARY_COLUMNS, rows, numeric=set(SUMMARY_COLUMNS[4:]), title="ingested files (--json lists each)")


@user_errors
def ingest(
    paths: Annotated[list[Path], typer.Argument(help="Files or folders to read.")],
    db: DbOption = None,
    run: Annotated[str | None, typer.Option(help="Name the run instead of deriving it from the folder.")] = None,
    task: Annotated[str | None, typer.Option(help="Label the run's task: math, code, search, tool, ...")] = None,
    format: Annotated[str | None, typer.Option("--format", help="Skip sniffing; read every file as this format.")] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Exit non-zero when any line is rejected.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the per-file results as JSON.")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print the per-file results as CSV.")] = False,
    tokenizer: Annotated[str | None, typer.Option(
        help="A locally available Hugging Face tokenizer (folder or cached name) to count rollout-dump lengths;"
             " default: characters / 4.")] = None,
    wait: WaitOption = 0,
    engine: Annotated[str, typer.Option(
        "--engine", help="local: parse in this process; ray: parse as Ray tasks (pip install 'polytrace[ray]').")]
    = "local",
    ray_address: Annotated[str | None, typer.Option(
        "--ray-address", help="With --engine ray: the cluster to join (default: start a local Ray).")] = None,
    workers: Annotated[int | None, typer.Option(
        "--workers", min=1, help="With --engine ray and no address: CPUs of the local Ray (default: all).")] = None,
) -> None:
    """Read logs and traces into the store, one transaction per file."""
    if engine not in ("local", "ray"):
        raise fail(f"--engine takes local or ray, not {engine!r}")
    if engine == "local" and (ray_address or workers):
        raise fail("--ray-address and --workers go with --engine ray")
    if ray_address and workers:
        raise fail("--workers sizes a local Ray; a cluster at --ray-address has its own workers")
    ray = {"address": ray_address, "workers": workers} if engine == "ray" else None
    with FileHashes() as hashes:
        # A file is hashed once the store says it must be: a log that only grew is hashed from the
        # state kept for it, an unchanged one first by size (`ingest.unchanged`).
        reports = _ingest_all(paths, db, run, task, format, as_json or as_csv, tokenizer, hashes, wait, ray)
    if as_csv:
        records = [{**r.__dict__, "mb_per_s": r.mb_per_s} for r in reports]
        columns = list(records[0]) if records else ["path"]
        emit_rows(columns, [tuple(record[c] for c in columns) for record in records], as_csv=True)
    elif as_json:
        sys.stdout.write(json.dumps([{**r.__dict__, "mb_per_s": r.mb_per_s} for r in reports], indent=2) + "\n")
    else:
        # A path that could not be opened has nothing for the table; its error line below says why.
        shown = [r for r in reports if r.status != "skipped" and not r.unread]
        if shown:
            _print_summary(shown)
        for report in reports:
            if report.message and report.status != "skipped":
                err_console.print(f"[yellow]{report.status}:[/] {escape(report.path)}: {escape(report.message)}",
                                  highlight=False)
            for note in report.notes:
                err_console.print(f"[cyan]note:[/] {escape(Path(report.path).name)}: {escape(note)}", highlight=False)
        skipped = [r for r in reports if r.status == "skipped"]
        for report in skipped[:SKIPPED_SHOWN]:
            err_console.print(f"skipped: {report.path}: {report.message}", highlight=False, markup=False)
        if len(skipped) > SKIPPED_SHOWN:
            err_console.print(f"... and {len(skipped) - SKIPPED_SHOWN} more skipped file(s) (--json lists each)",
                              highlight=False, markup=False)
        totals = sum(r.rows for r in reports), sum(r.rejected for r in reports), sum(r.seconds for r in reports)
        if shown:
            console.print(f"{len(shown)} file(s), {totals[0]:,} rows, {totals[1]:,} rejected lines, {totals[2]:.2f} s")
    failed = [r for r in reports if r.failed]
    if failed:
        raise fail(f"{len(failed)} file(s) could not be ingested", 1)
    unread_logs = [r for r in reports if r.status == "skipped" and is_log_like(r.path)
                   and r.message not in NOT_A_FAILURE]
    if unread_logs:
        raise fail(f"{len(unread_logs)} log file(s) were not read (no line of a known format): "
                   + ", ".join(Path(r.path).name for r in unread_logs[:3]) + (" ..." if len(unread_logs) > 3 else ""), 1)
    if not reports:
        raise fail("no files found under the given paths", 1)
    if strict and any(r.rejected for r in reports):
        raise fail(f"--strict: {sum(r.rejected for r in reports)} line(s) rejected; see `polytrace errors`", 1)


def _ingest_all(paths: list[Path], db: Path | None, run: str | None, task: str | None, format_name: str | None,
                as_json: bool, tokenizer: str | None, hashes: FileHashes, wait: float = 0,
                ray: dict | None = None) -> list[FileReport]:
    from polytrace_cli.ingest.base import load_tokenizer

    # A tokenizer that cannot be loaded is an error before the store is created or touched.
    loaded = load_tokenizer(tokenizer) if tokenizer else None
    if ray is None:
        return _ingest_into_store(paths, db, run, task, format_name, as_json, loaded, hashes, wait)
    from polytrace_cli.ingest.ray_engine import RaySettings, ray_session

    settings = RaySettings(**ray)
    # Ray first: a cluster that cannot be reached leaves the store untouched.
    with ray_session(settings):
        try:
            return _ingest_into_store(paths, db, run, task, format_name, as_json, loaded, hashes, wait, settings)
        except PolytraceError:
            raise
        except Exception as error:
            if isinstance(error, sys.modules["duckdb"].Error) or getattr(error, "errno", None) == errno.ENOSPC:
                raise  # the store's and the full disk's own one-line errors
            # A bug in the driver or a task: the files committed before it stay; say what failed.
            text = str(error).strip()
            detail = f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__
            raise PolytraceError(f"the Ray ingest failed: {detail}") from None


def _ingest_into_store(paths, db, run, task, format_name, as_json, tokenizer, hashes, wait, ray=None):
    from polytrace_cli.facade import Store

    with Store.open(db, wait=wait) as store:
        options = {"run": run, "task": task, "format": format_name, "tokenizer": tokenizer, "hashes": hashes,
                   "ray": ray}
        if not (sys.stderr.isatty() and not as_json):
            return store.ingest(paths, **options)
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TransferSpeedColumn

        total_bytes = sum(p.stat().st_size for p, _, problem in walk(paths) if not problem)
        with Progress(TextColumn("[bold]ingest"), BarColumn(), TransferSpeedColumn(),
                      TextColumn("{task.description}"), TimeElapsedColumn(),
                      console=err_console, transient=True) as progress:
            bar = progress.add_task("", total=total_bytes)

            def advance(report: FileReport) -> None:
                progress.update(bar, advance=report.bytes, description=escape(Path(report.path).name))

            return store.ingest(paths, on_file=advance, **options)


def formats(as_json: JsonOption = False, as_csv: CsvOption = False) -> None:
    """List the input formats polytrace recognises, in sniffing order."""
    import polars as pl

    from polytrace_cli.ingest.registry import all_ingesters

    frame = pl.DataFrame(
        {
            "format": [i.name for i in all_ingesters()],
            "framework": [i.framework for i in all_ingesters()],
            "reads": [i.description for i in all_ingesters()],
        }
    )
    emit_frame(frame, as_json=as_json, as_csv=as_csv, title="formats", identity=["format"])
