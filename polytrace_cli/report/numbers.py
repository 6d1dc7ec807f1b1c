"""A report's numbers, apart from its figures: every analysis' summary, table T1, the findings and what
would help.

They need scipy, scikit-learn and the step-time model but never matplotlib, and the figures need
matplotlib but none of those, so `writer.write_store_report` computes them in a second process
while the first one draws (see `side_process`). Nothing here imports matplotlib.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb
import polars as pl

from polytrace_cli.analyze.common import StepRange
from polytrace_cli.analyze.registry import all_analyses
from polytrace_cli.errors import PolytraceError
from polytrace_cli.report import help as what_would_help
from polytrace_cli.report.figures.base import Omitted
from polytrace_cli.report.findings import build_findings
from polytrace_cli.analyze.shared_frames import once_per_report
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


def first_line(error: Exception) -> str:
    """The first line of the error's message ('' when it has none)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


def summaries(con: duckdb.DuckDBPyConnection, run_ids: list[int],
              steps: StepRange) -> tuple[dict[str, pl.DataFrame], dict[str, str]]:
    """Every registered analysis' summary frame, and `{analysis: "Error: first line"}` for those that
    failed: one broken analysis must not cost the whole report (a user error still stops it)."""
    frames, errors = {}, {}
    for name, analysis in all_analyses().items():
        try:
            frames[name] = analysis.summary(con, run_ids, steps)
        except PolytraceError:
            raise
        except Exception as error:
            errors[name] = f"{type(error).__name__}: {first_line(error)}"
    return frames, errors


def compute_numbers(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange) -> ReportNumbers:
    """The report's numbers for the runs: summaries, T1 (or why it is left out), findings and what
    would help. Frames and workloads that several of them read are read once."""
    from polytrace_cli.model import shared_workloads

    numbers = ReportNumbers()
    with once_per_report(), shared_workloads():
        numbers.summaries, numbers.analysis_errors = summaries(con, run_ids, steps)
        table = t1_summary.table(con, run_ids, steps, numbers.summaries)
        if isinstance(table, Omitted):
            numbers.table_omitted = table.reason
        else:
            numbers.table = table
        numbers.findings = build_findings(con, run_ids, steps, numbers.summaries)
        numbers.help = what_would_help.build_help(numbers.summaries, con, run_ids)
    return numbers
