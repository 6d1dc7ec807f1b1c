"""Tool calling in multi-turn runs: latency per tool, turns and calls per trajectory, time in tools
versus generation, prefix-cache hits by turn, and finish reasons.

Reads `tool_calls` (one row per tool invocation), `turns` (one row per generation turn) and
`samples` (one row per trajectory; multi-turn trajectories are the rows with `turns` set). All
trajectories of the selected steps count, training and validation alike (turns and tool calls
carry no validation flag).
"""

from __future__ import annotations

import duckdb
import polars as pl

from polytrace_cli.analyze.common import ALL_STEPS, StepRange, frame
from polytrace_cli.analyze.registry import register

ALL_TOOLS = "all"
CDF_POINTS = 101

_CALLS = """
    SELECT run_id, coalesce(tool_name, 'unknown') AS tool_name, latency_s, status
    FROM tool_calls WHERE run_id IN (SELECT unnest(?)) AND {steps}
"""


def latency(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """Per run × tool, and per run over all tools (tool = 'all'): calls, timed_calls (latency
    logged), mean_s, p50_s, p90_s, p99_s (linear quantiles), max_s, cv = std_samp/mean, and
    error_share = calls whose status is neither 'success' nor NULL / calls."""
    return frame(
        con,
        f"""
        WITH c AS ({_CALLS.format(steps=steps.sql())})
        SELECT runs.name AS run, coalesce(tool_name, '{ALL_TOOLS}') AS tool, count(*)::BIGINT AS calls,
               count(latency_s)::BIGINT AS timed_calls, avg(latency_s) AS mean_s,
               quantile_cont(latency_s, 0.5) AS p50_s, quantile_cont(latency_s, 0.9) AS p90_s,
               quantile_cont(latency_s, 0.99) AS p99_s, max(latency_s) AS max_s,
               stddev_samp(latency_s) / nullif(avg(latency_s), 0) AS cv,
               count(*) FILTER (WHERE status IS NOT NULL AND status != 'success') / count(*) AS error_share
        FROM c JOIN runs USING (run_id)
        GROUP BY GROUPING SETS ((runs.name, tool_name), (runs.name))
        ORDER BY run, tool = '{ALL_TOOLS}', tool
        """,
        [run_ids],
    )


LATENCY_CDF_COLUMNS = {
    "run": pl.String, "tool": pl.String, "cdf": pl.Float64, "latency_s": pl.Float64,
}


def latency_cdf(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """F8 latency CDF per run × tool: 101 points (cdf = 0, 0.01, ..., 1) with
    latency_s = the linear quantile of the tool's call latencies at cdf."""
    levels = [i / (CDF_POINTS - 1) for i in range(CDF_POINTS)]
    return frame(
        con,
        f"""
        WITH c AS ({_CALLS.format(steps=steps.sql())}),
        q AS (
            SELECT run_id, tool_name, quantile_cont(latency_s, ?::DOUBLE[]) AS latencies
            FROM c WHERE latency_s IS NOT NULL GROUP BY run_id, tool_name
        )
        SELECT runs.name AS run, tool_name AS tool, unnest(?::DOUBLE[]) AS cdf, unnest(latencies) AS latency_s
        FROM q JOIN runs USING (run_id)
        ORDER BY run, tool, cdf
        """,
        [run_ids, levels, levels],
    )


PER_TRAJECTORY_COLUMNS = {
    "run": pl.String, "measure": pl.String, "value": pl.Int64, "trajectories": pl.Int64, "share": pl.Float64,
}


def per_trajectory(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """F8 distributions over multi-turn trajectories (samples with `turns` set): per run ×
    measure ('turns', 'tool_calls') × value: trajectories with that many, and share of the run's
    trajectories."""
    return frame(
        con,
        f"""
        WITH t AS (
            SELECT run_id, turns, tool_calls FROM samples
            WHERE run_id IN (SELECT unnest(?)) AND {steps.sql()} AND turns IS NOT NULL
        ),
        long AS (UNPIVOT t ON turns, tool_calls INTO NAME measure VALUE value)
        SELECT runs.name AS run, measure, value::BIGINT AS value, count(*)::BIGINT AS trajectories,
               count(*) / sum(count(*)) OVER (PARTITION BY run_id, measure) AS share
        FROM long JOIN runs USING (run_id)
        GROUP BY runs.name, run_id, measure, value
        ORDER BY run, measure, value
        """,
        [run_ids],
    )


def time_split(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """Per run: tool_s = Σ tool-call latency_s, generation_s = Σ turn engine_latency_s,
    tool_share = tool_s / (tool_s + generation_s); trajectories and mean turns and tool calls
    per trajectory."""
    where = f"run_id IN (SELECT unnest(?)) AND {steps.sql()}"
    return frame(
        con,
        f"""
        WITH tool AS (SELECT run_id, sum(latency_s) AS tool_s FROM tool_calls WHERE {where} GROUP BY run_id),
        gen AS (SELECT run_id, sum(engine_latency_s) AS generation_s FROM turns WHERE {where} GROUP BY run_id),
        traj AS (
            SELECT run_id, count(*)::BIGINT AS trajectories, avg(turns) AS mean_turns,
                   avg(tool_calls) AS mean_tool_calls
            FROM samples WHERE {where} AND turns IS NOT NULL GROUP BY run_id
        )
        SELECT runs.name AS run, traj.trajectories, traj.mean_turns, traj.mean_tool_calls,
               coalesce(tool.tool_s, 0) AS tool_s, gen.generation_s,
               coalesce(tool.tool_s, 0) / nullif(coalesce(tool.tool_s, 0) + gen.generation_s, 0) AS tool_share
        FROM traj JOIN runs USING (run_id)
        LEFT JOIN tool USING (run_id) LEFT JOIN gen USING (run_id)
        ORDER BY run
        """,
        [run_ids, run_ids, run_ids],
    )


CACHE_BY_TURN_COLUMNS = {
    "run": pl.String, "turn": pl.Int64, "turns": pl.Int64, "prompt_tokens": pl.Int64,
    "cached_tokens": pl.Int64, "hit_ratio": pl.Float64,
}


def cache_by_turn(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """F8 prefix-cache hit ratio per run × turn index: turns, prompt_tokens = Σ prompt_tokens,
    cached_tokens = Σ cached_tokens, hit_ratio = cached_tokens / prompt_tokens (over turns that
    logged both)."""
    return frame(
        con,
        f"""
        SELECT runs.name AS run, turn::BIGINT AS turn, count(*)::BIGINT AS turns,
               sum(prompt_tokens)::BIGINT AS prompt_tokens, sum(cached_tokens)::BIGINT AS cached_tokens,
               sum(cached_tokens) / nullif(sum(prompt_tokens), 0) AS hit_ratio
        FROM turns JOIN runs USING (run_id)
        WHERE run_id IN (SELECT unnest(?)) AND {steps.sql()}
          AND prompt_tokens IS NOT NULL AND cached_tokens IS NOT NULL
        GROUP BY runs.name, turn
        ORDER BY run, turn
        """,
        [run_ids],
    )


def finish_reasons(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """Per run × trajectory finish_reason (multi-turn samples): trajectories and share."""
    return frame(
        con,
        f"""
        SELECT runs.name AS run, coalesce(finish_reason, 'unknown') AS finish_reason,
               count(*)::BIGINT AS trajectories, count(*) / sum(count(*)) OVER (PARTITION BY run_id) AS share
        FROM samples JOIN runs USING (run_id)
        WHERE run_id IN (SELECT unnest(?)) AND {steps.sql()} AND turns IS NOT NULL
        GROUP BY runs.name, run_id, finish_reason
        ORDER BY run, trajectories DESC, finish_reason
        """,
        [run_ids],
    )


PER_STEP_COLUMNS = {
    "run": pl.String, "step": pl.Int64, "tool_calls": pl.Int64, "tool_latency_mean_s": pl.Float64,
    "tool_latency_p99_s": pl.Float64, "prefix_cache_hit_ratio": pl.Float64,
}


def per_step(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """Per run × step of a multi-turn run: tool_calls, tool_latency_mean_s and tool_latency_p99_s
    (linear quantile) over the step's timed calls, and prefix_cache_hit_ratio = Σ cached_tokens /
    Σ prompt_tokens over the step's turns that logged both (the `cache_by_turn` ratio, per step)."""
    return frame(
        con,
        f"""
        WITH calls AS (
            SELECT run_id, step, count(*)::BIGINT AS tool_calls, avg(latency_s) AS tool_latency_mean_s,
                   quantile_cont(latency_s, 0.99) AS tool_latency_p99_s
            FROM tool_calls WHERE run_id IN (SELECT unnest($runs)) AND {steps.sql()} GROUP BY ALL
        ), cache AS (
            SELECT run_id, step, sum(cached_tokens) / nullif(sum(prompt_tokens), 0) AS prefix_cache_hit_ratio
            FROM turns
            WHERE run_id IN (SELECT unnest($runs)) AND {steps.sql()}
              AND prompt_tokens IS NOT NULL AND cached_tokens IS NOT NULL
            GROUP BY ALL
        )
        SELECT runs.name AS run, step::BIGINT AS step, coalesce(calls.tool_calls, 0)::BIGINT AS tool_calls,
               calls.tool_latency_mean_s, calls.tool_latency_p99_s, cache.prefix_cache_hit_ratio
        FROM calls FULL JOIN cache USING (run_id, step) JOIN runs USING (run_id)
        ORDER BY run, step
        """,
        {"runs": run_ids},
    ).cast(PER_STEP_COLUMNS)


P99_S = "p99_s"  # read by `polytrace check`
SUMMARY_COLUMNS = {
    "run": pl.String, "basis": pl.String, "tool": pl.String, "calls": pl.Int64, "mean_s": pl.Float64,
    "p50_s": pl.Float64, "p90_s": pl.Float64, P99_S: pl.Float64, "max_s": pl.Float64, "cv": pl.Float64,
    "error_share": pl.Float64, "trajectories": pl.Int64, "mean_turns": pl.Float64, "mean_tool_calls": pl.Float64,
    "tool_share": pl.Float64, "cache_hit_ratio": pl.Float64, "length_finish_share": pl.Float64,
}


@register("tools", "Tool-call latency per tool (p50/p90/p99, CV), turns and calls per trajectory, tool vs generation time, cache hits")
def summary(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """One row per run × tool (and tool = 'all') with the `latency` columns, plus run-level columns
    repeated on each row: trajectories, mean_turns, mean_tool_calls, tool_share (`time_split`),
    cache_hit_ratio = Σ cached_tokens / Σ prompt_tokens over all turns, and length_finish_share
    (trajectories ending with finish_reason 'length'). A multi-turn run without tool calls gets one
    row with tool = 'all' and calls = 0. basis 'turns'; runs without trajectories are left out."""
    runs = time_split(con, run_ids, steps)
    cache = (
        cache_by_turn(con, run_ids, steps).group_by("run")
        .agg(cache_hit_ratio=pl.col("cached_tokens").sum() / pl.col("prompt_tokens").sum())
    )
    finish = (
        finish_reasons(con, run_ids, steps).group_by("run")
        .agg(length_finish_share=pl.col("share").filter(pl.col("finish_reason") == "length").sum())
    )
    run_level = runs.join(cache, on="run", how="left").join(finish, on="run", how="left")
    calls = latency(con, run_ids, steps)
    out = run_level.join(calls, on="run", how="left").with_columns(
        basis=pl.lit("turns"), tool=pl.col("tool").fill_null(ALL_TOOLS), calls=pl.col("calls").fill_null(0),
    )
    return out.select(list(SUMMARY_COLUMNS)).cast(SUMMARY_COLUMNS).sort("run", pl.col("tool") == ALL_TOOLS, "tool")
