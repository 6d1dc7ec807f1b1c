"""What a run's numbers mean, as a frame: the semantics record (`store.semantics`, which decides and
stores it at ingest, with every field's rule) read for analyses, figures and the commands.

One row per run (`SEMANTICS_COLUMNS`): run, step_time_basis, includes_testing, includes_checkpoint,
balance_batch, balance_batch_source, lambda_basis, responses_per_step, responses_per_step_source,
training_samples, validation_samples, truncated_steps, crash, partial_steps, collapse_step,
collapse_length, collapse_typical_length.
"""

from __future__ import annotations

import duckdb
import polars as pl

from polytrace_cli.store.semantics import (  # noqa: F401  (the labels consumers compare against)
    BALANCED_MAX, DERIVED, FIELDS, LOGGED, OFF, ON, PER_RANK_SAMPLES, PRE_BALANCING_MAX, UNKNOWN,
    WITHOUT_OVERHEADS, length_collapse, records)

SEMANTICS_COLUMNS: dict[str, pl.DataType] = {
    "run": pl.String, "step_time_basis": pl.String, "includes_testing": pl.Boolean,
    "includes_checkpoint": pl.Boolean, "balance_batch": pl.String, "balance_batch_source": pl.String,
    "lambda_basis": pl.String, "responses_per_step": pl.Float64, "responses_per_step_source": pl.String,
    "training_samples": pl.Int64, "validation_samples": pl.Int64, "truncated_steps": pl.List(pl.Int64),
    "crash": pl.String, "partial_steps": pl.List(pl.Int64), "collapse_step": pl.Int64,
    "collapse_length": pl.Float64, "collapse_typical_length": pl.Float64,
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
