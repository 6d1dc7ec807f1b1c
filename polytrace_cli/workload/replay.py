"""How faithfully a benchmark replay reproduces a formal training run's stage times.

Both logs are ingested (any format polytrace reads that yields step timings) and their steps
paired by step number:

- Restarts: a run whose step counter went backwards has several segments in the store. For each
  step number the row of the latest segment that logged training metrics is used: the re-run
  after a restart is the step the run kept. Validation-only rows (step 0 before training, or the
  validation pass after a resume) are never paired.
- Missing steps: a step present in only one log is not paired; its number is listed, and it counts
  in no error. A stage missing from either side of a paired step, or whose formal time is 0, is
  left out of that stage's mean.
- The `step` stage (whole step wall time) skips steps where either log ran testing or saved a
  checkpoint, because that time sits inside `timing_s/step` and a replay need not repeat it.

Per paired step and stage: signed error e = (benchmark − formal) / formal.
Per stage: mean e, mean |e|, max |e| and accuracy = 100% × (1 − mean |e|).
Overall accuracy: the mean of the stage accuracies, each stage weighing the same.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import polars as pl

from polytrace_cli.errors import PolytraceError
from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.store.catalog import steps_of_runs_sql
from polytrace_cli.store.queries import run_id as run_id_of, run_id_if_any
from polytrace_cli.store.sql import fetch_first

STAGES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "step")


@dataclass
class ReplayReport:
    """Per-step errors, per-stage summary and the pairing bookkeeping of one comparison."""

    benchmark_run: str
    formal_run: str
    per_step: pl.DataFrame
    per_stage: pl.DataFrame
    accuracy_pct: float | None
    paired_steps: list[int] = field(default_factory=list)
    only_benchmark: list[int] = field(default_factory=list)
    only_formal: list[int] = field(default_factory=list)
    segments: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """Everything as plain JSON-ready values."""
        return {
            "benchmark_run": self.benchmark_run, "formal_run": self.formal_run,
            "accuracy_pct": self.accuracy_pct, "stages": self.per_stage.to_dicts(),
            "paired_steps": self.paired_steps, "only_benchmark": self.only_benchmark,
            "only_formal": self.only_formal, "segments": self.segments,
            "per_step": self.per_step.to_dicts(),
        }


def load_log(con: duckdb.DuckDBPyConnection, log: str | Path, role: str) -> str:
    """Ingest a log file or folder as its own run and return the run name.

    The run is named `replay-<role>-<file name>-<hash of the resolved path>`, so two logs never
    share a run and checking the same log again reuses its run. A value that is not a path but the
    name of a run already in the store is used as that run.
    """
    path = Path(log)
    if not path.exists():
        if run_id_if_any(con, str(log)) is not None:
            return str(log)
        raise PolytraceError(f"{log}: no such log file or folder, and no run of that name in the store")
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]
    name = f"replay-{role}-{path.name}-{digest}"
    reports = ingest_paths(con, [path], run_name=name)
    failed = [r for r in reports if r.failed]
    if failed:
        raise PolytraceError(f"{failed[0].path}: {failed[0].message or failed[0].status}")
    if not any(r.status in ("ingested", "replaced", "unchanged") for r in reports):
        raise PolytraceError(f"{log}: no file of a known format (see `polytrace formats`)")
    return name


# The `steps` columns a replay compares (`catalog.steps_of_runs_sql`).
_COMPARED = ["gen_s", "reward_s", "old_log_prob_s", "ref_s", "adv_s", "update_actor_s", "step_s"]
_LATEST_STEPS = """
    CREATE OR REPLACE TEMP TABLE replay_steps AS
    WITH latest AS (
        SELECT run_id, step, segment, gen_s, reward_s, old_log_prob_s, ref_s, adv_s, update_actor_s, step_s,
               coalesce(has_testing OR has_checkpoint, false) AS extra_work
        FROM ({steps})
        WHERE NOT coalesce(is_validation_only, false)
        QUALIFY row_number() OVER (PARTITION BY run_id, step ORDER BY segment DESC) = 1
    )
    SELECT run_id, step, segment, extra_work, regexp_replace(stage, '_s$', '') AS stage, seconds
    FROM (UNPIVOT latest ON gen_s, reward_s, old_log_prob_s, ref_s, adv_s, update_actor_s, step_s
          INTO NAME stage VALUE seconds)
