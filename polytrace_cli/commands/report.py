"""`polytrace report` and `polytrace check`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from polytrace_cli.commands.common import (CsvOption, DbOption, JsonOption, StepsOption, WaitOption, console, emit_rows,
                                          fail, json_default, user_errors)
from polytrace_cli.commands.tables import cell
from polytrace_cli.errors import PolytraceError


@user_errors
def report(
    runs: Annotated[list[str] | None, typer.Argument(help="Runs to report on (all runs when none are given).")] = None,
    out: Annotated[Path, typer.Option(help="Folder the report folder is written into.")] = Path("reports"),
    name: Annotated[str | None, typer.Option(help="Report folder name (default: from the run names).")] = None,
    steps: StepsOption = None,
    svg: Annotated[bool, typer.Option("--svg", help="Also save every figure as SVG beside its PNG.")] = False,
    db: DbOption = None,
    wait: WaitOption = 0,
) -> None:
    """Draw the figures and write index.html, summary.md and summary.json under OUT/NAME/."""
    from polytrace_cli.facade import Store  # matplotlib loads only when a report is drawn

    typer.echo(str(Store.write_report(db, runs, out, name, steps, svg, wait)))


def _limit_option(help_text: str):
    return typer.Option(help=help_text, show_default=False)


def _print_baseline(headline: dict, run: str, baseline: str | None, steps: str | None,
                    baseline_steps: str | None, baseline_db: str | None) -> None:
    """The verdict at the same workload, the workload apart, and the raw mean steps with the top cause."""
    judged = headline["verdict"]
    colour = {"regression": "bold red", "improvement": "green", "no change": "green"}.get(judged["verdict"], "yellow")
    console.print(f"[{colour}]{escape(judged['headline'])}[/]", highlight=False)
    for line in judged["workload"]:
        console.print(f"  {escape(line['text'])}", highlight=False)
    if headline["a_step_s"] is None:
        return
    top = headline["top_cause"]
    named = (f"; top cause {top['cause']}{' (' + top['stage'] + ')' if top['stage'] else ''} "
             f"{top['seconds']:+,.1f} s per step" if top else "")
    against = f" --against {escape(baseline)}" if baseline else ""
    windows = (f"{' --steps ' + escape(steps) if steps else ''}"
               f"{' --against-steps ' + escape(baseline_steps) if baseline_steps else ''}")
    hint = "" if baseline_db else f"; polytrace explain {escape(run)}{against}{windows} tells the rest"
    console.print(f"mean step {headline['b_step_s']:,.1f} s against {headline['a_step_s']:,.1f} s for "
                  f"{escape(headline['baseline'])} ({headline['slowdown']:+.1%}){escape(named)}{hint}",
                  highlight=False)


@user_errors
def check(
    run: Annotated[str, typer.Argument(help="The run to check.")],
    max_imbalance: Annotated[float | None, _limit_option("Fail when mean DP load imbalance λ exceeds this.")] = None,
    max_step_cv: Annotated[float | None, _limit_option("Fail when the step-time CV exceeds this.")] = None,
    max_clip_ratio: Annotated[float | None, _limit_option("Fail when the response clip ratio exceeds this.")] = None,
    max_p99_p50: Annotated[float | None, _limit_option("Fail when response p99/p50 exceeds this.")] = None,
    max_tool_p99_s: Annotated[float | None, _limit_option("Fail when a tool's latency p99 (s) exceeds this.")] = None,
    min_kept_share: Annotated[float | None, _limit_option("Fail when the DAPO kept share falls below this.")] = None,
    max_untimed_share: Annotated[float | None, _limit_option(
        "Fail when this share of the time between steps is counted by no timer.")] = None,
    max_inconsistent_steps: Annotated[float | None, _limit_option(
        "Fail when more steps than this have stages beyond their total or an MFU above 1.")] = None,
    max_tail_share: Annotated[float | None, _limit_option(
        "Fail when the rollout's tail at low engine concurrency exceeds this share.")] = None,
    baseline: Annotated[str | None, typer.Option(
        "--baseline", help="The run RUN is compared with for --max-slowdown and --max-step-slowdown.")] = None,
    baseline_steps: Annotated[str | None, typer.Option(
        "--baseline-steps", metavar="A:B",
        help="The baseline's step range (alone: a window of RUN itself is the baseline).")] = None,
    baseline_db: Annotated[str | None, typer.Option(
        "--baseline-db", metavar="STORE",
        help="Read the baseline from this store file or lake folder (default: RUN's store).")] = None,
    max_slowdown: Annotated[str | None, typer.Option(
        "--max-slowdown", metavar="SHARE",
        help="Fail on a regression at the same workload of more than this, e.g. 5% or 0.05.")] = None,
    max_step_slowdown: Annotated[str | None, typer.Option(
        "--max-step-slowdown", metavar="SHARE",
        help="Fail when RUN's mean step, workload included, is more than this slower than the baseline's.")] = None,
    allow_unmeasurable: Annotated[bool, typer.Option(
        "--allow-unmeasurable",
        help="Pass a threshold the run's data cannot measure instead of failing on it.")] = False,
    steps: StepsOption = None,
    as_json: JsonOption = False,
    as_csv: CsvOption = False,
    db: DbOption = None,
    wait: WaitOption = 0,
) -> None:
    """Gate CI: print each threshold against the run's measured value; exit 1 when one is exceeded,
    cannot be measured, or the step range holds no data."""
    from polytrace_cli.analyze.common import StepRange
    from polytrace_cli.check import FAIL, NOT_MEASURABLE, PASS, failed, parse_share, validate_limits
    from polytrace_cli.facade import Store

    limits = {name: value for name, value in {
        "max_imbalance": max_imbalance, "max_step_cv": max_step_cv, "max_clip_ratio": max_clip_ratio,
        "max_p99_p50": max_p99_p50, "max_tool_p99_s": max_tool_p99_s, "min_kept_share": min_kept_share,
        "max_untimed_share": max_untimed_share, "max_inconsistent_steps": max_inconsistent_steps,
        "max_tail_share": max_tail_share,
    }.items() if value is not None}
    compared = baseline is not None or baseline_steps is not None or baseline_db is not None
    gated = max_slowdown is not None or max_step_slowdown is not None
    if compared != gated:
        raise fail("a baseline and --max-slowdown (or --max-step-slowdown) go together: "
                   "polytrace check B --baseline A --max-slowdown 5%")
    if not limits and not compared:
        raise fail("give at least one threshold, e.g. --max-imbalance 1.2 (see polytrace check --help)")
    try:
        validate_limits(limits)
        slowdown_limit = parse_share(max_slowdown) if max_slowdown is not None else None
        step_limit = parse_share(max_step_slowdown, "--max-step-slowdown") if max_step_slowdown is not None else None
    except ValueError as error:
        raise fail(str(error)) from None
    baseline_range = StepRange.parse(baseline_steps) if baseline_steps is not None else None
    if as_json and as_csv:
        raise PolytraceError("choose one of --json and --csv")
    step_range = StepRange.parse(steps)
    with Store.open(db, read_only=True, wait=wait) as store:
        if not store.has_step_data(run, step_range):
            where = f" in steps {steps}" if steps else ""
            raise fail(f"check failed: run {run} has no data{where}; nothing can be measured"
                       f"{store.crash_clause(run)}", 1)
        verdicts = store.check(run, limits, step_range) if limits else []
        headline = None
        if compared:
            gates, headline = store.check_baseline(run, baseline, slowdown_limit, step_limit, step_range,
                                                   baseline_range, baseline_db)
            verdicts.extend(gates)
    bad = failed(verdicts, allow_unmeasurable)
    if as_json:
        document = {"run": run, "passed": not bad, "checks": [v.as_dict() for v in verdicts]}
        if compared:
            document["baseline"] = headline
        sys.stdout.write(json.dumps(document, default=json_default, indent=2) + "\n")
    elif as_csv:
        records = [v.as_dict() for v in verdicts]
        columns = list(records[0]) if records else ["threshold"]
        emit_rows(columns, [tuple(r.get(c) for c in columns) for r in records], as_csv=True)
    else:
        table = Table(title=f"check {escape(run)}", title_justify="left", header_style="bold")
        for column in ("threshold", "limit", "measured", "result", "metric"):
            table.add_column(column, justify="right" if column in ("limit", "measured") else "left")
        colours = {PASS: "green", FAIL: "bold red", NOT_MEASURABLE: "yellow"}
        for v in verdicts:
            metric = v.metric if v.reason is None else f"{v.metric}: {v.reason}"
            table.add_row("--" + v.threshold.replace("_", "-"), cell(v.limit), cell(v.measured),
                          f"[{colours[v.status]}]{v.status}[/]", escape(metric))
        console.print(table)
        if headline is not None:
            _print_baseline(headline, run, baseline, steps, baseline_steps, baseline_db)
        unmeasured = [v for v in verdicts if v.status == NOT_MEASURABLE]
        if unmeasured and not allow_unmeasurable:
            names = ", ".join("--" + v.threshold.replace("_", "-") for v in unmeasured)
            console.print(f"[bold red]not measurable:[/] {escape(names)} (--allow-unmeasurable passes them)")
        console.print("[bold red]check failed[/]" if bad else "[green]check passed[/]")
    if bad:
        raise typer.Exit(1)
