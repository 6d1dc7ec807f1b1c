"""A console log's step clock: the times printed at the start of its metric lines.

A metric line that starts with a time (`console_lines.STAMP_PATTERN`: Python logging's `asctime`,
slime's `[2025-10-30 10:00:00]`, `kubectl logs --timestamps`) says when its step's record was
printed. A step's console clock is the latest such time over its record's lines:

    logged_at(segment, step) = max over the step's stamped metric lines of stamp_seconds(line)

stored in `step_clock` with source 'console': the clock of a run without a tracker's, which the
engine samples and the untimed gaps read as they read a tracker's (analyze/engine.py,
analyze/consistency.py). A time without a zone is read as UTC, and the file's run meta says so
(`console_clock`). A step whose lines carry no time has no console clock. A time is when the line
reached whatever printed it: a log where two steps' records carry times closer than BUFFERED_GAP_S
was stamped as block-buffered output arrived (Python's stdout to a pipe without PYTHONUNBUFFERED=1),
and gets no console clock (noted), since its times say when chunks were delivered, not when steps ended.
"""

from __future__ import annotations

from polytrace_cli.lazy import polars as pl

from polytrace_cli.ingest import console_lines as cl
from polytrace_cli.ingest.arrow import ArrowStream
from polytrace_cli.ingest.base import FileContext
from polytrace_cli.store.queries import CONSOLE_CLOCK

# Two steps' records printed closer than this were not printed as each step ended: the times are those
# of a tool stamping the chunks a block-buffered stdout delivered (no step of a training run is this short).
BUFFERED_GAP_S = 0.05
ZONED, UTC_ASSUMED = "printed times with their zone", "printed times without a zone, read as UTC"


def stamped_lines(lines: pl.DataFrame) -> pl.DataFrame:
    """The metric lines of classified `lines` that start with a time: line_no, stamp."""
    if "stamp" not in lines.columns:
        return pl.DataFrame(schema={"line_no": pl.Int64, "stamp": pl.String})
    return lines.filter(pl.col("stamp").is_not_null()).select("line_no", "stamp")


def store_console_clock(ctx: FileContext, stamps: pl.DataFrame) -> None:
    """Insert the console clock (module docstring) of the steps this read stored in `step_metrics`
    from the stamped lines `stamps` (line_no, stamp), and name how its times were read in the run meta."""
    if not stamps.height:
        return
    timed = stamps.select("line_no", logged_at=cl.stamp_seconds(pl.col("stamp")),
                          zoned=cl.stamp_has_zone(pl.col("stamp"))).filter(pl.col("logged_at").is_not_null())
    if not timed.height:
        return
    ctx.begin_writes()
    ctx.con.register("_console_stamps", ArrowStream(timed.select("line_no", "logged_at")))
    try:
        clock = pl.DataFrame(ctx.con.execute(
            """SELECT sm.run_id, sm.segment, sm.step, max(t.logged_at) AS logged_at
               FROM step_metrics sm JOIN _console_stamps t ON t.line_no = sm.line_no
               WHERE sm.file_id = ? AND isfinite(t.logged_at) GROUP BY ALL ORDER BY ALL""", [ctx.file_id]).fetchall(),
            schema={"run_id": pl.Int64, "segment": pl.Int64, "step": pl.Int64, "logged_at": pl.Float64}, orient="row")
    finally:
        ctx.con.unregister("_console_stamps")
    together = clock.filter((pl.col("logged_at") - pl.col("logged_at").shift(1).over("run_id", "segment")).abs()
                            < BUFFERED_GAP_S).height
    if together:
        ctx.note(f"no console clock: {together} step(s) printed within {BUFFERED_GAP_S} s of the step before, so"
                 " the printed times are when buffered output was delivered, not when each step ended")
        return
    ctx.con.register("_console_clock", ArrowStream(clock))
    try:
        ctx.con.execute("INSERT INTO step_clock (run_id, file_id, segment, step, logged_at, source)"
                        " SELECT run_id, ?, segment, step, logged_at, ? FROM _console_clock",
                        [ctx.file_id, CONSOLE_CLOCK])
    finally:
        ctx.con.unregister("_console_clock")
    ctx.run_meta["console_clock"] = ZONED if timed.get_column("zoned").all() else UTC_ASSUMED
