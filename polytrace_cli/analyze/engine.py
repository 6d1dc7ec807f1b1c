"""The inference engines during each step's rollout: concurrency, the tail, KV pressure, queueing.

Engine samples (`engine_metrics`: vLLM's and SGLang's Prometheus series) are joined to a run's steps
on the wall clock. A step's window ends when its records were logged (`step_clock.logged_at`, the
latest over the run's files) and lasts its step time: `[logged_at − step_s, logged_at]`; its rollout
is the first `gen_s` seconds of it (generation opens a synchronous step), or the whole window when
the step logs no generation time. A step without such a clock takes its window from its wall-clock
spans (profiler and tracer ranges: from the first start to the last end, its rollout to the last end
of its `gen` spans). Each replica's gauge holds its value from one sample to the next
(for at most `HOLD_SCRAPES` times the replica's usual gap between samples); at every instant the
engines' concurrency is the sum over replicas of `requests_running`. Per step (`STEP_COLUMNS`):

    running_mean        time-weighted mean concurrency over the covered rollout
    running_min, running_peak
    low_share           share of the covered rollout with concurrency ≤ LOW_SHARE_OF_PEAK × running_peak
    tail_share          share of the covered rollout after its last moment above that level: the
                        rollout's end spent waiting for its slowest requests
    waiting_mean        time-weighted mean of `requests_waiting` (queued requests), summed over replicas
    kv_usage_max        the highest `kv_cache_usage` (0..1) of any replica
    kv_full_share       share of the covered rollout with some replica's KV cache ≥ KV_FULL
    preemptions         rise of `preemptions_total` over the rollout, summed over replicas
    covered_share       share of the rollout window the samples cover (held values)
    scrapes             samples of `requests_running` inside the rollout
    gpu_utilization_mean  time-weighted mean over the whole step window of the GPUs' utilization (0..1) as
                        the trackers' system metrics record it (MLflow's `system/gpu_<i>_utilization_percentage`,
                        wandb's `gpu.<i>.gpu`), averaged over GPUs
    engine_state        'full' when the KV cache bound the rollout (kv_full_share ≥ STATE_SHARE, or
                        preemptions while requests queued), else 'tail' (tail_share ≥ STATE_SHARE),
                        else 'busy'; null when the samples cover less than MIN_COVERED of the rollout

The summary (`SUMMARY_COLUMNS`) is one row per run with engine samples: the steps joined, the
rollout-time-weighted low and tail shares, the steps in each state, the peak KV usage and the
preemptions in all.
"""

from __future__ import annotations

import duckdb
import polars as pl

from polytrace_cli.analyze.common import ALL_STEPS, StepRange, ids_sql, run_names, step_clock_sql
from polytrace_cli.analyze.registry import register
from polytrace_cli.analyze.step_frame import shared_step_frame
from polytrace_cli.store.catalog import steps_of_runs_sql
from polytrace_cli.store.queries import CONSOLE_CLOCK, TRACKER_CLOCK

LOW_SHARE_OF_PEAK = 0.10
KV_FULL = 0.95
STATE_SHARE = 0.20
MIN_COVERED = 0.5
HOLD_SCRAPES = 3.0

STEP_COLUMNS: dict[str, pl.DataType] = {
    "run": pl.String, "segment": pl.Int64, "step": pl.Int64,
    "window_start": pl.Float64, "window_end": pl.Float64, "rollout_end": pl.Float64, "rollout_s": pl.Float64,
    "running_mean": pl.Float64, "running_min": pl.Float64, "running_peak": pl.Float64,
    "low_share": pl.Float64, "tail_share": pl.Float64, "waiting_mean": pl.Float64,
    "kv_usage_max": pl.Float64, "kv_full_share": pl.Float64, "preemptions": pl.Float64,
    "covered_share": pl.Float64, "scrapes": pl.Int64, "engine_state": pl.String,
    "gpu_utilization_mean": pl.Float64,
}
SUMMARY_COLUMNS: dict[str, pl.DataType] = {
    "run": pl.String, "steps_joined": pl.Int64, "replicas": pl.Int64, "low_share": pl.Float64,
    "tail_share": pl.Float64, "tail_steps": pl.Int64, "full_steps": pl.Int64, "kv_usage_max": pl.Float64,
    "preemptions": pl.Float64, "gpu_utilization_mean": pl.Float64, "samples_outside_steps": pl.Int64,
    "basis": pl.String,
}
TAIL_SHARE = "tail_share"


