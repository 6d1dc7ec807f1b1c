"""A run's timeline as a Chrome trace-event file, for Perfetto (ui.perfetto.dev) and chrome://tracing.

The file is the trace-event format's object form, `{"traceEvents": [...], "displayTimeUnit": "ms",
"otherData": {...}}`:

- a process per role (`actor`, `rollout`, `ref`, `critic`, `reward`, `driver`, ...) and one more,
  `run`, first, holding the step boundaries and the counters; every pid and tid is named by `M`
  events (`process_name`, `thread_name`, and sort indexes so ranks appear in order);
- a thread per rank (or per lane where the source gives no rank); a span that would overlap another
  on its thread without nesting in it goes to a second thread of the same rank (`... (2)`), so the
  `X` events of every thread nest;
- one `X` event per span: `ts` µs from the start of the exported steps, `dur` ≥ 0, `cat` the stage,
  `args` the step, stage, GPU busy ms, status, and whether the span was synthesized from stage
  timers (then also in the event's name, `gen (synthesized)`);
- one `X` event `step N` per step on the `run` process's `steps` thread, from the step's first start
  to its last end;
- `C` counters at each step's start, from the canonical step frame and the `steps` view: `tokens`
  (the step's total tokens), `lambda` (DP imbalance λ that sets the step's time), `longest
  response` (tokens). A counter the run does not log is left out.

Spans on different clocks (`wall`, or one file's own clock) cannot be lined up; each clock domain
starts at 0 and `otherData.clock_domains` names them. Event texts are built by polars
(`struct.json_encode`), so a 10,000-step run writes in a few seconds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import polars as pl

from polytrace_cli.analyze.common import ALL_STEPS, StepRange
from polytrace_cli.errors import PolytraceError
from polytrace_cli.store.catalog import steps_of_runs_sql
from polytrace_cli.store.queries import run_id as resolve_run

ROLE_ORDER = ("driver", "rollout", "actor", "ref", "critic", "reward", "trainer")
RUN_PID = 1


@dataclass
class ChromeTraceResult:
    """What a timeline export wrote."""

    path: Path
    events: int
    spans: int
    steps: int
    synthesized: bool


def _nesting_threads(threads: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
    """For spans sorted by (thread, t0, -t1): the extra-thread number (0 for the thread itself) that
    keeps every thread's spans nested: a span overlapping an open span it does not fit inside moves on."""
    out = np.zeros(len(t0), dtype=np.int64)
    stacks: dict[tuple, list[float]] = {}
    for i in range(len(t0)):
        level = 0
        while True:
            stack = stacks.setdefault((threads[i], level), [])
            while stack and stack[-1] <= t0[i]:
                stack.pop()
            if not stack or t1[i] <= stack[-1]:
                stack.append(t1[i])
                out[i] = level
                break
            level += 1
    return out