"""

_PER_STEP = """
    SELECT f.step, f.stage, b.seconds AS benchmark_s, f.seconds AS formal_s,
           (b.seconds - f.seconds) / f.seconds AS error
    FROM replay_steps f JOIN replay_steps b ON b.step = f.step AND b.stage = f.stage AND b.run_id = ?
    WHERE f.run_id = ? AND f.seconds > 0 AND b.seconds IS NOT NULL
      AND NOT (f.stage = 'step' AND (f.extra_work OR b.extra_work))
    ORDER BY f.step, list_position(?, f.stage)
"""


def compare_runs(con: duckdb.DuckDBPyConnection, benchmark_run: str, formal_run: str) -> ReplayReport:
    """Pair the two runs' steps and compute per-stage errors and accuracies (module docstring)."""
    bench_id, formal_id = run_id_of(con, benchmark_run), run_id_of(con, formal_run)
    con.execute(_LATEST_STEPS.format(steps=steps_of_runs_sql(f"({int(bench_id)}, {int(formal_id)})", _COMPARED)))
    for run_id, name in ((bench_id, benchmark_run), (formal_id, formal_run)):
        if not fetch_first(con, "SELECT count(*) FROM replay_steps WHERE run_id = ?", [run_id])[0]:
            raise PolytraceError(f"run {name} has no stage timings (timing_s/gen, timing_s/step, ...) to compare")
    per_step = con.sql(_PER_STEP, params=[bench_id, formal_id, list(STAGES)]).pl()
    stage_order = pl.DataFrame({"stage": list(STAGES), "order": list(range(len(STAGES)))})
    per_stage = (
        per_step.group_by("stage")
        .agg(pl.len().alias("steps"), pl.col("benchmark_s").mean().alias("benchmark_mean_s"),
             pl.col("formal_s").mean().alias("formal_mean_s"), pl.col("error").mean().alias("mean_error"),
             pl.col("error").abs().mean().alias("mean_abs_error"), pl.col("error").abs().max().alias("max_abs_error"))
        .with_columns(((1 - pl.col("mean_abs_error")) * 100).alias("accuracy_pct"))
        .join(stage_order, on="stage").sort("order").drop("order")
    )
    accuracy = float(per_stage["accuracy_pct"].mean()) if per_stage.height else None
    step_sets = {
        run_id: {row[0] for row in con.execute(
            "SELECT DISTINCT step FROM replay_steps WHERE run_id = ?", [run_id]).fetchall()}
        for run_id in (bench_id, formal_id)
    }
    segments = dict(con.execute(
        "SELECT r.name, count(DISTINCT m.segment) FROM step_metrics m JOIN runs r USING (run_id)"
        " WHERE m.run_id IN (?, ?) GROUP BY r.name", [bench_id, formal_id]).fetchall())
    return ReplayReport(
        benchmark_run=benchmark_run, formal_run=formal_run, per_step=per_step, per_stage=per_stage,
        accuracy_pct=accuracy, paired_steps=sorted(step_sets[bench_id] & step_sets[formal_id]),
        only_benchmark=sorted(step_sets[bench_id] - step_sets[formal_id]),
        only_formal=sorted(step_sets[formal_id] - step_sets[bench_id]), segments=segments,
    )


def replay_check(con: duckdb.DuckDBPyConnection, benchmark: str | Path, formal: str | Path) -> ReplayReport:
    """Ingest both logs (or use runs of those names) and compare them with `compare_runs`."""
    benchmark_run = load_log(con, benchmark, "benchmark")
    formal_run = load_log(con, formal, "formal")
    if benchmark_run == formal_run:
        raise PolytraceError("--benchmark and --formal name the same log")
    return compare_runs(con, benchmark_run, formal_run)
