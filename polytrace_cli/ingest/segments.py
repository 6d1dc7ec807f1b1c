"""Segments of a step log: a step lower than the one before starts a new segment.

A restarted job that appends to the same log file writes its steps again; keeping each run of
increasing steps as its own segment means nothing is merged or dropped. The first segment is 0.

A step printed twice in a row is one step when the two lines name different keys (verl prints a
validation line `step:0 - test_score/...` and then the training line of the same step); when
they share a key, the step was logged again by a restarted job, and a new segment begins.

A job resumed from a checkpoint counts on from the loaded step, so its steps do not go back: the
line where it says so (verl's `Load from checkpoint folder: ...`) starts a new segment at the
next metric line.
"""

from __future__ import annotations

from polytrace_cli.lazy import polars as pl

from polytrace_cli.ingest.base import FileContext


def line_segments(metrics: pl.DataFrame, resumes: list[int] = ()) -> pl.DataFrame:
    """One row per metric line of `metrics` (line_no, step, key; ordered by line_no): line_no,
    step, previous, resumed, segment.

    A line restarts when step(i) < step(i - 1), or step(i) = step(i - 1) and the two lines share a
    key, or (`resumed`) a line of `resumes` (a checkpoint loaded) lies between line i - 1 and line
    i; segment(line) = number of restarting lines up to and including it.
    """
    lines = metrics.select("line_no", "step").unique("line_no", maintain_order=True)
    lines = lines.with_columns(previous=pl.col("step").shift(1), previous_line=pl.col("line_no").shift(1))
    loads_before = pl.Series(sorted(resumes), dtype=pl.Int64).search_sorted(lines.get_column("line_no"))
    lines = lines.with_columns(resumed=(loads_before > loads_before.shift(1)).fill_null(False))
    repeated = lines.filter(pl.col("step") == pl.col("previous"))
    shared = _lines_sharing_a_key(metrics, repeated) if repeated.height else []
    restart = (pl.col("step") < pl.col("previous")) | pl.col("line_no").is_in(shared) | pl.col("resumed")
    return lines.with_columns(segment=restart.fill_null(False).cast(pl.Int32).cum_sum()).drop("previous_line")


def lone_line_segment(line_no: int, step: int, segment: int) -> pl.DataFrame:
    """What `line_segments` gives for one metric line alone (it cannot restart), in `segment`: the
    row an appended read starts from, built without `line_segments`' dozen frame operations."""
    return pl.DataFrame({"line_no": [line_no], "step": [step], "previous": [None], "resumed": [False],
                         "segment": [segment]},
                        schema={"line_no": pl.Int64, "step": pl.Int64, "previous": pl.Int64, "resumed": pl.Boolean,
                                "segment": pl.Int32})


def _lines_sharing_a_key(metrics: pl.DataFrame, repeated: pl.DataFrame) -> list[int]:
    """The lines of `repeated` (line_no, previous_line) holding a key that the line before also holds."""
    involved = pl.concat([repeated.get_column("line_no"), repeated.get_column("previous_line")])
    keys = metrics.filter(pl.col("line_no").is_in(involved.implode())).select("line_no", "key").unique()
    pairs = repeated.select("line_no", "previous_line").join(keys, on="line_no").join(
        keys.rename({"line_no": "previous_line"}), on=["previous_line", "key"])
    return pairs.get_column("line_no").unique().to_list()


def insert_step_flags(ctx: FileContext, segments: str, extra_flags: str | None = None,
                      after_line: int | None = None) -> None:
    """Write `step_flags` for a file: `restart` where a segment begins after the first, `resumed`
    when the log's first step is above 1, plus the rows of `extra_flags` (line_no, step, flag,
    detail), each placed in its line's segment.

    `segments` and `extra_flags` name tables or views on the connection; `segments` has the
    columns of `line_segments`. With `after_line` (an appended read, whose `segments` starts with
    the last line stored before), only flags of later lines are written.
    """
    extra = f"SELECT line_no, step, flag, detail FROM {extra_flags} UNION ALL" if extra_flags else ""
    ctx.insert(
        f"""
        INSERT INTO step_flags (run_id, segment, step, flag, detail, file_id, line_no)
        WITH found AS (
            {extra}
            SELECT line_no, step, 'restart' AS flag,
                   CASE WHEN resumed THEN 'resumed from a checkpoint after step ' || previous
                        WHEN step = previous THEN 'step ' || step || ' logged again'
                        ELSE 'step went back from ' || previous || ' to ' || step END AS detail
            FROM (SELECT *, lag(segment) OVER (ORDER BY line_no) AS previous_segment FROM {segments})
            WHERE segment > previous_segment
            UNION ALL
            SELECT line_no, step, 'resumed', 'log starts at step ' || step
            FROM (SELECT * FROM {segments} ORDER BY line_no LIMIT 1) WHERE step > 1
        )
        SELECT ?, s.segment, f.step, f.flag, f.detail, ?, f.line_no
        FROM found f JOIN {segments} s USING (line_no)
        WHERE f.line_no > ?
        ORDER BY f.line_no, f.flag
        """,
        [ctx.run_id, ctx.file_id, -1 if after_line is None else after_line],
    )
