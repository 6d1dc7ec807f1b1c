"""A report's numbers, apart from its figures: every analysis' summary, table T1, each run's typical step,
the findings and what would help.

They come in two parts. The modelled part (`ModelledNumbers`) needs scipy, scikit-learn and the
step-time model: the summaries of `SCIPY_ANALYSES` and each run's explain findings and what-if
entries. The rest needs only polars and DuckDB, and reads frames the figures read too.
`store_report.write_store_report` computes the modelled part in a second process while the first one
draws, then the rest in the first, where the figures' frames are at hand (`shared_frames`). Nothing
here imports matplotlib.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import duckdb
import polars as pl

from polytrace_cli.analyze.common import StepRange
from polytrace_cli.analyze.registry import ANALYSES, SCIPY_ANALYSES, named_analyses
from polytrace_cli.analyze.shared_frames import once_per_report
from polytrace_cli.analyze.typical_step import typical_steps
from polytrace_cli.errors import PolytraceError
from polytrace_cli.report import help as what_would_help
from polytrace_cli.report.comparison import run_comparisons
from polytrace_cli.report.figures.base import Omitted
from polytrace_cli.report.findings import Explained, build_findings, explained_by_run
from polytrace_cli.report.tables import t1_summary


@dataclass
class ReportNumbers:
    """Everything on a report page that is not a figure."""

    summaries: dict[str, pl.DataFrame] = field(default_factory=dict)
    analysis_errors: dict[str, str] = field(default_factory=dict)
    table: pl.DataFrame | None = None
    table_omitted: str | None = None
    findings: list[dict] = field(default_factory=list)
    help: list[dict] = field(default_factory=list)
    comparisons: list[dict] = field(default_factory=list)
    typical_steps: dict[str, dict] = field(default_factory=dict)  # run -> `analyze.typical_step.typical_steps`


@dataclass
class ModelledNumbers:
    """The numbers that need scipy, scikit-learn or the step-time model: the summaries of
    `SCIPY_ANALYSES` (and their errors), explain's findings, the what-if entries per run id and the
    comparisons of runs of one task (`report.comparison`)."""

    summaries: dict[str, pl.DataFrame] = field(default_factory=dict)
    analysis_errors: dict[str, str] = field(default_factory=dict)
    explained: Explained = field(default_factory=dict)
    model_help: dict[int, list[dict] | None] = field(default_factory=dict)
    comparisons: list[dict] = field(default_factory=list)


def first_line(error: Exception) -> str:
    """The first line of the error's message ('' when it has none)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


def summaries(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange,
              names: tuple[str, ...] = ANALYSES) -> tuple[dict[str, pl.DataFrame], dict[str, str]]:
    """The named analyses' summary frames (every registered one by default), and `{analysis: "Error:
    first line"}` for those that failed: one broken analysis must not cost the whole report (a user error
    still stops it). Only the named analyses' modules are imported."""
    frames, errors = {}, {}
    for name, analysis in named_analyses(list(names)).items():
        try:
            frames[name] = analysis.summary(con, run_ids, steps)
        except PolytraceError:
            raise
        except Exception as error:
            errors[name] = f"{type(error).__name__}: {first_line(error)}"
    return frames, errors


def modelled_numbers(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange) -> ModelledNumbers:
    """The modelled part of the report's numbers (see ModelledNumbers)."""
    numbers = ModelledNumbers()
    with once_per_report():
        numbers.summaries, numbers.analysis_errors = summaries(con, run_ids, steps, SCIPY_ANALYSES)
        numbers.explained = explained_by_run(con, run_ids)
        numbers.model_help = what_would_help.model_help_by_run(con, run_ids)
        numbers.comparisons = run_comparisons(con, run_ids, steps)
    return numbers


def compute_numbers(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange,
                    modelled: Callable[[], ModelledNumbers] | None = None) -> ReportNumbers:
    """The report's numbers for the runs: summaries, T1 (or why it is left out), findings and what
    would help. The modelled part comes from `modelled()` when it is computed elsewhere (called once the
    other summaries are done, so that they are computed while it is awaited). Frames and workloads that
    several of them read are read once."""
    numbers = ReportNumbers()
    with once_per_report():
        rest = tuple(name for name in ANALYSES if name not in SCIPY_ANALYSES)
        frames, errors = summaries(con, run_ids, steps, rest)
        modelled = modelled() if modelled is not None else modelled_numbers(con, run_ids, steps)
        frames |= modelled.summaries
        errors |= modelled.analysis_errors
        numbers.summaries = {name: frames[name] for name in ANALYSES if name in frames}
        numbers.analysis_errors = {name: errors[name] for name in ANALYSES if name in errors}
        table = t1_summary.table(con, run_ids, steps, numbers.summaries)
        if isinstance(table, Omitted):
            numbers.table_omitted = table.reason
        else:
            numbers.table = table
        numbers.typical_steps = typical_steps(con, run_ids, steps)
        numbers.findings = build_findings(con, run_ids, steps, numbers.summaries, modelled.explained)
        numbers.help = what_would_help.build_help(numbers.summaries, con, run_ids, modelled.model_help)
        numbers.comparisons = modelled.comparisons
    return numbers
