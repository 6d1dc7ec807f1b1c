"""Who held a slow step: the rank and stage the step's measured spans name.

From `analyze.timeline.per_step` over the run's read spans (never synthesized ones: laid end to end
from stage timers they cannot say which rank was late): the step's straggler, i.e. in the (role,
stage) whose ranks waited longest for their slowest (the largest bubble), that slowest rank, its
busy time over the mean of its peers (`lead`), the rank-seconds the others waited (`bubble_s`), and
the step's critical path. A step without a stage run by two ranks or more names only its critical
stage.
"""

from __future__ import annotations

import duckdb
import polars as pl

from polytrace_cli.analyze.common import StepRange


def held_by(con: duckdb.DuckDBPyConnection, run_id: int, steps: list[int]) -> dict[int, dict]:
    """step → {worker, rank, role, stage, lead, bubble_s, critical_stage, critical_path} for the given
    steps that have measured spans; empty when the run has none."""
    from polytrace_cli.analyze.timeline import per_step

    if not steps or not con.execute("SELECT count(*) FROM spans WHERE run_id = ? AND NOT synthesized",
                                    [run_id]).fetchall()[0][0]:
        return {}
    frame = per_step(con, [run_id], StepRange(min(steps), max(steps)))
    frame = frame.filter(pl.col("step").is_in(steps) & ~pl.col("synthesized"))
    held = {}
    for row in frame.iter_rows(named=True):
        held[row["step"]] = {"worker": row["straggler"], "rank": row["straggler_rank"], "role": row["straggler_role"],
                             "stage": row["straggler_stage"] or row["critical_stage"], "lead": row["straggler_lead"],
                             "bubble_s": row["bubble_s"], "critical_stage": row["critical_stage"],
                             "critical_path": row["critical_path"]}
    return held


def with_held_by(con: duckdb.DuckDBPyConnection, run_id: int, explanation):
    """`explanation` with each of its steps that has measured spans given `held_by`, and a note."""
    held = held_by(con, run_id, [step["step"] for step in explanation.steps if step.get("step") is not None])
    if not held:
        return explanation
    for step in explanation.steps:
        if step.get("step") in held:
            step["held_by"] = held[step["step"]]
    verb = "has" if len(held) == 1 else "have"
    explanation.notes.append(f"{len(held)} of the steps shown {verb} profiler or tracer spans: `held_by` names the rank "
                             "and stage the others waited for (analyze --only timeline)")
    return explanation
