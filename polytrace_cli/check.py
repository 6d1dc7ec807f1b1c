"""CI thresholds: compare a run's registered analysis summaries against limits.

Each threshold names the registered analysis whose summary holds its metric, the one column that
holds it (a name imported from the analysis module that declares it, so a renamed column breaks the
gate loudly instead of letting it pass), and a row filter (e.g. the response-length row of
`lengths`). A run whose summary lacks the row or the value cannot support the threshold: the verdict
is "not measurable", with the reason, and it fails the gate unless the caller allows it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import duckdb
import polars as pl

from polytrace_cli.analyze import consistency, engine, filtering, imbalance, lengths, stages, tools
from polytrace_cli.analyze.common import ALL_STEPS, StepRange
from polytrace_cli.analyze.registry import all_analyses
from polytrace_cli.store.sql import fetch_first

PASS, FAIL, NOT_MEASURABLE = "pass", "FAIL", "not measurable"


@dataclass(frozen=True)
class Threshold:
    """A limit on one summary metric: `upper` means the measured value must be <= the limit, else >=."""

    option: str
    analysis: str
    column: str
    upper: bool
    description: str
    where: dict[str, tuple] = field(default_factory=dict)
    # When several rows match (tools, kinds), the one that decides: the worst for the limit's direction.


THRESHOLDS: dict[str, Threshold] = {
    t.option: t
    for t in (
        Threshold("max_imbalance", "imbalance", imbalance.MEAN_LAMBDA, True,
                  "mean DP load imbalance λ = max_r load_r / mean_r load_r"),
        Threshold("max_step_cv", "stages", stages.CV, True,
                  "coefficient of variation of step time (std/mean)", {stages.STAGE: (stages.STEP_STAGE,)}),
        Threshold("max_clip_ratio", "lengths", lengths.CLIP_RATIO, True,
                  "share of responses at the length cap", {lengths.KIND: ("response",)}),
        Threshold("max_p99_p50", "lengths", lengths.P99_P50, True,
                  "response length tail ratio p99/p50", {lengths.KIND: ("response",)}),
        Threshold("max_tool_p99_s", "tools", tools.P99_S, True,
                  "tool-call latency p99 in seconds (the slowest tool)"),
        Threshold("min_kept_share", "filtering", filtering.KEPT_SHARE, False,
                  "DAPO kept share per generation batch (mean)"),
        Threshold("max_untimed_share", "consistency", consistency.UNTIMED_SHARE_COLUMN, True,
                  "share of the wall clock between steps that no timer counts (Σ untimed / Σ gap)"),
        Threshold("max_inconsistent_steps", "consistency", consistency.INCONSISTENT_STEPS, True,
                  "steps whose stages exceed their total, whose MFU is above 1 or whose throughput implies another GPU count"),
        Threshold("max_tail_share", "engine", engine.TAIL_SHARE, True,
                  "share of rollout time spent on the tail at low engine concurrency"),
    )
}

# Where a run's per-step data lives: (table, step column). Tables, not the views over them, so
# that finding one row stays cheap.
STEP_SOURCES = (("sample_rows", "step"), ("sample_groups", "step"), ("step_metrics", "step"),
                ("rank_timings", "step"), ("tool_calls", "step"), ("filter_batches", "workload_step"))


@dataclass(frozen=True)
class Verdict:
    """A threshold's limit against the measured value, and the outcome (with why, when not measurable)."""

    threshold: str
    limit: float
    measured: float | None
    status: str
    metric: str
    reason: str | None = None

    def as_dict(self) -> dict:
        """A JSON-ready dict."""
        return {"threshold": self.threshold, "limit": self.limit, "measured": self.measured,
                "status": self.status, "metric": self.metric, "reason": self.reason}


