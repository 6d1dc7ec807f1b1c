"""What the console formats that read a step's record as a block (a dict, a table, a list of bullets:
slime, NeMo-RL, SkyRL, ROLL, AReaL) do alike once their lines are classified and their metrics parsed:
the accounting of the lines that hold no metric, the segments of the steps in line order, and the
insert of the metrics with their segments, step flags and console clock."""

from __future__ import annotations

from collections.abc import Callable

from polytrace_cli.lazy import polars as pl

from polytrace_cli.errors import ErrorCode
from polytrace_cli.ingest.arrow import ArrowStream
from polytrace_cli.ingest.base import FileContext
from polytrace_cli.ingest.console.clock import stamped_lines, store_console_clock
from polytrace_cli.ingest.segments import insert_step_flags

def account_other_lines(ctx: FileContext, lines: pl.DataFrame, other: pl.Expr) -> pl.DataFrame:
    """Reject each line of `other` that is not UTF-8 text (`encoding`, as `read_console_lines` names it)
    and count the rest of `other` under their rule (`kind`); the lines left, damaged `other` lines gone."""
    if "encoding" in lines.columns:
        damaged = pl.col("encoding").is_not_null() & other
        for line_no, reason, raw in lines.filter(damaged).select("line_no", "encoding", "raw").iter_rows():
            ctx.reject(line_no, reason, raw, code=ErrorCode.ENCODING_ERROR)
        lines = lines.filter(~damaged).drop("encoding")
    for rule, count in lines.filter(other).group_by("kind").len().sort("kind").iter_rows():
        ctx.ignore(rule, count)
    return lines


def went_back(step: int, previous: int) -> bool:
    """A step below the one before: a restart of a log that may log a step twice."""
    return step < previous


def did_not_rise(step: int, previous: int) -> bool:
    """A step not above the one before: a restart of a log that logs each step once."""
    return step <= previous


def step_segments(steps: list[tuple[int, int]], restarts: Callable[[int, int], bool]) -> pl.DataFrame:
    """Segments of the record lines ((line_no, step) in line order): a step for which `restarts(step,
    previous)` holds starts a new segment (a step below the one before, or not above it where each step is
    logged once). Columns as `segments.line_segments` gives them."""
    segment, previous, rows = 0, None, []
    for line_no, step in steps:
        if previous is not None and restarts(step, previous):
            segment += 1
        rows.append((line_no, step, previous, False, segment))
        previous = step
    return pl.DataFrame(rows, schema={"line_no": pl.Int64, "step": pl.Int64, "previous": pl.Int64,
                                      "resumed": pl.Boolean, "segment": pl.Int32}, orient="row")


def store_metrics(ctx: FileContext, metrics: pl.DataFrame, segments: pl.DataFrame, prefix: str,
                  went_back: str = "the step went back", lines: pl.DataFrame | None = None) -> None:
    """Insert `metrics` (line_no, step, key, value, text_value) into `step_metrics` with each line's
    segment, and the steps' flags; a note when a segment restarts (`went_back` names what went back).
    With the classified `lines`, the steps' console clock from the times their lines start with."""
    metrics = metrics.join(segments.select("line_no", "segment"), on="line_no", how="left", maintain_order="left")
    con = ctx.con
    con.register(f"{prefix}_metrics", ArrowStream(metrics))
    con.register(f"{prefix}_segments", ArrowStream(segments))
    try:
        ctx.insert(
            "INSERT INTO step_metrics (run_id, segment, step, key, value, text_value, file_id, line_no)"
            f" SELECT ?, segment, step, key, value, text_value, ?, line_no FROM {prefix}_metrics",
            [ctx.run_id, ctx.file_id])
        insert_step_flags(ctx, f"{prefix}_segments")
    finally:
        con.unregister(f"{prefix}_metrics")
        con.unregister(f"{prefix}_segments")
    if lines is not None:
        store_console_clock(ctx, stamped_lines(lines))
    restarts = segments.get_column("segment").max()
    if restarts:
        ctx.note(f"{went_back} {restarts} time(s): stored as separate segments")
