"""Writing a file's step metrics from one frame, for formats that read whole documents (a
trainer_state.json, a wandb record log, an MLflow store) rather than console lines."""

from __future__ import annotations

from polytrace_cli.lazy import polars as pl

from polytrace_cli.ingest.arrow import ArrowStream
from polytrace_cli.ingest.base import FileContext
from polytrace_cli.store.queries import CONSOLE_CLOCK, TRACKER_CLOCK


def with_segments(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` (line_no, step, ...) with `segment`: a step lower than the previous entry's starts one."""
    steps = frame.select("line_no", "step").unique("line_no", maintain_order=True).with_columns(
        segment=(pl.col("step") < pl.col("step").shift(1)).fill_null(False).cast(pl.Int32).cum_sum())
    return frame.join(steps.select("line_no", "segment"), on="line_no", how="left", maintain_order="left")


def store_step_rows(ctx: FileContext, frame: pl.DataFrame, view: str, run_id: int | None = None) -> None:
    """Insert `frame` (segment, step, key, value, text_value, line_no) into `step_metrics`, for
    the file's run or `run_id`."""
    if not frame.height:
        ctx.note("no logged steps")
        return
    ctx.con.register(view, ArrowStream(frame))
    try:
        ctx.insert(
            "INSERT INTO step_metrics (run_id, segment, step, key, value, text_value, file_id, line_no)"
            f" SELECT ?, segment, step, key, value, text_value, ?, line_no FROM {view}",
            [ctx.run_id if run_id is None else run_id, ctx.file_id],
        )
    finally:
        ctx.con.unregister(view)


def store_step_clock(ctx: FileContext, frame: pl.DataFrame, view: str, run_id: int | None = None,
                     source: str = TRACKER_CLOCK) -> None:
    """Insert into `step_clock` the latest `logged_at` (seconds since the epoch) of each (segment, step)
    of `frame`: when the source wrote the step's records, a tracker's timestamps (`TRACKER_CLOCK`) or a
    console log's printed times (`CONSOLE_CLOCK`). A side fact of the file's rows, not counted among them."""
    if not frame.height:
        return
    ctx.begin_writes()
    ctx.con.register(view, ArrowStream(frame.select("segment", "step", "logged_at")))
    try:
        ctx.con.execute(
            "INSERT INTO step_clock (run_id, file_id, segment, step, logged_at, source)"
            f" SELECT ?, ?, segment, step, max(logged_at), ? FROM {view}"
            " WHERE logged_at IS NOT NULL AND isfinite(logged_at) GROUP BY segment, step",
            [ctx.run_id if run_id is None else run_id, ctx.file_id, source])
    finally:
        ctx.con.unregister(view)


def store_engine_samples(ctx: FileContext, samples: pl.DataFrame, view: str, run_id: int | None = None) -> None:
    """Insert `samples` (line_no, ts, engine, instance, name, metric, labels, value) into `engine_metrics`
    for the file's run or `run_id`: series sampled on the wall clock (engines' Prometheus series, trackers'
    system metrics), joined to steps by time."""
    if not samples.height:
        return
    ctx.con.register(view, ArrowStream(samples.select("line_no", "ts", "engine", "instance", "name", "metric",
                                                      "labels", "value")))
    try:
        ctx.insert(
            "INSERT INTO engine_metrics (run_id, file_id, line_no, ts, engine, instance, name, metric, labels, value)"
            f" SELECT ?, ?, line_no, ts, engine, instance, name, metric, labels, value FROM {view}",
            [ctx.run_id if run_id is None else run_id, ctx.file_id])
    finally:
        ctx.con.unregister(view)
