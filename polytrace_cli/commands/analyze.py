"""`polytrace analyze` and `polytrace compare`: the registered analyses' summaries, alone or side by side.

For people, each analysis is one table cut to the terminal's width: the run and key columns, then
as many of the analysis' headline numbers as fit (`--wide`: every column). Output for scripts:
- `--json` prints `{"<analysis>": [row, ...], ...}` with each analysis' own column names;
- `--csv` prints one CSV holding every selected analysis: an `analysis` column first, then the
  union of the analyses' columns (a cell is empty where an analysis has no such column; list and
  JSON values are written as JSON text). Use `--only NAME` for a single analysis' columns.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated

import typer

from polytrace_cli.commands.common import (CsvOption, DbOption, JsonOption, StepsOption, WaitOption, WideOption,
                                          console, emit_frame, err_console, user_errors)
from polytrace_cli.errors import PolytraceError

if TYPE_CHECKING:
    import polars as pl

OnlyOption = Annotated[
    str | None, typer.Option("--only", help="Comma-separated analyses to run (default: all; see the list in --help).")
]


SplitOption = Annotated[str, typer.Option(
    "--split", help="Samples to analyze: training (default) or validation (samples with validate true; "
    "lengths, drift, longtail and fit).")]


def _summaries(db, runs: list[str] | None, only: str | None, steps: str | None, split: str,
               wait: float) -> tuple[dict, list[str]]:
    from polytrace_cli.facade import Store

    with Store.open(db, read_only=True, wait=wait) as store:
        return store.summaries_with_notes(runs, only, steps, split)


def _stage_meanings(db, runs: list[str] | None, wait: float):
    from polytrace_cli.facade import Store

    with Store.open(db, read_only=True, wait=wait) as store:
        return store.stage_meanings(runs)


def _fleet(db, runs: list[str] | None, by: str, steps: str | None, wait: float = 0):
    from polytrace_cli.facade import Store

    with Store.open(db, read_only=True, wait=wait) as store:
        return store.by_group(by, runs, steps)


@user_errors
def analyze(
    runs: Annotated[list[str] | None, typer.Argument(help="Runs to analyze (default: every run).")] = None,
    only: OnlyOption = None,
    steps: StepsOption = None,
    as_json: JsonOption = False,
    as_csv: CsvOption = False,
    wide: WideOption = False,
    db: DbOption = None,
    wait: WaitOption = 0,
    by: Annotated[str | None, typer.Option(
        "--by", help="Aggregate across runs per task or per model (the fleet table) instead of per run.")] = None,
    split: SplitOption = "training",
) -> None:
    """Run the characterization analyses (lengths, drift, longtail, stages, imbalance, tools, filtering, fit)."""
    if as_json and as_csv:
        raise PolytraceError("choose one of --json and --csv")
    notes: list[str] = []
    if by is not None:
        if only:
            raise PolytraceError("--only picks per-run analyses; --by prints the fleet table alone")
        if split != "training":
            raise PolytraceError("--by aggregates the training samples; --split validation takes per-run analyses")
        results = {"fleet": _fleet(db, runs, by, steps, wait)}
    else:
        results, notes = _summaries(db, runs, only, steps, split, wait)
    meanings = _stage_meanings(db, runs, wait) if "stages" in results and not (as_json or as_csv) else None
    # What the validation split leaves out: on stderr beside JSON or CSV, above the tables otherwise.
    for note in notes:
        (err_console if as_json or as_csv else console).print(note, style="dim", highlight=False, markup=False)
    if as_json or as_csv:
        from polytrace_cli.analyze.results import results_csv, results_json

        if split != "training":  # rows that do not say which samples they answer on would read as training ones
            import polars as pl

            results = {name: df.with_columns(split=pl.lit(split)) for name, df in results.items()}
        sys.stdout.write(results_json(results) + "\n" if as_json else results_csv(results))
        return
    from polytrace_cli.analyze.registry import named_analyses
    from polytrace_cli.analyze.results import HEADLINE_COLUMNS, KEY_COLUMNS

    # Only the analyses that ran: naming every one would import them all (and scipy).
    analyses = named_analyses(list(results)) if by is None else {}
    for name, df in results.items():
        if not df.height:
            console.print(f"{name}: no rows: the selected runs and steps hold no data it can use", style="dim",
                          highlight=False, markup=False)
            continue
        description = analyses[name].description if name in analyses else f"runs grouped by {by}"
        if split != "training":
            description = f"{description} (on the {split} samples)"
        identity = [column for column in ("run", by, *KEY_COLUMNS) if column and column in df.columns]
        headline = HEADLINE_COLUMNS.get(name)
        without_numbers = None
        if not wide:
            df, without_numbers = _split_rows_without_numbers(df, headline or df.columns, identity)
        if df.height:
            emit_frame(df, title=f"{name}: {description}", identity=identity,
                       order=None if wide else headline, wide=wide)
        else:
            console.print(f"{name}: {description}", style="italic", highlight=False, markup=False)
        if without_numbers:
            console.print(without_numbers, style="dim", highlight=False, markup=False)
        if name == "stages" and meanings is not None:
            print_stage_meanings(meanings, wide=wide)


def _split_rows_without_numbers(df: pl.DataFrame, columns: Sequence[str],
                                identity: Sequence[str]) -> tuple[pl.DataFrame, str | None]:
    """The rows that hold at least one value in `columns` (apart from `identity` and basis), and a line
    naming the runs whose rows hold none, with their basis (e.g. stages of runs that log no stage
    times): a narrow table shows such rows as dashes alone, without the basis that says why. The line
    is None when every row holds a value."""
    import polars as pl

    values = [c for c in columns if c in df.columns and c not in identity and c != "basis"]
    if not values or "run" not in df.columns:
        return df, None
    has_value = pl.any_horizontal(pl.col(c).is_not_null() for c in values)
    empty = df.filter(~has_value)
    if not empty.height:
        return df, None
    bases = empty.select("run", *(["basis"] if "basis" in df.columns else [])).unique(maintain_order=True)
    said = ", ".join(f"{row['run']} ({row['basis']})" if row.get("basis") else row["run"]
                     for row in bases.iter_rows(named=True))
    return df.filter(has_value), f"no values for: {said}"


@user_errors
def compare(
    run_a: Annotated[str, typer.Argument(help="The baseline run.")],
    run_b: Annotated[str, typer.Argument(help="The run compared with it.")],
    only: OnlyOption = None,
    steps: StepsOption = None,
    as_json: JsonOption = False,
    as_csv: CsvOption = False,
    wide: WideOption = False,
    db: DbOption = None,
    wait: WaitOption = 0,
) -> None:
    """The analyses' summary numbers of two runs side by side, with absolute and relative deltas (B − A)."""
    if as_json and as_csv:
        raise PolytraceError("choose one of --json and --csv")
    if run_a == run_b:
        raise PolytraceError("compare needs two different runs")
    from polytrace_cli.facade import Store

    with Store.open(db, read_only=True, wait=wait) as store:
        frame = store.compare(run_a, run_b, only, steps)
        guard = store.comparability(run_a, run_b, steps)
        meanings = store.stage_meanings([run_a, run_b])
    if not guard.comparable:
        # Said on stderr, so that --json and --csv stay the numbers alone.
        err_console.print(f"note: {guard.summary()}", highlight=False, markup=False)
    if as_json or as_csv or wide:
        emit_frame(frame, as_json=as_json, as_csv=as_csv, wide=wide, identity=["analysis", "metric", "key"],
                   title=f"{run_b} vs {run_a} (delta = {run_b} − {run_a})", shared_decimals="row")
        if not (as_json or as_csv):
            print_stage_meanings(meanings, wide=wide)
        return
    _print_compare(frame, run_a, run_b)
    print_stage_meanings(meanings)


