"""index.html: a self-contained page (base64 PNG figures, inline CSS, no network) that opens from disk."""

from __future__ import annotations

import base64
from html import escape

from polytrace_cli.report.comparison import html_section
from polytrace_cli.report.formatting import rows
from polytrace_cli.report.help import WHATIF_NOTE
from polytrace_cli.report.top import HELP_COLUMNS, hidden_line, run_tops

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1100px;
       padding: 0 1rem; color: #1a1a1a; line-height: 1.45; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; } h2 { margin-top: 2.2rem; border-bottom: 1px solid #ddd; }
.meta { color: #555; } ol.findings li { margin: .25rem 0; } figure { margin: 1.5rem 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #444; font-size: .92rem; } .omitted { color: #8a4b00; }
table { border-collapse: collapse; font-size: .85rem; margin: .5rem 0 1rem; display: block; overflow-x: auto; }
th, td { border: 1px solid #ddd; padding: .25rem .5rem; text-align: right; white-space: nowrap; }
th { background: #f4f4f4; } td:first-child, th:first-child { text-align: left; }
details { margin: .4rem 0; } summary { cursor: pointer; font-weight: 600; }
h3 { margin: 1.2rem 0 .3rem; font-size: 1.1rem; } p.typical { margin: .2rem 0 .4rem; font-weight: 600; }
table.help { display: table; width: 100%; } table.help td, table.help th { white-space: normal; text-align: left; }
table.help td:first-child { white-space: nowrap; }
table.help td:nth-child(2), table.help td:nth-child(3), table.help th:nth-child(2), table.help th:nth-child(3) {
  text-align: right; white-space: nowrap; }
table.help tr.folded td { border-top: none; padding: 0 .5rem; font-size: .8rem; color: #444; }
table.help tr.folded summary { font-weight: 400; color: #555; } details.meta summary { font-weight: 400; }
"""

# Marks images the browser could not decode, so a headless browser's DOM dump can be checked.
IMAGE_CHECK = """
window.addEventListener('load', function () {
  var images = document.images, broken = 0;
  for (var i = 0; i < images.length; i++) {
    if (!images[i].complete || images[i].naturalWidth === 0) { broken++; images[i].classList.add('broken'); }
  }
  document.body.setAttribute('data-images', String(images.length));
  document.body.setAttribute('data-broken-images', String(broken));
  // Where each figure sits on the page, so a screenshot of the page can be checked figure by figure.
  var boxes = {};
  for (var j = 0; j < images.length; j++) {
    var box = images[j].getBoundingClientRect(), name = images[j].getAttribute('data-figure');
    if (name) {
      boxes[name] = [Math.round(box.left + window.scrollX), Math.round(box.top + window.scrollY),
                     Math.round(box.width), Math.round(box.height)];
    }
  }
  document.body.setAttribute('data-figure-boxes', JSON.stringify(boxes));
  document.body.setAttribute('data-page-height', String(document.documentElement.scrollHeight));
  document.body.setAttribute('data-page-width', String(document.documentElement.scrollWidth));
  var top = document.getElementById('top');
  if (top) {
    document.body.setAttribute('data-top-height', String(Math.round(top.getBoundingClientRect().bottom + window.scrollY)));
  }
});
"""

SUMMARY_ROW_LIMIT = 200


def table(frame, limit: int | None = SUMMARY_ROW_LIMIT) -> str:
    """A polars frame as an HTML table (the first `limit` rows)."""
    header, body = rows(frame, limit)
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    lines = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in body)
    more = (f"<p class='meta'>{frame.height - limit:,} more rows in summary.json</p>"
            if limit is not None and frame.height > limit else "")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{lines}</tbody></table>{more}"


def findings_section(report) -> str:
    """The Findings, per run: its typical step, its caveats, then its costs ranked (`top.run_tops`)."""
    parts = ["<h2 id='findings'>Findings</h2>"]
    for top in run_tops(report):
        parts.append(f"<h3>{escape(top.run)}</h3>")
        if top.typical:
            parts.append(f"<p class='typical'>{escape(top.typical)}</p>")
        if top.caveats:
            parts.append("<ul class='omitted'>" + "".join(f"<li>{escape(c)}</li>" for c in top.caveats) + "</ul>")
        if top.costs:
            parts.append("<ol class='findings'>" + "".join(f"<li>{escape(c)}</li>" for c in top.costs) + "</ol>")
        hidden = hidden_line(top)
        if hidden:
            parts.append(f"<p class='meta'>{escape(hidden)}</p>")
    return "".join(parts)


def help_section(report) -> str:
    """What would help, one table per run: policy, saving, its error, how sure, why; each row's assumption
    folded under it, the policies not in the table in one folded line, the model's backtest below."""
    tops = [top for top in run_tops(report) if top.rows or top.folded]
    if not tops:
        return ("<h2 id='help'>What would help</h2><p class='meta'>No counterfactual could be computed: the runs "
                f"have no step timings or data-parallel rank loads.</p><p class='meta'>{escape(WHATIF_NOTE)}</p>")
    parts = ["<h2 id='help'>What would help</h2>"]
    head = "".join(f"<th>{escape(name)}</th>" for name in HELP_COLUMNS)
    for top in tops:
        parts.append(f"<h3>{escape(top.run)}</h3>")
        if top.rows:
            body = []
            for row in top.rows:
                cells = "".join(f"<td>{escape(cell)}</td>" for cell in row.cells)
                body.append(f"<tr>{cells}</tr>")
                if row.folded:
                    body.append(f"<tr class='folded'><td colspan='{len(HELP_COLUMNS)}'><details><summary>assumptions"
                                f"</summary>{escape(row.folded)}</details></td></tr>")
            parts.append(f"<table class='help'><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")
        if top.folded:
            items = "".join(f"<li>{escape(line)}</li>" for line in top.folded)
            parts.append(f"<details class='meta'><summary>{escape(top.folded_title)}</summary><ul>{items}</ul></details>")
        if top.backtest:
            parts.append(f"<p class='meta'>{escape(top.backtest)}</p>")
    parts.append(f"<details class='meta'><summary>how these savings are priced</summary>{escape(WHATIF_NOTE)}</details>")
    return "".join(parts)


def _left_out(figure) -> str:
    if not figure.runs_left_out or figure.omitted:
        return ""
    text = "; ".join(f"{run}: {reason}" for run, reason in figure.runs_left_out.items())
    return f" <span class='omitted'>Runs left out: {escape(text)}.</span>"


def _svg_link(figure) -> str:
    return f"<a href='figures/{escape(figure.svg.name)}'>SVG</a>, " if figure.svg else ""


def _figure(figure) -> str:
    anchor = f"id='{escape(figure.id)}'"
    if figure.failed:
        return (f"<p {anchor} class='omitted'><strong>{escape(figure.id)} {escape(figure.title)}</strong>: "
                f"failed: {escape(figure.failed)}</p>")
    if figure.omitted:
        return (f"<p {anchor} class='omitted'><strong>{escape(figure.id)} {escape(figure.title)}</strong>: "
                f"omitted: {escape(figure.omitted)}</p>")
    data = base64.b64encode(figure.png.read_bytes()).decode("ascii")
    return (f"<figure {anchor}><img src='data:image/png;base64,{data}' alt='{escape(figure.id)} {escape(figure.title)}' "
            f"data-figure='{escape(figure.png.name)}'>"
            f"<figcaption><strong>{escape(figure.id)}</strong> {escape(figure.title)}. {escape(figure.caption)}"
            f"{_left_out(figure)} "
            f"({_svg_link(figure)}<a href='figures/{escape(figure.png.name)}'>PNG</a>)"
            f"</figcaption></figure>")


def render(report) -> str:
    """The HTML text of a Report."""
    runs = ", ".join(escape(r) for r in report.runs)
    step_range = ""
    if report.steps.first is not None or report.steps.last is not None:
        step_range = f"; steps {report.steps.first if report.steps.first is not None else ''}:" \
                     f"{report.steps.last if report.steps.last is not None else ''}"
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>polytrace: {escape(report.name)}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>polytrace report: {escape(report.name)}</h1>",
        f"<section id='top'>{findings_section(report)}{help_section(report)}</section>",
        html_section(report.comparisons),
        f"<h2>Runs</h2><p class='meta'>Runs: {runs}{escape(step_range)}. "
        "Numbers behind every figure are in <a href='summary.json'>summary.json</a> and "
        "<a href='summary.md'>summary.md</a>.</p>",
        "<h2>T1: cross-run summary</h2>",
        table(report.table, None) if report.table is not None
        else f"<p class='omitted'>T1 omitted: {escape(report.table_omitted or '')}</p>",
        "<h2>Figures</h2>",
        *(_figure(f) for f in report.figures),
        "<h2>Analysis summaries</h2>",
    ]
    for name, frame in report.summaries.items():
        body = table(frame) if frame.height else "<p class='meta'>no rows: the runs lack the data this analysis needs</p>"
        parts.append(f"<details><summary>{escape(name)} ({frame.height} rows)</summary>{body}</details>")
    for name, error in report.analysis_errors.items():
        parts.append(f"<p class='omitted'><strong>{escape(name)}</strong> failed: {escape(error)}</p>")
    parts.append(f"<script>{IMAGE_CHECK}</script></body></html>\n")
    return "\n".join(parts)
