"""What a run's numbers mean, as a frame: the semantics record (`semantics.record`, which decides and
stores it at ingest, with every field's rule) read for analyses, figures and the commands.

One row per run (`SEMANTICS_COLUMNS`): run, step_time_basis, includes_testing, includes_checkpoint,
balance_batch, balance_batch_source, lambda_basis, responses_per_step, responses_per_step_source,
training_samples, validation_samples, truncated_steps, crash, partial_steps, collapse_step,
collapse_length, collapse_typical_length, execution_mode, execution_mode_evidence.
"""

from __future__ import annotations

import duckdb
import polars as pl

from polytrace_cli.semantics.record import (  # noqa: F401  (the labels consumers compare against)
    BALANCED_MAX, DERIVED, FIELDS, LOGGED, OFF, ON, PER_RANK_SAMPLES, PRE_BALANCING_MAX, UNKNOWN,
    WITHOUT_OVERHEADS, length_collapse, records)

SEMANTICS_COLUMNS: dict[str, pl.DataType] = {
    "run": pl.String, "step_time_basis": pl.String, "includes_testing": pl.Boolean,
    "includes_checkpoint": pl.Boolean, "balance_batch": pl.String, "balance_batch_source": pl.String,
    "lambda_basis": pl.String, "responses_per_step": pl.Float64, "responses_per_step_source": pl.String,
    "training_samples": pl.Int64, "validation_samples": pl.Int64, "truncated_steps": pl.List(pl.Int64),
    "crash": pl.String, "partial_steps": pl.List(pl.Int64), "collapse_step": pl.Int64,
    "collapse_length": pl.Float64, "collapse_typical_length": pl.Float64,
    "execution_mode": pl.String, "execution_mode_evidence": pl.List(pl.String),
}


def semantics(con: duckdb.DuckDBPyConnection, run_ids: list[int]) -> pl.DataFrame:
    """One row per run (`SEMANTICS_COLUMNS`), in run-id order: the stored record, or decided now for a
    run without a current one."""
    return pl.DataFrame(records(con, run_ids), schema=SEMANTICS_COLUMNS, orient="row")


def record_of(con: duckdb.DuckDBPyConnection, run_id: int) -> dict:
    """The one run's record as a dict."""
    return records(con, [run_id])[0]


def as_json(record: dict) -> dict:
    """A record as JSON-ready values (lists stay lists, the run name left out)."""
    return {name: record[name] for name in FIELDS}


def records_by_name(con: duckdb.DuckDBPyConnection, run_ids: list[int]) -> dict[str, dict]:
    """run name -> its record as JSON-ready values (`as_json`)."""
    return {record["run"]: as_json(record) for record in records(con, run_ids)}


def crash_clause(con: duckdb.DuckDBPyConnection, run_id: int) -> str:
    """What a refusal for lack of steps adds about the run's end: '; the job died before its first
    step: <crash>' (no step metrics, no samples) or '; the job ended on a fatal error: <crash>', the
    crash ingest recorded (`ingest.crashes`); '' without one."""
    crash = record_of(con, run_id)["crash"]
    if not crash:
        return ""
    stepped = con.execute("SELECT EXISTS (SELECT 1 FROM step_metrics WHERE run_id = ?) "
                          "OR EXISTS (SELECT 1 FROM samples WHERE run_id = ?)", [run_id, run_id]).fetchall()[0][0]
    return f"; the job {'ended on a fatal error' if stepped else 'died before its first step'}: {crash}"


def semantics_notes(record: dict) -> list[str]:
    """What the run's semantics record tells a reader of its numbers: a step
    time derived from the stage timers or with overheads added back, lines cut short, no per-rank
    data, a crash, partial steps and a length collapse."""
    notes = []
    if record["step_time_basis"] == DERIVED:
        notes.append(f"the log has no step total: step time is {DERIVED} (their sum)")
    elif record["step_time_basis"] == WITHOUT_OVERHEADS:
        notes.append("timing_s/step leaves out testing or the checkpoint save: they are added back to the step time")
    if record["truncated_steps"]:
        notes.append(f"{_count_steps(record['truncated_steps'])} had a log line cut short (wandb cuts output.log "
                     "lines at 4,096 characters): timers printed after the cut are lost")
    if record["lambda_basis"] is None:
        notes.append("no per-rank data (global_seqlen or per-rank samples): DP imbalance cannot be told")
    if record["partial_steps"]:
        notes.append(f"{_count_steps(record['partial_steps'])} hold fewer than the "
                     f"{record['responses_per_step']:,.0f} responses per step ({record['responses_per_step_source']})")
    if record["collapse_step"] is not None:
        notes.append(f"response lengths collapsed from step {record['collapse_step']:,} on (mean "
                     f"{record['collapse_length']:,.1f} tokens, typical {record['collapse_typical_length']:,.0f} before)")
    if record.get("execution_mode") not in (None, "sync"):
        evidence = record["execution_mode_evidence"] or []
        more = f"; {len(evidence) - 2} more" if len(evidence) > 2 else ""
        notes.append(f"execution mode {record['execution_mode']} ({'; '.join(evidence[:2])}{more}): the trainer's "
                     "step is its own compute plus its wait for the rollout side")
    if record["crash"]:
        notes.append(f"the job ended on a fatal error after its last logged line: {record['crash']}")
    return notes


def _count_steps(steps: list[int]) -> str:
    shown = ", ".join(f"{step:,}" for step in steps[:5]) + (", ..." if len(steps) > 5 else "")
    return f"{len(steps)} step{'s' if len(steps) != 1 else ''} ({shown})"
