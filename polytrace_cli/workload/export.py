"""Export an ingested run's per-sample data as PolyTrace workload traces.

Two formats, both readable by `polytrace ingest`:

- `polytrace-json`: the PolyTrace dataset JSON, one document keyed by step. Single-turn runs give
  `{"<step>": {"input": [...], "output": [...]}}`: when every prompt group of a step has the same
  number k of responses (and one prompt length), `input` holds one length per prompt and `output`
  the k responses of each prompt in turn, so output[j] belongs to input[j // k]; otherwise `input`
  holds one prompt length per response (one-to-one pairing). Groups are ordered by (dp_rank,
  prompt_idx) and responses by sample_idx. Validation samples are left out (the published
  workloads are training rollouts). Multi-turn runs (the run has `turns` rows) give the per-turn
  shape `{"<step>": [{"input": [...], "output": [...]}, ...]}`, one object per turn with the
  prompt tokens and completion tokens of every trajectory that reached that turn; trajectories are
  ordered by descending turn count so that position i of every turn's lists is trajectory i.
- `packed`: `packed_lengths_step_N.jsonl`, one line per (step, dp_rank, prompt group) with the
  responses in sample_idx order, written by DuckDB `COPY ... (FORMAT json)` one step at a time.

A packed export ingested again gives the same (step, dp_rank, prompt_idx, sample_idx, prompt_len,
response_len) rows as the source, provided sample_idx runs 0..k-1 within each group. The dataset
JSON keeps (step, prompt_len, response_len) but not the rank layout, which that format has no
place for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from polytrace_cli.errors import PolytraceError
from polytrace_cli.store.queries import run_id as run_id_of
from polytrace_cli.store.sql import fetch_first

FORMATS = ("polytrace-json", "packed")


@dataclass
class ExportResult:
    """What an export wrote."""

    files: list[Path] = field(default_factory=list)
    steps: int = 0
    samples: int = 0
    multiturn: bool = False


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "run"


def _dataset_single_turn_sql() -> str:
    return """
        WITH s AS (
            SELECT step, coalesce(dp_rank, rank, 0) AS dp, coalesce(prompt_idx, 0) AS prompt_idx,
                   sample_idx, prompt_len, response_len
            FROM samples WHERE run_id = ? AND validate IS NOT TRUE
        ), groups AS (
            SELECT step, dp, prompt_idx, count(*) AS k, count(DISTINCT prompt_len) AS distinct_prompts,
                   any_value(prompt_len) AS prompt_len
            FROM s GROUP BY ALL
        ), shape AS (
            SELECT step, count(DISTINCT k) = 1 AND max(distinct_prompts) <= 1 AS grouped,
                   list(prompt_len ORDER BY dp, prompt_idx) AS per_prompt
            FROM groups GROUP BY step
        ), flat AS (
            SELECT step,
                   list(prompt_len ORDER BY dp, prompt_idx, sample_idx NULLS LAST) AS per_sample,
                   list(response_len ORDER BY dp, prompt_idx, sample_idx NULLS LAST) AS output
            FROM s GROUP BY step
        )
        SELECT '{' || string_agg('"' || step || '": '
                   || json_object('input', CASE WHEN grouped THEN per_prompt ELSE per_sample END, 'output', output),
                   ', ' ORDER BY step) || '}',
               count(*), sum(len(output))
        FROM shape JOIN flat USING (step)
    """


def _dataset_multiturn_sql() -> str:
    return """
        WITH t AS (
            SELECT step, rank, prompt_idx, sample_idx, turn, prompt_tokens, completion_tokens,
                   row_number() OVER (PARTITION BY step, rank, prompt_idx, sample_idx ORDER BY turn) - 1 AS turn_index,
                   count(*) OVER (PARTITION BY step, rank, prompt_idx, sample_idx) AS n_turns
            FROM turns WHERE run_id = ?
        ), positioned AS (
            SELECT *, dense_rank() OVER (PARTITION BY step
                       ORDER BY n_turns DESC, rank NULLS FIRST, prompt_idx NULLS FIRST, sample_idx NULLS FIRST) AS position
            FROM t
        ), per_turn AS (
            SELECT step, turn_index,
                   json_object('input', list(prompt_tokens ORDER BY position),
                               'output', list(completion_tokens ORDER BY position)) AS obj,
                   count(*) AS trajectories
            FROM positioned GROUP BY step, turn_index
        ), per_step AS (
            SELECT step, '[' || string_agg(obj::VARCHAR, ', ' ORDER BY turn_index) || ']' AS turns_json,
                   max(trajectories) FILTER (WHERE turn_index = 0) AS trajectories
            FROM per_turn GROUP BY step
        )
        SELECT '{' || string_agg('"' || step || '": ' || turns_json, ', ' ORDER BY step) || '}',
               count(*), sum(trajectories)
        FROM per_step
    """


def export_dataset_json(con: duckdb.DuckDBPyConnection, run_id: int, path: Path) -> ExportResult:
    """Write the run as one PolyTrace dataset JSON document at `path` (shapes in the module docstring)."""
    multiturn = fetch_first(con, "SELECT count(*) FROM turns WHERE run_id = ?", [run_id])[0] > 0
    sql = _dataset_multiturn_sql() if multiturn else _dataset_single_turn_sql()
    document, steps, samples = fetch_first(con, sql, [run_id])
    if not steps:
        raise PolytraceError("the run has no per-sample data to export (only step aggregates?)")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(document + "\n", encoding="utf-8")
    return ExportResult(files=[path], steps=int(steps), samples=int(samples or 0), multiturn=multiturn)


def export_packed(con: duckdb.DuckDBPyConnection, run_id: int, out_dir: Path) -> ExportResult:
    """Write `packed_lengths_step_N.jsonl` files, one line per (step, dp_rank, prompt group)."""
    steps = [row[0] for row in con.execute(
        "SELECT DISTINCT step FROM samples WHERE run_id = ? ORDER BY step", [run_id]).fetchall()]
    if not steps:
        raise PolytraceError("the run has no per-sample data to export (only step aggregates?)")
    out_dir.mkdir(parents=True, exist_ok=True)
    result = ExportResult(steps=len(steps))
    for step in steps:
        path = out_dir / f"packed_lengths_step_{step}.jsonl"
        # COPY takes no prepared parameters: the run id and step are integers formatted in, and
        # the path is quoted as an SQL string literal.
        literal = "'" + str(path).replace("'", "''") + "'"
        con.execute(
            f"""
            COPY (
                SELECT step, coalesce(rank, dp_rank, 0) AS rank, coalesce(dp_rank, rank, 0) AS dp_rank,
                       coalesce(tp_rank, 0) AS tp_rank, coalesce(prompt_idx, 0) AS local_index,
                       prompt_len AS input, list(response_len ORDER BY sample_idx NULLS LAST) AS output,
                       count(*) AS n_sampling, validate
                FROM samples WHERE run_id = {int(run_id)} AND step = {int(step)}
                GROUP BY step, rank, dp_rank, tp_rank, prompt_idx, prompt_len, validate
                ORDER BY dp_rank, local_index, input NULLS FIRST, validate NULLS FIRST
            ) TO {literal} (FORMAT json)
            """
        )
        result.files.append(path)
    result.samples = fetch_first(con, "SELECT count(*) FROM samples WHERE run_id = ?", [run_id])[0]
    return result


def export_run(con: duckdb.DuckDBPyConnection, run: str, out_dir: str | Path, formats: list[str]) -> ExportResult:
    """Export run `run` into out_dir in each of `formats` (see FORMATS); returns the combined result.

    The dataset JSON goes to `<out_dir>/<run>.json`, the packed traces to `<out_dir>/packed_lengths_step_N.jsonl`.
    """
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise PolytraceError(f"unknown export format {', '.join(unknown) or '(none)'}; choose from {', '.join(FORMATS)}")
    run_id = run_id_of(con, run)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise PolytraceError(f"{out} exists and is not a folder")
    combined = ExportResult()
    for fmt in dict.fromkeys(formats):
        if fmt == "polytrace-json":
            part = export_dataset_json(con, run_id, out / f"{_safe_name(run)}.json")
        else:
            part = export_packed(con, run_id, out)
        combined.files += part.files
        combined.steps = max(combined.steps, part.steps)
        combined.samples = max(combined.samples, part.samples)
        combined.multiturn = combined.multiturn or part.multiturn
    return combined
