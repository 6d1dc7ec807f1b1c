"""T1: the cross-run summary table, assembled from the registered analysis summaries."""

from __future__ import annotations

import polars as pl

from polytrace_cli.analyze import filtering, imbalance, lengths, stages
from polytrace_cli.analyze.common import StepRange, run_facts
from polytrace_cli.report.figures.base import Omitted

ID = "T1"
TITLE = "Cross-run summary"

COLUMNS = ["run", "task", "workload_steps", "trainer_steps", "samples", "mean_prompt_tokens", "mean_response_tokens", "response_p99_p50",
           "clip_ratio", "lambda", "step_time_cv"]


def _pick(summary: pl.DataFrame | None, schema: dict, value: pl.Expr, where: pl.Expr | None = None) -> pl.DataFrame:
    """Per run, the first value of `value` over the summary rows matching `where`; an empty frame when
    the analysis produced no summary (`schema` is the analysis' declared summary columns)."""
    if summary is None or summary.height == 0:
        summary = pl.DataFrame(schema=schema)
    rows = summary if where is None else summary.filter(where)
    return rows.group_by("run", maintain_order=True).agg(value.first().cast(pl.Float64))


def table(con, run_ids: list[int], steps: StepRange, summaries: dict[str, pl.DataFrame]) -> pl.DataFrame | Omitted:
    """One row per run: task and sample count from `run_facts`; mean prompt/response tokens,
    response p99/p50 and clip ratio from `lengths`; mean token λ from `imbalance`; step-time CV from
    `stages`. Two step counts: workload_steps = rollout calls with samples (PolyTrace traces);
    trainer_steps = optimizer steps, from the DAPO filter batches, else from per-step logged lengths,
    else from logged step times (null when the run tells neither: a trace without DAPO batches)."""
    base = run_facts(con, run_ids)
    if base.height == 0:
        return Omitted("no runs")
    length_rows, stage_rows = summaries.get("lengths"), summaries.get("stages")
    is_prompt, is_response = pl.col("kind") == "prompt", pl.col("kind") == "response"
    from_samples, from_aggregates = pl.col("basis") == "samples", pl.col("basis") == "step_aggregates"
    parts = [
        _pick(length_rows, lengths.SUMMARY_COLUMNS, pl.col("steps").alias("workload_steps"), is_response & from_samples),
        _pick(summaries.get("filtering"), filtering.SUMMARY_COLUMNS, pl.col("trainer_steps").alias("dapo_steps")),
        _pick(length_rows, lengths.SUMMARY_COLUMNS, pl.col("steps").alias("logged_steps"), is_response & from_aggregates),
        _pick(stage_rows, stages.SUMMARY_COLUMNS, pl.col("steps").alias("timed_steps"), pl.col("stage") == "step"),
        _pick(length_rows, lengths.SUMMARY_COLUMNS, pl.col("mean_tokens").alias("mean_prompt_tokens"), is_prompt),
        _pick(length_rows, lengths.SUMMARY_COLUMNS, pl.col("mean_tokens").alias("mean_response_tokens"), is_response),
        _pick(length_rows, lengths.SUMMARY_COLUMNS, pl.col("p99_p50").alias("response_p99_p50"), is_response),
        _pick(length_rows, lengths.SUMMARY_COLUMNS, pl.col("clip_ratio"), is_response),
        _pick(summaries.get("imbalance"), imbalance.SUMMARY_COLUMNS, pl.col("mean_lambda").alias("lambda")),
        _pick(stage_rows, stages.SUMMARY_COLUMNS, pl.col("cv").alias("step_time_cv"), pl.col("stage") == "step"),
    ]
    out = base
    for part in parts:
        out = out.join(part, on="run", how="left")
    out = out.with_columns(pl.col("workload_steps").cast(pl.Int64),
                           trainer_steps=pl.coalesce("dapo_steps", "logged_steps", "timed_steps").cast(pl.Int64))
    return out.select(COLUMNS).sort("run")