def measure(summary: pl.DataFrame | None, threshold: Threshold, run: str) -> tuple[float | None, str | None]:
    """(value, None), or (None, why it cannot be measured): the worst matching row's value (max for
    upper limits, else min), ignoring null and NaN.

    A summary that lacks the threshold's column is a programming error (a renamed column), not an
    unmeasurable run: it raises.
    """
    if summary is not None and threshold.column not in summary.columns:
        raise RuntimeError(f"the {threshold.analysis} summary has no column {threshold.column!r}; "
                           f"`polytrace check --{threshold.option.replace('_', '-')}` cannot read it")
    if summary is None or summary.height == 0:
        return None, f"no {threshold.analysis} data for the run"
    rows = summary.filter(pl.col("run") == run) if "run" in summary.columns else summary
    if rows.height == 0:
        return None, f"no {threshold.analysis} data for the run"
    for key, accepted in threshold.where.items():
        if key not in rows.columns:
            raise RuntimeError(f"the {threshold.analysis} summary has no column {key!r}")
        rows = rows.filter(pl.col(key).cast(pl.String).is_in([str(a) for a in accepted]))
        if rows.height == 0:
            return None, f"no {key} {'/'.join(map(str, accepted))} row in the {threshold.analysis} summary"
    values = [float(v) for v in rows[threshold.column].to_list() if v is not None and not _nan(v)]
    if not values:
        return None, f"{threshold.column} cannot be computed from the run's data"
    return (max(values) if threshold.upper else min(values)), None


def measured_value(summary: pl.DataFrame | None, threshold: Threshold, run: str) -> float | None:
    """The value of `measure`, None when not measurable."""
    return measure(summary, threshold, run)[0]


def _nan(value) -> bool:
    try:
        return math.isnan(float(value))
    except (TypeError, ValueError):
        return True


def verdict(limit: float, measured: float | None, threshold: Threshold, reason: str | None = None) -> Verdict:
    """pass when the measured value is within the limit, FAIL when beyond it, not measurable when absent."""
    if measured is None:
        status = NOT_MEASURABLE
    elif threshold.upper:
        status = PASS if measured <= limit else FAIL
    else:
        status = PASS if measured >= limit else FAIL
    return Verdict(threshold.option, limit, measured, status, threshold.description,
                   reason if measured is None else None)


def validate_limits(limits: dict[str, float]) -> None:
    """Every limit names a known threshold and is a finite, non-negative number; else ValueError."""
    unknown = [name for name in limits if name not in THRESHOLDS]
    if unknown:
        raise ValueError(f"unknown thresholds: {', '.join(unknown)}")
    for name, limit in limits.items():
        if not math.isfinite(limit) or limit < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be a finite number >= 0, not {limit}")


def has_step_data(con: duckdb.DuckDBPyConnection, run_id: int, steps: StepRange = ALL_STEPS) -> bool:
    """True when the run has any per-step row (samples, step metrics, rank timings, tool calls,
    DAPO batches) in the step range."""
    for relation, column in STEP_SOURCES:
        if fetch_first(con, f"SELECT 1 FROM {relation} WHERE run_id = ? AND {steps.sql(column)} LIMIT 1", [run_id]):
            return True
    return False


def check_run(con: duckdb.DuckDBPyConnection, run_id: int, run: str, limits: dict[str, float],
              steps: StepRange = ALL_STEPS) -> list[Verdict]:
    """Verdicts for each given limit (option name -> limit) on one run, reading the registered summaries."""
    validate_limits(limits)
    analyses = all_analyses()
    summaries: dict[str, pl.DataFrame | None] = {}
    verdicts = []
    for name, limit in limits.items():
        threshold = THRESHOLDS[name]
        if threshold.analysis not in summaries:
            summaries[threshold.analysis] = analyses[threshold.analysis].summary(con, [run_id], steps)
        value, reason = measure(summaries[threshold.analysis], threshold, run)
        verdicts.append(verdict(limit, value, threshold, reason))
    return verdicts


def failed(verdicts: list[Verdict], allow_unmeasurable: bool = False) -> bool:
    """True when a threshold is exceeded, or one is not measurable (unless that is allowed)."""
    bad = {FAIL} if allow_unmeasurable else {FAIL, NOT_MEASURABLE}
    return any(v.status in bad for v in verdicts)


SLOWDOWN_OPTION = "max_slowdown"
SLOWDOWN_METRIC = "slowdown at the same workload against the baseline (efficiency)"
STEP_SLOWDOWN_OPTION = "max_step_slowdown"
STEP_SLOWDOWN_METRIC = "mean step slowdown against the baseline, (B − A) / A, workload and overheads included"


