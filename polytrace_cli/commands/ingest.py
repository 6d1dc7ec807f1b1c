"""`polytrace ingest` and `polytrace formats`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from rich.markup import escape

from polytrace_cli.commands.common import (CsvOption, DbOption, JsonOption, WaitOption, WideOption, console,
                                          emit_frame, emit_rows, emit_table, err_console, fail, user_errors)
from polytrace_cli.errors import PolytraceError
from polytrace_cli.ingest.files import NOT_A_FAILURE, FileHashes, is_log_like, walk

if TYPE_CHECKING:
    from polytrace_cli.ingest.ledger import FileReport


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
    strict: Annotated[bool, typer.Option("--strict", help="Exit non-zero when any line is rejected or looks like a metric record but was not read.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the per-file results as JSON.")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print the per-file results as CSV.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="List every skipped file, the writers' side "
                                          "files ignored under their rules too.")] = False,
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
        side = [r for r in reports if r.side_rule is not None]
        skipped = [r for r in reports if r.status == "skipped" and (verbose or r.side_rule is None)]
        shown_skipped = skipped if verbose else skipped[:SKIPPED_SHOWN]
        for report in shown_skipped:
            err_console.print(f"skipped: {report.path}: {report.message}", highlight=False, markup=False)
        if len(skipped) > len(shown_skipped):
            err_console.print(f"... and {len(skipped) - SKIPPED_SHOWN} more skipped file(s) (--verbose or --json "
                              "lists each)", highlight=False, markup=False)
        if side and not verbose:
            rules: dict[str, int] = {}
            for report in side:
                rules[report.side_rule] = rules.get(report.side_rule, 0) + 1
            err_console.print(f"ignored {len(side)} side file(s) of the writers: "
                              + ", ".join(f"{rule}: {count}" for rule, count in rules.items()) + " (--verbose lists them)",
                              highlight=False, markup=False)
        totals = sum(r.rows for r in reports), sum(r.rejected for r in reports), sum(r.seconds for r in reports)
        if shown:
            console.print(f"{len(shown)} file(s), {totals[0]:,} rows, {totals[1]:,} rejected lines, {totals[2]:.2f} s")
    failed = [r for r in reports if r.failed]
    if failed:
        raise fail(f"{len(failed)} file(s) could not be ingested", 1)
    unread_logs = [r for r in reports if r.status == "skipped" and r.side_rule is None and is_log_like(r.path)
                   and r.message not in NOT_A_FAILURE]
    if unread_logs:
        raise fail(f"{len(unread_logs)} log file(s) were not read (no line of a known format): "
                   + ", ".join(Path(r.path).name for r in unread_logs[:3]) + (" ..." if len(unread_logs) > 3 else ""), 1)
    if not reports:
        raise fail("no files found under the given paths", 1)
    if strict and any(r.rejected for r in reports):
        raise fail(f"--strict: {sum(r.rejected for r in reports)} line(s) rejected; see `polytrace errors`", 1)
    if strict and any(r.unread_records for r in reports):
        raise fail(f"--strict: {sum(r.unread_records for r in reports)} line(s) look like metric records but were "
                   "not read (ignore rule 'looks like a metric record, not read')", 1)


def _ingest_all(paths: list[Path], db: Path | None, run: str | None, task: str | None, format_name: str | None,
                as_json: bool, tokenizer: str | None, hashes: FileHashes, wait: float = 0,
                ray: dict | None = None) -> list[FileReport]:
    from polytrace_cli.facade import Store

    settings = None
    if ray is not None:  # the Ray engine's module only when Ray is asked for
        from polytrace_cli.ingest.ray_engine import RaySettings

        settings = RaySettings(**ray)
    if not (sys.stderr.isatty() and not as_json):
        return Store.ingest_into(db, paths, run, task, format_name, tokenizer=tokenizer, hashes=hashes, wait=wait,
                                 ray=settings)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TransferSpeedColumn

    with Progress(TextColumn("[bold]ingest"), BarColumn(), TransferSpeedColumn(),
                  TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=err_console, transient=True) as progress:

        def bar(total_bytes: int) -> Callable[[FileReport], None]:
            task_id = progress.add_task("", total=total_bytes)
            return lambda report: progress.update(task_id, advance=report.bytes,
                                                  description=escape(Path(report.path).name))

        return Store.ingest_into(db, paths, run, task, format_name, tokenizer=tokenizer, hashes=hashes, wait=wait,
                                 ray=settings, progress=bar)


def formats(as_json: JsonOption = False, as_csv: CsvOption = False, wide: WideOption = False) -> None:
    """List the input formats polytrace recognises, in sniffing order."""
    import polars as pl

    from polytrace_cli.ingest.sniffing import all_ingesters

    frame = pl.DataFrame(
        {
            "format": [i.name for i in all_ingesters()],
            "framework": [i.framework for i in all_ingesters()],
            "reads": [i.description for i in all_ingesters()],
        }
    )
    # The description is the answer: it wraps at the terminal's width instead of being cut.
    emit_frame(frame, as_json=as_json, as_csv=as_csv, title="formats", identity=["format"], wide=wide,
               wrap=["reads"])
    if not (as_json or as_csv):
        from polytrace_cli.ingest.registry import execution_mode_timers

        from polytrace_cli.commands.tables import print_item

        # Whole sentences, never cut to the terminal's width as a table's cells would be.
        console.print("execution modes (each run's semantics record; docs/metrics.md): what the timers mean",
                      highlight=False)
        for mode, (told, meaning) in execution_mode_timers().items():
            print_item(console, f"{mode} (told by {told}): {meaning}")
