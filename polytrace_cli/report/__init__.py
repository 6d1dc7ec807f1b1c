"""The HTML report: figures, summary.json, summary.md and a self-contained index.html.

`write_forked_report` (what `polytrace report` runs, through `Store.write_report`) loads nothing heavy
before it forks; the writer, which loads matplotlib, is imported on first use of its names.
"""

from polytrace_cli.report.store_report import write_forked_report

_WRITER_NAMES = ("build_report", "write_report", "write_runs_report")


def __getattr__(name: str):
    if name in _WRITER_NAMES:
        from polytrace_cli.report import writer

        return getattr(writer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [*_WRITER_NAMES, "write_forked_report"]
