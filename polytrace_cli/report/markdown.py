"""summary.md: the report as Markdown (figures linked, omissions explained, T1 and every summary)."""

from __future__ import annotations

import re

from polytrace_cli.report.comparison import markdown_lines
from polytrace_cli.report.formatting import rows
from polytrace_cli.report.help import WHATIF_NOTE
from polytrace_cli.report.top import HELP_COLUMNS, hidden_line, run_tops

SUMMARY_ROW_LIMIT = 50

# Characters of a name (a run, a table cell) that Markdown or the HTML it may hold would read as markup.
_NAME_MARKUP = re.compile(r"([\\`*_\[\]<>|~&#!])")
# In prose: only what would open raw HTML or an entity, or end a table cell.
_TEXT_MARKUP = re.compile(r"([\\<>&|])")


def md_name(text: object) -> str:
    """A run name (or any name or cell) as Markdown that shows it as written: markup characters
    backslash-escaped, line breaks as spaces, so `<img src=x onerror=...>` stays text."""
    return _NAME_MARKUP.sub(r"\\\1", " ".join(str(text).splitlines()))


def md_text(text: object) -> str:
    """A sentence as Markdown: characters that could open raw HTML or an entity backslash-escaped."""
    return _TEXT_MARKUP.sub(r"\\\1", " ".join(str(text).splitlines()))


def table(frame, limit: int | None = SUMMARY_ROW_LIMIT) -> str:
    """A polars frame as a GitHub-flavoured Markdown table, each cell escaped (`md_name`)."""
    header, body = rows(frame, limit)
    lines = ["| " + " | ".join(md_name(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(md_name(c) for c in row) + " |" for row in body]
    if limit is not None and frame.height > limit:
        lines.append(f"\n({frame.height - limit:,} more rows in summary.json)")
    return "\n".join(lines)


def _escaped_comparison_line(line: str) -> str:
    """A line of the runs-compared section with the run names it holds escaped: headings name runs."""
    if line.startswith("### "):
        return "### " + md_name(line[4:])
    if line.startswith("- "):
        return "- " + md_text(line[2:])
    return line


def render(report) -> str:
    """The Markdown text of a Report; run names and other text from the logs are escaped."""
    out = [f"# polytrace report: {md_name(report.name)}", "", "## Findings", ""]
    tops = run_tops(report)
    for top in tops:
        out += [f"### {md_name(top.run)}", ""]
        if top.typical:
            out += [f"**{md_text(top.typical)}**", ""]
        out += [f"- {md_text(caveat)}" for caveat in top.caveats]
        out += [f"{index}. {md_text(cost)}" for index, cost in enumerate(top.costs, 1)]
        hidden = hidden_line(top)
        out += [f"\n({md_text(hidden)})" if hidden else "", ""]
    out += ["## What would help", ""]
    helped = [top for top in tops if top.rows or top.folded]
    if not helped:
        out.append("No counterfactual could be computed: the runs have no step timings or data-parallel rank loads.")
    for top in helped:
        out += [f"### {md_name(top.run)}", ""]
        if top.rows:
            out += ["| " + " | ".join(HELP_COLUMNS) + " |", "|" + "---|" * len(HELP_COLUMNS)]
            out += ["| " + " | ".join(md_text(cell) for cell in row.cells) + " |" for row in top.rows]
            out += ["", *(f"- {md_text(row.cells[0])}: {md_text(row.folded)}" for row in top.rows if row.folded)]
        if top.folded:
            out += ["", f"{md_text(top.folded_title)}:", *(f"- {md_text(line)}" for line in top.folded)]
        if top.backtest:
            out += ["", md_text(top.backtest)]
        out.append("")
    out += ["", WHATIF_NOTE, ""]
    out += [_escaped_comparison_line(line) for line in markdown_lines(report.comparisons)]
    out += ["## Runs", ""]
    out += [f"Runs: {', '.join(md_name(run) for run in report.runs)}"
            + (f"; steps {report.steps.first}:{report.steps.last}"
               if report.steps.first is not None or report.steps.last is not None else ""),
            "", "## T1: cross-run summary", ""]
    out.append(table(report.table, None) if report.table is not None else f"omitted: {md_text(report.table_omitted)}")
    out += ["", "## Figures", ""]
    for figure in report.figures:
        if figure.failed:
            out.append(f"- **{figure.id}** {figure.title}: failed: {md_text(figure.failed)}")
        elif figure.omitted:
            out.append(f"- **{figure.id}** {figure.title}: omitted: {md_text(figure.omitted)}")
        else:
            left_out = "; ".join(f"{md_name(run)}: {md_text(reason)}" for run, reason in figure.runs_left_out.items())
            svg = f", [svg](figures/{figure.svg.name})" if figure.svg else ""
            out.append(f"- **{figure.id}** {figure.title}: [png](figures/{figure.png.name}){svg}"
                       + (f". Runs left out: {left_out}." if left_out else ""))
    out += ["", "## Analysis summaries", ""]
    for name, frame in report.summaries.items():
        out += [f"### {name}", ""]
        out.append(table(frame) if frame.height else "no rows: the runs lack the data this analysis needs")
        out.append("")
    for name, error in report.analysis_errors.items():
        out += [f"### {name}", "", f"failed: {md_text(error)}", ""]
    return "\n".join(out).rstrip() + "\n"
