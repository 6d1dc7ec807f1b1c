"""Write a report folder: figures, summary.json, summary.md and a self-contained index.html."""

from __future__ import annotations

import json
import re
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import polars as pl
from matplotlib.figure import Figure

from polytrace_cli.analyze.common import ALL_STEPS, StepRange, run_names
from polytrace_cli.errors import PolytraceError
from polytrace_cli.report import help as what_would_help
from polytrace_cli.report import html, markdown
from polytrace_cli.report.figures import figure_modules
from polytrace_cli.report.figures.base import Omitted
from polytrace_cli.report.numbers import ReportNumbers, compute_numbers, first_line
from polytrace_cli.report.painting import paint_all
from polytrace_cli.analyze.shared_frames import once_per_report
from polytrace_cli.report.folder import check_report_name

# Where a report takes the numbers beside its figures from: (con, run_ids, steps) -> ReportNumbers.
NumbersSource = Callable[[duckdb.DuckDBPyConnection, list[int], StepRange], ReportNumbers]


@dataclass
class FigureResult:
    """One figure of a report: its files, or the reason it was left out."""

    id: str
    title: str
    caption: str
    png: Path | None = None
    svg: Path | None = None
    omitted: str | None = None
    failed: str | None = None
    seconds: float = 0.0
    data: dict[str, pl.DataFrame] = field(default_factory=dict)
    runs: list[str] = field(default_factory=list)
    runs_left_out: dict[str, str] = field(default_factory=dict)


@dataclass
class Report:
    """Everything a report holds, before it is written as HTML and Markdown."""

    name: str
    runs: list[str]
    steps: StepRange
    figures: list[FigureResult] = field(default_factory=list)
    table: pl.DataFrame | None = None
    table_omitted: str | None = None
    summaries: dict[str, pl.DataFrame] = field(default_factory=dict)
    analysis_errors: dict[str, str] = field(default_factory=dict)
    findings: list[dict] = field(default_factory=list)
    help: list[dict] = field(default_factory=list)
    semantics: dict[str, dict] = field(default_factory=dict)  # run -> what its numbers mean (`analyze.semantics`)
    comparisons: list[dict] = field(default_factory=list)
    typical_steps: dict[str, dict] = field(default_factory=dict)  # run -> where its typical step goes


def default_name(names: list[str]) -> str:
    """A folder name from the run names: joined with '+', unsafe characters replaced, at most 80 chars."""
    joined = "+".join(names) if names else "empty"
    safe = re.sub(r"[^A-Za-z0-9._+-]+", "-", joined).strip("-.") or "report"
    return safe if len(safe) <= 80 else f"{safe[:70]}+{len(names)}runs"


def shown_runs(data: dict[str, pl.DataFrame], runs: list[str]) -> list[str]:
    """The report's runs that have rows in any of a drawn figure's per-run frames (those with a `run`
    column; a per-group frame names its runs in a frame of its own), in report order."""
    present = set()
    for frame in data.values():
        if frame is not None and frame.height and "run" in frame.columns:
            present |= set(frame["run"].unique().to_list())
    return [run for run in runs if run in present]


def _draw(module, con, run_ids, steps, figures_dir: Path, runs: list[str],
          svg: bool = False) -> tuple[FigureResult, Figure | None]:
    """The figure's result and its drawn figure (None when it was left out or failed), whose files
    are named in the result but not yet written (see `painting`)."""
    result = FigureResult(module.ID, module.TITLE, module.CAPTION)
    started = time.perf_counter()
    try:
        data = module.frames(con, run_ids, steps)
        drawn = module.render(data)
    except PolytraceError:
        raise
    except Exception as error:  # one broken figure must not cost the whole report; the page shows the failure
        result.failed = f"{type(error).__name__}: {first_line(error)}"
        result.seconds = time.perf_counter() - started
        return result, None
    if isinstance(drawn, Omitted):
        result.omitted = drawn.reason
        result.runs_left_out = {run: module.LEFT_OUT for run in runs}
        drawn = None
    else:
        result.data = data
        result.runs = shown_runs(data, runs)
        result.runs_left_out = {run: module.LEFT_OUT for run in runs if run not in result.runs}
        if result.runs_left_out:
            # Said in the figure itself too, so a PNG passed around on its own does not hide the runs it lacks.
            note = f"Not shown ({module.LEFT_OUT}): {', '.join(result.runs_left_out)}"
            drawn.suptitle("\n".join(textwrap.wrap(note, 150)), fontsize=8, color="#8a4b00")
        stem = f"{module.ID.lower()}_{module.__name__.rsplit('.', 1)[1].split('_', 1)[1]}"
        result.png = figures_dir / f"{stem}.png"
        if svg:
            result.svg = figures_dir / f"{stem}.svg"
    result.seconds = time.perf_counter() - started
    return result, drawn


