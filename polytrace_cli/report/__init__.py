"""Reports: figures drawn from analysis frames, a self-contained index.html, summary.md and summary.json."""

from polytrace_cli.report.writer import build_report, write_report, write_runs_report

__all__ = ["build_report", "write_report", "write_runs_report"]
