"""`polytrace analyze` and `polytrace compare`: the registered analyses' summaries, alone or side by side.

Output for scripts:
- `--json` prints `{"<analysis>": [row, ...], ...}` with each analysis' own column names;
- `--csv` prints one CSV holding every selected analysis: an `analysis` column first, then the
  union of the analyses' columns (a cell is empty where an analysis has no such column; list and
  JSON values are written as JSON text). Use `--only NAME` for a single analysis' columns.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from polytrace_cli.commands.common import CsvOption, DbOption, JsonOption, console, emit_frame, user_errors
from polytrace_cli.errors import PolytraceError

OnlyOption = Annotated[
    str | None, typer.Option("--only", help="Comma-separated analyses to run (default: all; see the list in --help).")
]
StepsOption = Annotated[str | None, typer.Option("--steps", help="Step range A:B, A:, :B or N (default: every step).")]


def _summaries(db, runs: list[str] | None, only: str | None, steps: str | None) -> dict:
    from polytrace_cli.analyze.results import summaries
    from polytrace_cli.store import open_store

    con = open_store(db, read_only=True)
    try:
        return summaries(con, runs, only, steps)
    finally:
        con.close()


def _fleet(db, runs: list[str] | None, by: str, steps: str | None):
    from polytrace_cli.analyze.common import StepRange
    from polytrace_cli.analyze.fleet import by_group
    from polytrace_cli.store import open_store
    from polytrace_cli.store.queries import run_ids

    con = open_store(db, read_only=True)
    try:
        ids = run_ids(con, runs)
        if not ids:
            raise PolytraceError("the store holds no runs yet (polytrace ingest PATH first)")
        return by_group(con, ids, by, StepRange.parse(steps))
    finally:
        con.close()


@user_errors
def analyze(
    runs: Annotated[list[str] | None, typer.Argument(help="Runs to analyze (default: every run).")] = None,
    only: OnlyOption = None,
    steps: StepsOption = None,
    as_json: JsonOption = False,
    as_csv: CsvOption = False,
    db: DbOption = None,
    by: Annotated[str | None, typer.Option(
        "--by", help="Aggregate across runs per task or per model (the fleet table) instead of per run.")] = None,
) -> None:
    """Run the characterization analyses (lengths, drift, longtail, stages, imbalance, tools, filtering, fit)."""
    from polytrace_cli.analyze.registry import all_analyses
    from polytrace_cli.analyze.results import results_csv, results_json

    if as_json and as_csv:
        raise PolytraceError("choose one of --json and --csv")
    if by is not None:
        if only:
            raise PolytraceError("--only picks per-run analyses; --by prints the fleet table alone")
        results = {"fleet": _fleet(db, runs, by, steps)}
        analyses = {}
    else:
        results = _summaries(db, runs, only, steps)
        analyses = all_analyses()
    if as_json:
        sys.stdout.write(results_json(results) + "\n")
    elif as_csv:
        sys.stdout.write(results_csv(results))
    else:
        for name, df in results.items():
            if df.height:
                description = analyses[name].description if name in analyses else f"runs grouped by {by}"
                emit_frame(df, title=f"{name}: {description}")
            else:
                console.print(f"[dim]{name}: no rows: the selected runs and steps hold no data it can use[/]",
                              highlight=False)


@user_errors
def compare(
    run_a: Annotated[str, typer.Argument(help="The baseline run.")],
    run_b: Annotated[str, typer.Argument(help="The run compared with it.")],
    only: OnlyOption = None,
    steps: StepsOption = None,
    as_json: JsonOption = False,
    as_csv: CsvOption = False,
    db: DbOption = None,
) -> None:
    """The analyses' summary numbers of two runs side by side, with absolute and relative deltas (B − A)."""
    from polytrace_cli.analyze.results import compare_frame

    if as_json and as_csv:
        raise PolytraceError("choose one of --json and --csv")
    if run_a == run_b:
        raise PolytraceError("compare needs two different runs")
    results = _summaries(db, [run_a, run_b], only, steps)
    emit_frame(compare_frame(run_a, run_b, results), as_json=as_json, as_csv=as_csv,
               title=f"{run_b} vs {run_a} (delta = {run_b} − {run_a})")