def parse_share(text: str, option: str = "--max-slowdown") -> float:
    """'5%' → 0.05, '0.05' → 0.05; a share must be a finite number >= 0, else ValueError. A bare number
    above 1 is refused (5 would be 500%, likely meant as 5%): above 100% is written with %."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise ValueError(f"{option} takes a share such as 5% or 0.05, not {text!r}") from None
    if not raw.endswith("%") and value > 1:
        raise ValueError(f"{option} {text} would be {value:.0%}: write {text}% for {value:g}%, or a share such as 0.05")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{option} must be a finite share >= 0, not {text!r}")
    return value


def baseline_headline(comparison, judged) -> dict:
    """The comparison's headline for `check --json`'s `baseline`: mean steps, delta_s, the raw slowdown,
    the top cause and the efficiency verdict (`diagnose.verdict`, its `to_dict`); the numbers of the
    comparison are null when there is none (too few steps for a model)."""
    document = {"baseline": judged.a, "a_step_s": None, "b_step_s": None, "delta_s": None, "slowdown": None,
                "top_cause": None, "verdict": judged.to_dict()}
    if comparison is not None:
        top = comparison.top_cause
        document.update(a_step_s=comparison.a.step_s, b_step_s=comparison.b.step_s, delta_s=comparison.delta_s,
                        slowdown=comparison.slowdown,
                        top_cause=None if top is None else {k: top[k] for k in ("cause", "stage", "seconds", "share")})
    return document


def efficiency_gate(judged, limit: float) -> Verdict:
    """The --max-slowdown verdict: the efficiency at the same workload (`diagnose.verdict.judge`) against
    the limit. FAIL when the verdict is `regression` and the efficiency is above `limit`; not
    measurable when the verdict is `inconclusive` (its reasons given); pass otherwise (no change, an
    improvement, or a regression of one stage within the limit)."""
    from polytrace_cli.diagnose.verdict import INCONCLUSIVE, REGRESSION

    threshold = Threshold(SLOWDOWN_OPTION, "against", "efficiency", True, SLOWDOWN_METRIC)
    if judged.verdict == INCONCLUSIVE:
        return verdict(limit, None, threshold, "inconclusive: " + "; ".join(judged.reasons))
    measured = judged.efficiency
    status = FAIL if judged.verdict == REGRESSION and measured > limit else PASS
    return Verdict(SLOWDOWN_OPTION, limit, measured, status, SLOWDOWN_METRIC)


def step_slowdown_gate(comparison, limit: float, error: str | None = None) -> Verdict:
    """The --max-step-slowdown verdict: the raw mean step slowdown delta_s / A's mean step, workload and
    overheads included, FAIL when above `limit`; not measurable without a comparison (`error` says why)."""
    threshold = Threshold(STEP_SLOWDOWN_OPTION, "against", "slowdown", True, STEP_SLOWDOWN_METRIC)
    if comparison is None:
        return verdict(limit, None, threshold, error)
    return verdict(limit, comparison.slowdown, threshold)


def check_baseline(con: duckdb.DuckDBPyConnection, run: str, baseline: str | None, max_slowdown: float | None,
                   max_step_slowdown: float | None, steps: StepRange = ALL_STEPS, baseline_steps: StepRange = ALL_STEPS,
                   baseline_con: duckdb.DuckDBPyConnection | None = None) -> tuple[list[Verdict], dict]:
    """`check RUN --baseline A`: RUN (in `steps`) against A (in `baseline_steps`; RUN itself when None,
    read from `baseline_con` when given: a baseline kept in another store or a lake). The verdicts of
    --max-slowdown (`efficiency_gate`) and --max-step-slowdown (`step_slowdown_gate`) for the limits
    given, and the headline (`baseline_headline`)."""
    from polytrace_cli.diagnose.against import explain_against
    from polytrace_cli.diagnose.verdict import inconclusive, judge
    from polytrace_cli.errors import PolytraceError

    try:
        comparison = explain_against(con, run, baseline, steps, baseline_steps, against_con=baseline_con)
    except PolytraceError as error:
        if "compared with itself" in str(error):
            raise
        comparison, problem = None, str(error)
        judged = inconclusive(baseline or run, run, [problem])
    else:
        judged, problem = judge(comparison), None
    verdicts = []
    if max_slowdown is not None:
        verdicts.append(efficiency_gate(judged, max_slowdown))
    if max_step_slowdown is not None:
        verdicts.append(step_slowdown_gate(comparison, max_step_slowdown, problem))
    return verdicts, baseline_headline(comparison, judged)
