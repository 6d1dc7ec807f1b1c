"""summary.md: the report as Markdown (figures linked, omissions explained, T1 and every summary)."""

from __future__ import annotations

from polytrace_cli.report.comparison import markdown_lines
from polytrace_cli.report.findings import SHOWN
from polytrace_cli.report.formatting import rows
from polytrace_cli.report.help import WHATIF_NOTE, backtest_lines

SUMMARY_ROW_LIMIT = 50


def table(frame, limit: int | None = SUMMARY_ROW_LIMIT) -> str:
    """A polars frame as a GitHub-flavoured Markdown table."""
    header, body = rows(frame, limit)
    escape = lambda text: text.replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(escape(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(escape(c) for c in row) + " |" for row in body]
    if limit is not None and frame.height > limit:
        lines.append(f"\n({frame.height - limit:,} more rows in summary.json)")
    return "\n".join(lines)


def render(report) -> str:
    """The Markdown text of a Report."""
    out = [f"# polytrace report: {report.name}", "", "## Findings", ""]
    measured = [f for f in report.findings if f["cause"] != "not-measured"]
    out += [f"{index}. {f['text']}" for index, f in enumerate(measured[:SHOWN], 1)]
    out += [f"- {f['text']}" for f in report.findings if f["cause"] == "not-measured"]
    if len(measured) > SHOWN:
        out.append(f"\n({len(measured) - SHOWN} more findings in summary.json)")
    out += ["", "## What would help", ""]
    out += [f"- {h['text']}" for h in report.help] or \
        ["No counterfactual could be computed: the runs have no data-parallel rank loads."]
    out += ["", *backtest_lines(report.help).values()] if backtest_lines(report.help) else []
    out += ["", WHATIF_NOTE, ""]
    out += markdown_lines(report.comparisons)
    out += ["## Runs", ""]
    out += [f"Runs: {', '.join(report.runs)}" + (f"; steps {report.steps.first}:{report.steps.last}"
                                                 if report.steps.first is not None or report.steps.last is not None else ""),
           "", "## T1: cross-run summary", ""]
    out.append(table(report.table, None) if report.table is not None else f"omitted: {report.table_omitted}")
    out += ["", "## Figures", ""]
    for figure in report.figures:
        if figure.failed:
            out.append(f"- **{figure.id}** {figure.title}: failed: {figure.failed}")
        elif figure.omitted:
            out.append(f"- **{figure.id}** {figure.title}: omitted: {figure.omitted}")
        else:
            left_out = "; ".join(f"{run}: {reason}" for run, reason in figure.runs_left_out.items())
            svg = f", [svg](figures/{figure.svg.name})" if figure.svg else ""
            out.append(f"- **{figure.id}** {figure.title}: [png](figures/{figure.png.name}){svg}"
                       + (f". Runs left out: {left_out}." if left_out else ""))
    out += ["", "## Analysis summaries", ""]
    for name, frame in report.summaries.items():
        out += [f"### {name}", ""]
        out.append(table(frame) if frame.height else "no rows: the runs lack the data this analysis needs")
        out.append("")
    for name, error in report.analysis_errors.items():
        out += [f"### {name}", "", f"failed: {error}", ""]
    return "\n".join(out).rstrip() + "\n"
