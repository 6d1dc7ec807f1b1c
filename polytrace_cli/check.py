"""CI thresholds: compare a run's registered analysis summaries against limits.

Each threshold names the registered analysis whose summary holds its metric, the column (first of
several accepted spellings), and a row filter (e.g. the response-length row of `lengths`). A run whose
summary lacks the row or the value cannot support the threshold: the verdict is "not measurable",
which fails only when the caller requires every threshold to be measurable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import duckdb
import polars as pl

from polytrace_cli.analyze.common import ALL_STEPS, StepRange
from polytrace_cli.analyze.registry import all_analyses

PASS, FAIL, NOT_MEASURABLE = "pass", "FAIL", "not measurable"


@dataclass(frozen=True)
class Threshold:
    """A limit on one summary metric: `upper` means the measured value must be <= the limit, else >=."""

    option: str
    analysis: str
    columns: tuple[str, ...]
    upper: bool
    description: str
    where: dict[str, tuple] = field(default_factory=dict)
    # When several rows match (tools, kinds), the one that decides: the worst for the limit's direction.


THRESHOLDS: dict[str, Threshold] = {
    t.option: t
    for t in (
        Threshold("max_imbalance", "imbalance", ("lambda_mean", "mean_lambda", "lambda"), True,
                  "mean DP load imbalance λ = max_r load_r / mean_r load_r"),
        Threshold("max_step_cv", "stages", ("cv", "step_cv"), True,
                  "coefficient of variation of step time (std/mean)", {"stage": ("step", "step_s")}),
        Threshold("max_clip_ratio", "lengths", ("clip_ratio",), True,
                  "share of responses at the length cap", {"kind": ("response",)}),
        Threshold("max_p99_p50", "lengths", ("p99_p50", "p99_over_p50", "tail_p99_p50"), True,
                  "response length tail ratio p99/p50", {"kind": ("response",)}),
        Threshold("max_tool_p99_s", "tools", ("p99_s", "latency_p99_s"), True,
                  "tool-call latency p99 in seconds (the slowest tool)"),
        Threshold("min_kept_share", "filtering", ("kept_share", "mean_kept_share", "kept_share_mean"), False,
                  "DAPO kept share per generation batch (mean)"),
    )
}


@dataclass(frozen=True)
class Verdict:
    """A threshold's limit against the measured value, and the outcome."""

    threshold: str
    limit: float
    measured: float | None
    status: str
    metric: str

    def as_dict(self) -> dict:
        """A JSON-ready dict."""
        return {"threshold": self.threshold, "limit": self.limit, "measured": self.measured,
                "status": self.status, "metric": self.metric}


def measured_value(summary: pl.DataFrame | None, threshold: Threshold, run: str) -> float | None:
    """The run's value of the threshold's metric: the worst matching row (max for upper limits, else min)."""
    if summary is None or summary.height == 0:
        return None
    column = next((c for c in threshold.columns if c in summary.columns), None)
    if column is None:
        return None
    rows = summary.filter(pl.col("run") == run) if "run" in summary.columns else summary
    for key, accepted in threshold.where.items():
        if key in rows.columns:
            rows = rows.filter(pl.col(key).cast(pl.String).is_in([str(a) for a in accepted]))
    values = [float(v) for v in rows[column].to_list() if v is not None and not _nan(v)]
    if not values:
        return None
    return max(values) if threshold.upper else min(values)


def _nan(value) -> bool:
    try:
        return math.isnan(float(value))
    except (TypeError, ValueError):
        return True


def verdict(limit: float, measured: float | None, threshold: Threshold) -> Verdict:
    """pass when the measured value is within the limit, FAIL when beyond it, not measurable when absent."""
    if measured is None:
        status = NOT_MEASURABLE
    elif threshold.upper:
        status = PASS if measured <= limit else FAIL
    else:
        status = PASS if measured >= limit else FAIL
    return Verdict(threshold.option, limit, measured, status, threshold.description)


def check_run(con: duckdb.DuckDBPyConnection, run_id: int, run: str, limits: dict[str, float],
              steps: StepRange = ALL_STEPS) -> list[Verdict]:
    """Verdicts for each given limit (option name -> limit) on one run, reading the registered summaries."""
    unknown = [name for name in limits if name not in THRESHOLDS]
    if unknown:
        raise ValueError(f"unknown thresholds: {', '.join(unknown)}")
    analyses = all_analyses()
    summaries: dict[str, pl.DataFrame | None] = {}
    verdicts = []
    for name, limit in limits.items():
        threshold = THRESHOLDS[name]
        if threshold.analysis not in summaries:
            analysis = analyses.get(threshold.analysis)
            summaries[threshold.analysis] = analysis.summary(con, [run_id], steps) if analysis else None
        verdicts.append(verdict(limit, measured_value(summaries[threshold.analysis], threshold, run), threshold))
    return verdicts


def failed(verdicts: list[Verdict], require_all: bool = False) -> bool:
    """True when a threshold is exceeded, or (with require_all) one is not measurable."""
    bad = {FAIL, NOT_MEASURABLE} if require_all else {FAIL}
    return any(v.status in bad for v in verdicts)