def build_report(con: duckdb.DuckDBPyConnection, run_ids: list[int], out_dir: Path, name: str | None = None,
                 steps: StepRange = ALL_STEPS, svg: bool = False, numbers: NumbersSource = compute_numbers) -> Report:
    """Draw every figure into `<out_dir>/<name>/figures` (PNG, and SVG too with `svg`) and take the
    page's other numbers from `numbers(con, run_ids, steps)`; returns the Report."""
    if not run_ids:
        raise PolytraceError("the store has no runs to report on; run `polytrace ingest PATH` first")
    names_by_id = run_names(con, run_ids)
    names = [names_by_id[i] for i in run_ids]
    report = Report(name=name or default_name(names), runs=names, steps=steps)
    figures_dir = Path(out_dir) / report.name / "figures"
    figures_dir.mkdir(parents=True, exist_ok=True)
    for stale in [*figures_dir.glob("*.png"), *figures_dir.glob("*.svg")]:
        stale.unlink()
    # Frames that figures and findings both read are computed once (see shared_frames).
    with once_per_report():
        drawn = []
        for module in figure_modules():
            result, figure = _draw(module, con, run_ids, steps, figures_dir, names, svg)
            report.figures.append(result)
            if figure is not None:
                drawn.append((result, figure))
        # The numbers are computed while a second process paints (see painting.paint_all).
        computed_numbers: list[ReportNumbers] = []
        painted = paint_all([(figure, result.png, result.svg) for result, figure in drawn],
                            alongside=lambda: computed_numbers.append(numbers(con, run_ids, steps)))
        for (result, _), seconds in zip(drawn, painted):
            result.seconds += seconds
    computed = computed_numbers[0]
    report.summaries, report.analysis_errors = computed.summaries, computed.analysis_errors
    report.table, report.table_omitted = computed.table, computed.table_omitted
    report.findings, report.help = computed.findings, computed.help
    report.typical_steps = computed.typical_steps
    from polytrace_cli.analyze.semantics import records_by_name

    report.semantics = records_by_name(con, run_ids)
    report.comparisons = computed.comparisons
    return report


def _rows(frame: pl.DataFrame) -> list[dict]:
    """The frame's rows as dicts, NaN and ±inf floats as null (JSON has no NaN)."""
    floats = [name for name, dtype in frame.schema.items() if dtype.is_float()]
    if floats:
        frame = frame.with_columns(pl.when(pl.col(name).is_finite()).then(pl.col(name)).alias(name) for name in floats)
    return frame.to_dicts()


def summary_document(report: Report) -> dict:
    """Each run's typical step, semantics record, the findings and what would help, the comparisons of runs of one task,
    `{analysis: rows}` for every registered analysis, T1, the figures
    drawn and left out (each with the runs it shows and the runs it left out with the reason), and per drawn
    figure the rows of the analysis frames it was drawn from (`figure_data: {figure id: {frame: rows}}`)."""
    return {
        "report": report.name,
        "runs": report.runs,
        "findings": report.findings,
        "what_would_help": report.help,
        "what_would_help_note": what_would_help.WHATIF_NOTE,
        "typical_steps": report.typical_steps,
        "semantics": report.semantics,
        "comparisons": report.comparisons,
        "analyses": {name: _rows(frame) for name, frame in report.summaries.items()},
        "analysis_errors": report.analysis_errors,
        "table_T1": _rows(report.table) if report.table is not None else None,
        "figures": [{"id": f.id, "title": f.title, "png": f.png.name if f.png else None,
                     "svg": f.svg.name if f.svg else None, "omitted": f.omitted,
                     "failed": f.failed, "seconds": round(f.seconds, 3), "runs": f.runs,
                     "runs_left_out": f.runs_left_out} for f in report.figures],
        "figure_data": {f.id: {name: _rows(frame) for name, frame in f.data.items() if frame is not None}
                        for f in report.figures if f.png},
    }


def summary_json(report: Report) -> str:
    """summary.json's text: `summary_document` with decimals and dates made JSON, NaN as null; one
    line per top-level key (json's C encoder writes compact text only: indenting every row of the
    figures' data took most of the report's last, single-core, tenth of a second)."""
    from polytrace_cli.jsontext import json_default

    lines = [f"{json.dumps(key)}: {json.dumps(value, default=json_default)}"
             for key, value in summary_document(report).items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def write_report(con: duckdb.DuckDBPyConnection, run_ids: list[int], out_dir: Path | str = "reports",
                 name: str | None = None, steps: StepRange = ALL_STEPS, svg: bool = False,
                 numbers: NumbersSource = compute_numbers) -> Path:
    """Write `<out_dir>/<name>/index.html`, `summary.md`, `summary.json` and `figures/` (each figure as PNG;
    as SVG too with `svg`); returns index.html."""
    report = build_report(con, run_ids, Path(out_dir), name, steps, svg, numbers)
    folder = Path(out_dir) / report.name
    (folder / "summary.json").write_text(summary_json(report))
    (folder / "summary.md").write_text(markdown.render(report))
    index = folder / "index.html"
    index.write_text(html.render(report))
    return index


def write_runs_report(con: duckdb.DuckDBPyConnection, ids: list[int], out_dir: Path | str = "reports",
                      name: str | None = None, steps: StepRange | str | None = None, svg: bool = False,
                      numbers: NumbersSource = compute_numbers) -> Path:
    """`write_report` for the runs (their ids: every run of the store when the caller named none); returns
    index.html. A name that is not a plain folder name, no run or an unwritable folder is an error."""
    step_range = StepRange.of(steps)
    check_report_name(name)
    if not ids:
        raise PolytraceError("the store has no runs to report on; run `polytrace ingest PATH` first")
    try:
        return write_report(con, ids, out_dir, name, step_range, svg, numbers)
    except OSError as error:
        raise PolytraceError(f"cannot write the report under {out_dir}: {error.strerror or error}") from None