WINDOW_COLUMNS = {"run_id": pl.Int64, "segment": pl.Int64, "step": pl.Int64, "window_start": pl.Float64,
                  "window_end": pl.Float64, "rollout_end": pl.Float64}


def step_windows(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """Per (run, segment, step) with a wall clock: run_id, segment, step, window_start, window_end,
    rollout_end. From the step's records' clock (`step_clock_sql`) and its step time: window_start =
    logged_at − step_s, window_end = logged_at, rollout_end = window_start + gen_s (window_end without
    gen_s). A tracker's clock comes first; for a step without one, from its spans on the wall clock
    (profiler or tracer ranges read, never synthesized ones): window_start = the earliest span start,
    window_end = the latest span end, rollout_end = the latest end of its `gen` spans (window_end
    without any); last, from its console clock (the times its console lines were printed with), as
    from a tracker's."""
    ids = ids_sql(run_ids)
    names = run_names(con, run_ids)
    clock = con.sql(step_clock_sql(run_ids, steps)).pl()
    windows = consoled = pl.DataFrame(schema=WINDOW_COLUMNS)
    if clock.height:
        timed = shared_step_frame(con, run_ids, steps).select("run", "segment", "step", "step_s")
        gen = con.sql(f"SELECT run_id, segment, step, gen_s FROM ({steps_of_runs_sql(ids, ['gen_s'])})").pl()
        clock = clock.with_columns(run=pl.col("run_id").replace_strict(names, return_dtype=pl.String),
                                   segment=pl.col("segment").cast(pl.Int64), step=pl.col("step").cast(pl.Int64))
        joined = clock.join(timed, on=["run", "segment", "step"], how="inner").join(
            gen.with_columns(pl.col("segment", "step").cast(pl.Int64)), on=["run_id", "segment", "step"], how="left")
        clocked = joined.filter(pl.col("step_s").is_not_null() & (pl.col("step_s") > 0)).select(
            pl.col("run_id").cast(pl.Int64), "segment", "step", "source",
            window_start=pl.col("logged_at") - pl.col("step_s"), window_end="logged_at",
            rollout_end=pl.when(pl.col("gen_s").is_not_null() & (pl.col("gen_s") > 0))
            .then(pl.min_horizontal(pl.col("logged_at") - pl.col("step_s") + pl.col("gen_s"), pl.col("logged_at")))
            .otherwise(pl.col("logged_at")),
        )
        windows = clocked.filter(pl.col("source") == TRACKER_CLOCK).drop("source").cast(WINDOW_COLUMNS)
        consoled = clocked.filter(pl.col("source") == CONSOLE_CLOCK).drop("source").cast(WINDOW_COLUMNS)
    spanned = con.sql(f"""
        WITH w AS (
            SELECT run_id, step, min(t0_us) / 1e6 AS window_start, max(t1_us) / 1e6 AS window_end,
                   max(t1_us) FILTER (WHERE stage = 'gen') / 1e6 AS gen_end
            FROM spans WHERE run_id IN {ids} AND clock = 'wall' AND step IS NOT NULL AND NOT synthesized
                         AND {steps.sql()}
            GROUP BY ALL
        ), seg AS (SELECT run_id, step, max(segment) AS segment FROM ({steps_of_runs_sql(ids, [])}) GROUP BY ALL)
        SELECT w.run_id::BIGINT AS run_id, coalesce(seg.segment, 0)::BIGINT AS segment, w.step::BIGINT AS step,
               w.window_start, w.window_end, coalesce(w.gen_end, w.window_end) AS rollout_end
        FROM w LEFT JOIN seg USING (run_id, step) WHERE w.window_end > w.window_start""").pl().cast(WINDOW_COLUMNS)
    keys = ["run_id", "segment", "step"]
    for lower in (spanned, consoled):
        if lower.height:
            windows = pl.concat([windows, lower.join(windows.select(keys), on=keys, how="anti")])
    return windows.sort(keys)


def _held_intervals(metric: str, how: str, end: str = "rollout_end") -> str:
    """SQL over `_engine_windows` and `_engine_samples`: the intervals of each step's window up to `end`
    (the rollout's end, or the window's) between breakpoints (samples and window edges), with the
    replicas' held `metric` combined by `how` ('sum', 'max' or 'avg')."""
    return f"""
    WITH s AS (SELECT run_id, instance, ts, value FROM _engine_samples WHERE metric = '{metric}'),
    gaps AS (SELECT run_id, instance, median(ts_next - ts) AS usual
             FROM (SELECT *, lead(ts) OVER (PARTITION BY run_id, instance ORDER BY ts) AS ts_next FROM s)
             WHERE ts_next IS NOT NULL GROUP BY ALL),
    points AS (
        SELECT w.run_id, w.segment, w.step, s.ts AS t FROM _engine_windows w
        JOIN s ON s.run_id = w.run_id AND s.ts > w.window_start AND s.ts < w.{end}
        UNION SELECT run_id, segment, step, window_start FROM _engine_windows
        UNION SELECT run_id, segment, step, {end} FROM _engine_windows
    ),
    spans AS (
        SELECT run_id, segment, step, t, lead(t) OVER (PARTITION BY run_id, segment, step ORDER BY t) AS t_next
        FROM points
    ),
    replicas AS (SELECT DISTINCT run_id, instance FROM s),
    held AS (
        SELECT sp.run_id, sp.segment, sp.step, sp.t, sp.t_next, r.instance, h.value, h.ts AS sampled_at
        FROM spans sp JOIN replicas r ON r.run_id = sp.run_id
        ASOF LEFT JOIN s h ON h.run_id = sp.run_id AND h.instance = r.instance AND h.ts <= sp.t
        WHERE sp.t_next IS NOT NULL AND sp.t_next > sp.t
    )
    SELECT h.run_id, h.segment, h.step, h.t, h.t_next, {how}(h.value) AS value, count(h.value) AS replicas
    FROM held h LEFT JOIN gaps g ON g.run_id = h.run_id AND g.instance = h.instance
    WHERE h.value IS NOT NULL AND h.t - h.sampled_at <= {HOLD_SCRAPES} * coalesce(g.usual, 0) + 1e-9
    GROUP BY ALL
    """


def per_step(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """One row per step whose rollout the engine samples reach (`STEP_COLUMNS`, see the module docstring)."""
    empty = pl.DataFrame(schema=STEP_COLUMNS)
    has_samples = con.execute(f"SELECT count(*) FROM engine_metrics WHERE run_id IN {ids_sql(run_ids)}").fetchall()[0][0]
    if not has_samples:
        return empty
    windows = step_windows(con, run_ids, steps)
    if not windows.height:
        return empty
    con.register("_engine_windows", windows)
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _engine_samples AS
                    SELECT run_id, instance, ts, metric, value FROM engine_metrics
                    WHERE run_id IN {ids_sql(run_ids)} AND metric IS NOT NULL""")
    try:
        running = con.sql(_held_intervals("requests_running", "sum")).pl()
        waiting = con.sql(_held_intervals("requests_waiting", "sum")).pl()
        kv = con.sql(_held_intervals("kv_cache_usage", "max")).pl()
        gpu = con.sql(_held_intervals("gpu_utilization", "avg", "window_end")).pl()
        preemptions = con.sql("""
            SELECT w.run_id, w.segment, w.step, sum(rise) AS preemptions FROM _engine_windows w JOIN (
                SELECT run_id, instance, ts, value - lag(value) OVER (PARTITION BY run_id, instance ORDER BY ts) AS rise
                FROM _engine_samples WHERE metric = 'preemptions_total') p
              ON p.run_id = w.run_id AND p.ts > w.window_start AND p.ts <= w.rollout_end
            WHERE rise >= 0 GROUP BY ALL""").pl()
        scrapes = con.sql("""
            SELECT w.run_id, w.segment, w.step, count(*) AS scrapes FROM _engine_windows w JOIN _engine_samples s
              ON s.run_id = w.run_id AND s.metric = 'requests_running' AND s.ts >= w.window_start AND s.ts <= w.rollout_end
            GROUP BY ALL""").pl()
    finally:
        con.unregister("_engine_windows")
        con.execute("DROP TABLE IF EXISTS _engine_samples")
    keys = ["run_id", "segment", "step"]
    out = windows.with_columns(rollout_s=pl.col("rollout_end") - pl.col("window_start"))
    if running.height:
        dur = pl.col("t_next") - pl.col("t")
        shaped = running.with_columns(dur=dur, peak=pl.col("value").max().over(keys))
        low = pl.col("value") <= LOW_SHARE_OF_PEAK * pl.col("peak")
        stats = shaped.group_by(keys).agg(
            covered=pl.col("dur").sum(),
            running_mean=(pl.col("value") * pl.col("dur")).sum() / pl.col("dur").sum(),
            running_min=pl.col("value").min(), running_peak=pl.col("value").max(),
            low_s=pl.col("dur").filter(low).sum(),
            last_high_end=pl.col("t_next").filter(~low).max(),
        )
        out = out.join(stats, on=keys, how="left")
    else:
        out = out.with_columns(covered=pl.lit(None, pl.Float64), running_mean=pl.lit(None, pl.Float64),
                               running_min=pl.lit(None, pl.Float64), running_peak=pl.lit(None, pl.Float64),
                               low_s=pl.lit(None, pl.Float64), last_high_end=pl.lit(None, pl.Float64))
    out = out.join(_weighted(waiting, keys, "waiting_mean"), on=keys, how="left")
    out = out.join(_weighted(gpu, keys, "gpu_utilization_mean"), on=keys, how="left")
    out = out.join(_kv(kv, keys), on=keys, how="left")
    out = out.join(preemptions.with_columns(pl.col("segment", "step").cast(pl.Int64)), on=keys, how="left")
    out = out.join(scrapes.with_columns(pl.col("segment", "step").cast(pl.Int64)), on=keys, how="left")
    covered = pl.col("covered")
    out = out.with_columns(
        covered_share=covered / pl.col("rollout_s"),
        low_share=pl.col("low_s") / covered,
        tail_share=((pl.col("rollout_end") - pl.col("last_high_end")).clip(lower_bound=0) / covered),
        preemptions=pl.col("preemptions").fill_null(0.0),
        scrapes=pl.col("scrapes").fill_null(0).cast(pl.Int64),
    )
    tail = pl.col("tail_share") >= STATE_SHARE
    full = (pl.col("kv_full_share").fill_null(0) >= STATE_SHARE) | (
        (pl.col("preemptions") > 0) & (pl.col("waiting_mean").fill_null(0) > 0))
    out = out.with_columns(engine_state=pl.when(pl.col("covered_share").fill_null(0) < MIN_COVERED).then(None)
                           .when(full).then(pl.lit("full")).when(tail).then(pl.lit("tail"))
                           .otherwise(pl.lit("busy")))
    names = run_names(con, run_ids)
    return out.with_columns(run=pl.col("run_id").replace_strict(names, return_dtype=pl.String)) \
        .select(list(STEP_COLUMNS)).cast(STEP_COLUMNS).sort("run", "segment", "step")


def _weighted(frame: pl.DataFrame, keys: list[str], name: str) -> pl.DataFrame:
    if not frame.height:
        return pl.DataFrame(schema={**{k: pl.Int64 for k in keys}, name: pl.Float64})
    dur = pl.col("t_next") - pl.col("t")
    return frame.with_columns(dur=dur).group_by(keys).agg(
        ((pl.col("value") * pl.col("dur")).sum() / pl.col("dur").sum()).alias(name)
    ).with_columns(pl.col(keys).cast(pl.Int64))


def _kv(frame: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    if not frame.height:
        return pl.DataFrame(schema={**{k: pl.Int64 for k in keys}, "kv_usage_max": pl.Float64,
                                    "kv_full_share": pl.Float64})
    dur = pl.col("t_next") - pl.col("t")
    return frame.with_columns(dur=dur).group_by(keys).agg(
        kv_usage_max=pl.col("value").max(),
        kv_full_share=pl.col("dur").filter(pl.col("value") >= KV_FULL).sum() / pl.col("dur").sum(),
    ).with_columns(pl.col(keys).cast(pl.Int64))


@register("engine", "inference engines during each rollout: concurrency, the tail, KV cache, preemptions")
def summary(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """One row per run with engine samples (`SUMMARY_COLUMNS`): low_share and tail_share weighted by
    each step's covered rollout seconds; samples_outside_steps counts `requests_running` samples in no
    step's window (between steps, or beyond the logged steps)."""
    rows = []
    detail = per_step(con, run_ids, steps)
    names = run_names(con, run_ids)
    counts = dict(con.execute(f"""SELECT run_id, count(DISTINCT instance) FILTER (WHERE metric = 'requests_running')
                                  FROM engine_metrics WHERE run_id IN {ids_sql(run_ids)} GROUP BY ALL""").fetchall())
    clocks = {run_id: (source, zone) for run_id, source, zone in con.execute(f"""
        SELECT c.run_id, any_value(c.source), any_value(json_extract_string(r.meta, '$.console_clock'))
        FROM ({step_clock_sql(run_ids, steps)}) c JOIN runs r USING (run_id) GROUP BY ALL""").fetchall()}
    for run_id, name in sorted(names.items(), key=lambda item: item[1]):
        if run_id not in counts:
            continue
        own = detail.filter((pl.col("run") == name) & pl.col("engine_state").is_not_null())
        weight = own.get_column("rollout_s") * own.get_column("covered_share")
        total = float(weight.sum()) if own.height else 0.0
        outside = _outside(con, run_id, detail.filter(pl.col("run") == name))
        rows.append({
            "run": name, "steps_joined": own.height, "replicas": counts[run_id],
            "low_share": float((own.get_column("low_share") * weight).sum() / total) if total else None,
            "tail_share": float((own.get_column("tail_share") * weight).sum() / total) if total else None,
            "tail_steps": own.filter(pl.col("engine_state") == "tail").height,
            "full_steps": own.filter(pl.col("engine_state") == "full").height,
            "kv_usage_max": own.get_column("kv_usage_max").max() if own.height else None,
            "preemptions": float(own.get_column("preemptions").sum()) if own.height else None,
            "gpu_utilization_mean": _mean_gpu(detail.filter(pl.col("run") == name)),
            "samples_outside_steps": outside,
            "basis": _basis(clocks.get(run_id)) if own.height
            else "engine samples, but no step with a wall clock and a step time to join them to",
        })
    return pl.DataFrame(rows, schema=SUMMARY_COLUMNS)


def _basis(clock: tuple[str, str | None] | None) -> str:
    """What the samples were joined on: the steps' tracker clock, or the console's printed times (and
    how they were read)."""
    if clock is not None and clock[0] == CONSOLE_CLOCK:
        return f"engine samples joined on the steps' wall clock: the console log's {clock[1] or 'printed times'}"
    return "engine samples joined on the steps' wall clock"


def _mean_gpu(detail: pl.DataFrame) -> float | None:
    """The run's GPU utilization: the step windows' means weighted by their seconds."""
    timed = detail.filter(pl.col("gpu_utilization_mean").is_not_null())
    if not timed.height:
        return None
    seconds = timed["window_end"] - timed["window_start"]
    return float((timed["gpu_utilization_mean"] * seconds).sum() / seconds.sum())


def _outside(con: duckdb.DuckDBPyConnection, run_id: int, detail: pl.DataFrame) -> int:
    """`requests_running` samples of the run that fall in none of the steps' windows."""
    windows = detail.select("window_start", "window_end")
    con.register("_engine_step_windows", windows)
    try:
        return con.execute(
            """SELECT count(*) FROM engine_metrics e WHERE e.run_id = ? AND e.metric = 'requests_running'
               AND NOT EXISTS (SELECT 1 FROM _engine_step_windows w WHERE e.ts >= w.window_start AND e.ts <= w.window_end)""",
            [run_id]).fetchall()[0][0]
    finally:
        con.unregister("_engine_step_windows")
