"""Findings from the engines' telemetry and from numbers that do not add up, for `explain` and the report.

Each finding has the layout of `explain`'s findings (cause, seconds, share of the run's seconds, steps,
text), with the formula it rests on in its text:

    engine_tail     Σ over steps in the `tail` state of tail_share × covered rollout seconds: rollout time
                    after the engines last ran more than 10% of their peak requests
    engine_full     Σ over steps in the `full` state of kv_full_share × covered rollout seconds: rollout
                    time with a replica's KV cache at 95% or more (preemptions counted beside it)
    untimed         Σ untimed_s over the untimed steps: wall time between steps no timer counts
    stage_excess    Σ stage_excess_s: stage timers beyond the logged step total
    mfu_impossible  no seconds: an actor MFU above 1 is a miscount, not lost time
    throughput_mismatch  no seconds: the GPU count the throughput implies is not the config's
"""

from __future__ import annotations

import duckdb
import polars as pl

from polytrace_cli.analyze import consistency, engine
from polytrace_cli.analyze.common import ALL_STEPS, StepRange
from polytrace_cli.display import duration


def _finding(cause: str, seconds: float | None, run_seconds: float | None, steps: list[int], text: str) -> dict:
    portion = seconds / run_seconds if seconds is not None and run_seconds else None
    return {"cause": cause, "seconds": seconds, "share": portion, "steps": steps, "text": text}


def engine_findings(con: duckdb.DuckDBPyConnection, run_id: int, run_seconds: float | None,
                    steps: StepRange = ALL_STEPS) -> list[dict]:
    """The tail and the full engine, where the run's engine samples reach its steps (see the module docstring)."""
    detail = engine.per_step(con, [run_id], steps)
    found = []
    tail = detail.filter(pl.col("engine_state") == "tail")
    if tail.height:
        seconds = float((tail["tail_share"] * tail["rollout_s"] * tail["covered_share"]).sum())
        low = tail["running_peak"] * engine.LOW_SHARE_OF_PEAK
        found.append(_finding(
            "engine_tail", seconds, run_seconds, tail["step"].to_list(),
            f"the tail: in {tail.height} of {detail.height} steps the last {float(tail['tail_share'].median()):.0%} "
            f"of rollout (median) ran with at most {float(low.median()):.0f} of {float(tail['running_peak'].median()):.0f} "
            f"requests, {duration(seconds)} in all (Σ tail share × rollout); the KV cache never filled, so more "
            "replicas would wait as long: shorten the tail (a length cap, partial rollouts)"))
    full = detail.filter(pl.col("engine_state") == "full")
    if full.height:
        seconds = float((full["kv_full_share"] * full["rollout_s"] * full["covered_share"]).sum())
        preempted = float(full["preemptions"].sum())
        found.append(_finding(
            "engine_full", seconds, run_seconds, full["step"].to_list(),
            f"the engine was full: in {full.height} of {detail.height} steps the KV cache stood at 95% or more for "
            f"{float(full['kv_full_share'].median()):.0%} of rollout (median) with {preempted:,.0f} preemptions "
            f"and {float(full['waiting_mean'].median()):.0f} requests queued (median), {duration(seconds)} in all: "
            "more KV memory per replica (gpu_memory_utilization, a smaller tensor-parallel group) or more replicas"))
    return found


def _steps(count: int) -> str:
    return f"{count} step{'s' if count != 1 else ''}"


# The consistency findings, in the order they are listed: (cause, the per-step column that marks a step
# (a flag, or a value only such steps have), the column of the seconds each marked step costs or None,
# and the finding's sentence: of the marked steps, every step and the seconds summed).
CONSISTENCY_FINDINGS = (
    ("untimed", "untimed", "untimed_s", lambda marked, detail, seconds: (
        f"{duration(seconds)} between steps that no timer counts, in {marked.height} of "
        f"{detail.filter(pl.col('untimed_s').is_not_null()).height} steps "
        f"(gap between two steps' records − step time, over max({consistency.UNTIMED_MIN_S:g} s, "
        f"{consistency.UNTIMED_SHARE:.0%} of the step)): logging, data loading or work outside the step timer")),
    ("stage_excess", "stage_excess_s", "stage_excess_s", lambda marked, detail, seconds: (
        f"in {_steps(marked.height)} the stage timers add up to more than the logged step total (by up to "
        f"{duration(float(marked['stage_excess_s'].max()))}): timers that overlap, or a step total that leaves "
        "work out; shares of the step computed from them do not add up")),
    ("mfu_impossible", "mfu_impossible", None, lambda marked, detail, seconds: (
        f"MFU logged above 1 (up to {float(marked['mfu'].max()):.2f}) in {_steps(marked.height)}: no device "
        "exceeds its peak, so the FLOPs counted or the peak assumed is wrong, and throughput read from it is too")),
    ("throughput_mismatch", "throughput_mismatch", None, lambda marked, detail, seconds: (
        f"the logged throughput contradicts tokens ÷ time in {_steps(marked.height)}: total_tokens / (throughput × "
        f"time_per_step) implies {float(marked['implied_gpus'].median()):.1f} GPUs (median), not the config's; "
        "per-GPU throughput read from this log is off by as much")),
)


def consistency_findings(con: duckdb.DuckDBPyConnection, run_id: int, run_seconds: float | None,
                         steps: StepRange = ALL_STEPS) -> list[dict]:
    """Untimed time between steps, stages beyond their step, an impossible MFU, a throughput that implies
    another GPU count (CONSISTENCY_FINDINGS; formulas in the module docstring): one finding per kind
    that marks a step, its seconds Σ of its seconds column over the marked steps (none without one)."""
    detail = consistency.per_step(con, [run_id], steps)
    found = []
    for cause, column, seconds_column, sentence in CONSISTENCY_FINDINGS:
        marks = pl.col(column)
        marked = detail.filter(marks.fill_null(False) if detail.schema[column] == pl.Boolean else marks.is_not_null())
        if not marked.height:
            continue
        seconds = float(marked[seconds_column].sum()) if seconds_column else None
        found.append(_finding(cause, seconds, run_seconds, marked["step"].to_list(), sentence(marked, detail, seconds)))
    return found


def telemetry_findings(con: duckdb.DuckDBPyConnection, run_id: int, run_seconds: float | None,
                       steps: StepRange = ALL_STEPS) -> list[dict]:
    """The engine findings and the consistency findings of a run."""
    return engine_findings(con, run_id, run_seconds, steps) + consistency_findings(con, run_id, run_seconds, steps)


def ranked_with(findings: list[dict], more: list[dict]) -> list[dict]:
    """`findings` with `more` among them, by seconds (largest first); findings without seconds last."""
    if not more:
        return findings
    return sorted([*findings, *more], key=lambda f: (f["seconds"] is None, -(f["seconds"] or 0.0)))
