"""T1: the cross-run summary table, assembled from the registered analysis summaries."""

from __future__ import annotations

import polars as pl

from polytrace_cli.analyze.common import StepRange
from polytrace_cli.report.figures.base import Omitted
from polytrace_cli.store.queries import runs_frame

ID = "T1"
TITLE = "Cross-run summary"

COLUMNS = ["run", "task", "steps", "samples", "mean_prompt_tokens", "mean_response_tokens", "response_p99_p50",
           "clip_ratio", "lambda", "step_time_cv"]


def _pick(summary: pl.DataFrame | None, column: str, alias: str, **where: str) -> pl.DataFrame:
    """Per run, `column` of the summary rows matching `where` (first match), renamed to `alias`."""
    if summary is None or summary.height == 0 or column not in summary.columns:
        return pl.DataFrame(schema={"run": pl.String, alias: pl.Float64})
    rows = summary
    for key, value in where.items():
        if key not in rows.columns:
            return pl.DataFrame(schema={"run": pl.String, alias: pl.Float64})
        rows = rows.filter(pl.col(key).cast(pl.String) == value)
    return rows.group_by("run", maintain_order=True).agg(pl.col(column).first().cast(pl.Float64).alias(alias))


def table(con, run_ids: list[int], steps: StepRange, summaries: dict[str, pl.DataFrame]) -> pl.DataFrame | Omitted:
    """One row per run: task and sizes from the store's run list; mean prompt/response tokens,
    response p99/p50 and clip ratio from `lengths`; mean λ from `imbalance`; step-time CV from `steps`."""
    from polytrace_cli.analyze.common import run_names

    names = set(run_names(con, run_ids).values())
    base = runs_frame(con).filter(pl.col("run").is_in(list(names))).select("run", "task", "steps", "samples")
    if base.height == 0:
        return Omitted("no runs")
    lengths, steps_summary = summaries.get("lengths"), summaries.get("stages")
    parts = [
        _pick(lengths, "mean_tokens", "mean_prompt_tokens", kind="prompt"),
        _pick(lengths, "mean_tokens", "mean_response_tokens", kind="response"),
        _pick(lengths, "p99_p50", "response_p99_p50", kind="response"),
        _pick(lengths, "clip_ratio", "clip_ratio", kind="response"),
        _pick(summaries.get("imbalance"), "mean_lambda", "lambda"),
        _pick(steps_summary, "cv", "step_time_cv", stage="step"),
    ]
    out = base
    for part in parts:
        out = out.join(part, on="run", how="left")
    return out.select(COLUMNS).sort("run")
