"""Segments of a step log: a step lower than or equal to the one before starts a new segment.

A restarted job that appends to the same log file writes its steps again; keeping each run of
increasing steps as its own segment means nothing is merged or dropped. The first segment is 0.
"""

from __future__ import annotations

from polytrace_cli.lazy import polars as pl

from polytrace_cli.ingest.base import FileContext


def line_segments(metrics: pl.DataFrame) -> pl.DataFrame:
    """One row per metric line of `metrics` (ordered by line_no): line_no, step, previous, segment.

    segment(line) = number of earlier lines i with step(i) <= step(i - 1), counting this one.
    """
    lines = metrics.select("line_no", "step").unique("line_no", maintain_order=True)
    return lines.with_columns(previous=pl.col("step").shift(1)).with_columns(
        segment=(pl.col("step") <= pl.col("previous")).fill_null(False).cast(pl.Int32).cum_sum())


def insert_step_flags(ctx: FileContext, segments: str, extra_flags: str | None = None) -> None:
    """Write `step_flags` for a file: `restart` where a segment begins after the first, `resumed`
    when the log's first step is above 1, plus the rows of `extra_flags` (line_no, step, flag,
    detail), each placed in its line's segment.

    `segments` and `extra_flags` name tables or views on the connection; `segments` has the
    columns of `line_segments`.
    """
    extra = f"SELECT line_no, step, flag, detail FROM {extra_flags} UNION ALL" if extra_flags else ""
    ctx.insert(
        f"""
        INSERT INTO step_flags (run_id, segment, step, flag, detail, file_id, line_no)
        WITH found AS (
            {extra}
            SELECT line_no, step, 'restart' AS flag, 'step went back from ' || previous || ' to ' || step AS detail
            FROM {segments} WHERE step <= previous
            UNION ALL
            SELECT line_no, step, 'resumed', 'log starts at step ' || step
            FROM (SELECT * FROM {segments} ORDER BY line_no LIMIT 1) WHERE step > 1
        )
        SELECT ?, s.segment, f.step, f.flag, f.detail, ?, f.line_no
        FROM found f JOIN {segments} s USING (line_no)
        ORDER BY f.line_no, f.flag
        """,
        [ctx.run_id, ctx.file_id],
    )