def export_chrome_trace(con: duckdb.DuckDBPyConnection, run: str, output: str | Path,
                        steps: StepRange = ALL_STEPS) -> ChromeTraceResult:
    """Write run `run`'s spans (read, or synthesized from its stage timers) in `steps` to `output`."""
    from polytrace_cli.analyze.step_frame import step_frame
    from polytrace_cli.analyze.timeline import run_spans

    run_id = resolve_run(con, run)
    path = Path(output)
    if path.exists() and path.is_dir():
        raise PolytraceError(f"{path} is a folder: --output names the file to write")
    if not path.parent.exists():
        raise PolytraceError(f"cannot write {path}: folder {path.parent} does not exist")
    spans = run_spans(con, [run_id], steps).filter(
        pl.col("step").is_not_null() if steps != ALL_STEPS else pl.lit(True))
    spans = spans.filter(pl.col("name") != "").sort("t0_us")
    if spans.is_empty():
        raise PolytraceError(f"run {run} has no spans and no stage timers{' in those steps' if steps != ALL_STEPS else ''}: "
                             "nothing to put on a timeline")
    synthesized = bool(spans.get_column("synthesized").all())
    origins = spans.group_by("domain").agg(pl.col("t0_us").min().alias("origin"))
    spans = spans.join(origins, on="domain").with_columns(ts=pl.col("t0_us") - pl.col("origin"),
                                                          end=pl.col("t1_us") - pl.col("origin"))
    roles = sorted(set(spans.get_column("role").to_list()),
                   key=lambda r: (ROLE_ORDER.index(r) if r in ROLE_ORDER else len(ROLE_ORDER), r))
    pids = {role: RUN_PID + 1 + i for i, role in enumerate(roles)}
    spans = spans.with_columns(
        pid=pl.col("role").replace_strict(pids, return_dtype=pl.Int64),
        label=pl.when(pl.col("rank").is_not_null()).then(pl.lit("rank ") + pl.col("rank").cast(pl.String))
        .otherwise(pl.coalesce("lane", pl.lit("all ranks"))),
        lane_text=pl.coalesce("lane", pl.lit("")),
    ).with_columns(thread=pl.col("pid").cast(pl.String) + pl.lit("|") + pl.col("label") + pl.lit("|") + pl.col("lane_text"))
    spans = spans.sort("thread", "ts", pl.col("end"), descending=[False, False, True])
    spans = spans.with_columns(level=pl.Series(_nesting_threads(
        spans.get_column("thread").to_numpy(), spans.get_column("ts").to_numpy(), spans.get_column("end").to_numpy())))
    threads = (spans.select("pid", "label", "lane_text", "thread", "level", "rank").unique()
               .sort("pid", pl.col("rank").fill_null(1 << 40), "label", "lane_text", "level"))
    lanes_per_label = threads.group_by("pid", "label").agg(pl.col("lane_text").n_unique().alias("lanes"))
    threads = threads.join(lanes_per_label, on=["pid", "label"]).with_columns(
        tid=pl.int_range(1, pl.len() + 1).over("pid"),
        name=pl.col("label")
        + pl.when(pl.col("lanes") > 1).then(pl.lit(" · ") + pl.col("lane_text")).otherwise(pl.lit(""))
        + pl.when(pl.col("level") > 0).then(pl.lit(" (") + (pl.col("level") + 1).cast(pl.String) + pl.lit(")"))
        .otherwise(pl.lit("")))
    spans = spans.join(threads.select("thread", "level", "tid"), on=["thread", "level"])
    suffix = pl.when(pl.col("synthesized")).then(pl.lit(" (synthesized)")).otherwise(pl.lit(""))
    x_events = spans.select(
        pl.struct(
            ph=pl.lit("X"), name=pl.col("name") + suffix, cat=pl.coalesce("stage", pl.lit("span")),
            pid="pid", tid="tid", ts=pl.col("ts").round(3), dur=(pl.col("end") - pl.col("ts")).clip(0).round(3),
            args=pl.struct(step="step", stage="stage", synthesized="synthesized",
                           gpu_busy_ms=(pl.col("busy_us") / 1000).round(3), status="status", domain="domain"),
        ).struct.json_encode().alias("event"))
    step_windows = (spans.filter(pl.col("step").is_not_null())
                    .group_by("step").agg(pl.col("ts").min().alias("ts"), pl.col("end").max().alias("end"))
                    .sort("step"))
    step_events = step_windows.select(
        pl.struct(ph=pl.lit("X"), name=pl.lit("step ") + pl.col("step").cast(pl.String), cat=pl.lit("step"),
                  pid=pl.lit(RUN_PID), tid=pl.lit(1), ts=pl.col("ts").round(3),
                  dur=(pl.col("end") - pl.col("ts")).clip(0).round(3),
                  args=pl.struct(step="step", synthesized=pl.lit(synthesized)))
        .struct.json_encode().alias("event"))
    counters = _counters(con, run_id, steps, step_frame)
    counter_events = pl.DataFrame(schema={"event": pl.String})
    if not counters.is_empty() and not step_windows.is_empty():
        placed = counters.join(step_windows.select("step", "ts"), on="step").sort("step")
        parts = []
        for name, column in (("tokens", "tokens"), ("lambda", "lambda"), ("longest response", "longest_response")):
            values = placed.filter(pl.col(column).is_not_null())
            if values.is_empty():
                continue
            parts.append(values.select(
                pl.struct(ph=pl.lit("C"), name=pl.lit(name), pid=pl.lit(RUN_PID), tid=pl.lit(0),
                          ts=pl.col("ts").round(3), args=pl.struct(pl.col(column).alias(name)))
                .struct.json_encode().alias("event")))
        if parts:
            counter_events = pl.concat(parts)
    metadata = _metadata(run, roles, pids, threads)
    events = pl.concat([metadata, step_events, x_events, counter_events])
    other = {"run": run, "synthesized": synthesized, "clock_domains": origins.sort("domain").get_column("domain").to_list(),
             "clock_origins_us": dict(zip(origins.get_column("domain").to_list(), origins.get_column("origin").to_list())),
             "written_by": "polytrace export --format chrome-trace"}
    with open(path, "w", encoding="utf-8") as handle:
        handle.write('{"displayTimeUnit": "ms", "otherData": ')
        handle.write(json.dumps(other))
        handle.write(', "traceEvents": [\n')
        handle.write(",\n".join(events.get_column("event").to_list()))
        handle.write("\n]}\n")
    return ChromeTraceResult(path, events.height, spans.height, step_windows.height, synthesized)


def _metadata(run: str, roles: list[str], pids: dict[str, int], threads: pl.DataFrame) -> pl.DataFrame:
    rows = [{"ph": "M", "name": "process_name", "pid": RUN_PID, "tid": 0, "args": {"name": f"run {run}"}},
            {"ph": "M", "name": "process_sort_index", "pid": RUN_PID, "tid": 0, "args": {"sort_index": 0}},
            {"ph": "M", "name": "thread_name", "pid": RUN_PID, "tid": 0, "args": {"name": "counters"}},
            {"ph": "M", "name": "thread_name", "pid": RUN_PID, "tid": 1, "args": {"name": "steps"}}]
    for role in roles:
        rows.append({"ph": "M", "name": "process_name", "pid": pids[role], "tid": 0, "args": {"name": role}})
        rows.append({"ph": "M", "name": "process_sort_index", "pid": pids[role], "tid": 0,
                     "args": {"sort_index": pids[role]}})
    for pid, tid, name in threads.select("pid", "tid", "name").iter_rows():
        rows.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        rows.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    return pl.DataFrame({"event": [json.dumps(row) for row in rows]})


def _counters(con: duckdb.DuckDBPyConnection, run_id: int, steps: StepRange, step_frame) -> pl.DataFrame:
    """(step, tokens, lambda, longest_response) of the run's training steps."""
    from polytrace_cli.analyze.common import frame

    canonical = step_frame(con, [run_id], steps).select("step", pl.col("lambda_tokens").alias("lambda"))
    logged = frame(con, f"""SELECT step::BIGINT AS step, max(total_tokens) AS tokens,
                                   max(response_length_max) AS longest_response
                            FROM ({steps_of_runs_sql(f"({int(run_id)})", ["total_tokens", "response_length_max"],
                                                     steps.sql())})
                            GROUP BY step""")
    return (logged.join(canonical.group_by("step").agg(pl.col("lambda").max()), on="step", how="full", coalesce=True)
            .filter(pl.col("step").is_not_null()))