def print_stage_meanings(meanings: pl.DataFrame, wide: bool = False) -> None:
    """The stages whose meaning differs between the runs' frameworks (one has no such timer, or times
    something else under it), each with what it holds in each run; nothing when they all agree."""
    import polars as pl

    runs = [column for column in meanings.columns if column != "stage"]
    if len(runs) < 2 or not meanings.height:
        return
    differ = meanings.filter(pl.concat_list(runs).list.n_unique() > 1)
    if differ.height:
        emit_frame(differ, title="what a stage holds in each run's framework (where they differ)",
                   identity=["stage"], wide=wide)


def _print_compare(frame, run_a: str, run_b: str) -> None:
    """One narrow table per analysis: metric (with its kind/stage/tool), A, B, delta and the relative
    delta as a percentage."""
    import polars as pl

    from polytrace_cli.commands.tables import percent

    if not frame.height:
        console.print("no numbers to compare: the selected analyses found no data for these runs", highlight=False)
        return
    console.print(f"{run_b} vs {run_a} (delta = {run_b} − {run_a}; relative = delta / |{run_a}|)", highlight=False)
    for (analysis,), part in frame.group_by("analysis", maintain_order=True):
        shown = part.select(
            pl.when(pl.col("key").is_null()).then(pl.col("metric"))
            .otherwise(pl.concat_str(pl.col("metric"), pl.lit(" ["), pl.col("key"), pl.lit("]"))).alias("metric"),
            pl.col(run_a), pl.col(run_b), pl.col("delta"),
            pl.col("relative_delta").map_elements(percent, return_dtype=pl.String).alias("relative"),
        )
        emit_frame(shown, title=analysis, identity=["metric", run_a, run_b, "delta", "relative"], right=["relative"],
                   shared_decimals="row")
