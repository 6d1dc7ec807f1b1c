"""`polytrace explain`: where a run's typical step goes, the levers that would save it the most, why its
steps were slow, and where its wall time went, ranked; with
--against or --against-steps, why its mean step differs from another run's or window's."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from polytrace_cli.commands.common import (
    CsvOption, DbOption, JsonOption, StepsOption, WaitOption, console, emit_rows, user_errors,
)
from polytrace_cli.commands.tables import print_item
from polytrace_cli.display import duration
from polytrace_cli.errors import PolytraceError

# People get tables that fit 100 columns; the JSON has every number.
TABLE_WIDTH = 100
DEFAULT_TABLE_STEPS = 10
# --csv: one row per step and cause (a step without causes has one row, its cause empty); the causes'
# details (ranks, samples) are in --json.
CSV_COLUMNS = ("step", "segment", "seconds", "expected_s", "excess_s", "slow", "cause", "cause_seconds",
               "cause_tokens", "stage", "stands_out")


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:,.1f}"


def _causes_cell(step: dict, limit: int = 3) -> str:
    """The causes that stand out or add at least 5% of the step's excess (in tokens: every cause
    above 0), in the JSON's order."""
    causes, excess = step["causes"], step["excess_s"]
    major = [c for c in causes if c.get("stands_out")
             or (c["seconds"] > 0.05 * excess if excess else c.get("tokens", 0) > 0)]
    shown = []
    for cause in (major or causes)[:limit]:
        if cause.get("seconds") is not None:
            shown.append(f"{cause['cause']} {cause['seconds']:+,.1f}s ({cause['stage']})")
        else:
            shown.append(f"{cause['cause']} {cause['tokens']:+,.0f} tok")
    held = step.get("held_by")
    if held and held.get("worker"):
        lead = f", {held['lead']:.2f}× its peers" if held.get("lead") else ""
        shown.append(f"held by {held['worker']} in {held['stage']}{lead}")
    elif held and held.get("critical_stage"):
        shown.append(f"critical stage {held['critical_stage']}")
    return ", ".join(shown)


# Findings smaller than this share of the run are left to the table and --json.
SMALL_FINDING = 0.005


def _lever_line(lever: dict) -> str:
    spread = f" ± {duration(lever['saving_se_s'])}" if lever["saving_se_s"] else ""
    why = f" ({lever['why']})" if lever["why"] else ""
    return (f"{lever['policy']}: {duration(lever['saving_s'])}{spread}, {lever['saving_share']:.1%} of the run"
            f"{why}")


def _print(explanation, shown_steps: int | None, one_step: bool, levers: list[dict] | None = None) -> None:
    """Where a typical step goes, the top levers with their what-if savings, where the time went, the slow
    steps, then the notes the numbers rest on."""
    out = Console(width=TABLE_WIDTH) if not sys.stdout.isatty() else console
    doc = explanation.to_dict()
    unit = "seconds" if doc["basis"] == "seconds" else "tokens (no step timings)"
    what = "slow" if doc["basis"] == "seconds" else "unusual"
    out.print(f"[bold]{doc['run']}[/]: {doc['slow_steps']} {what} step(s), in {unit}", highlight=False)
    if doc.get("typical_step"):
        print_item(out, doc["typical_step"]["text"], first="  ", rest="    ")
    # Without seconds, the notes say why: they come first, as the caveats do.
    first_notes = doc["notes"] if doc["basis"] != "seconds" else explanation.caveats
    for note in first_notes:
        print_item(out, note, first="  ! " if note in explanation.caveats else "  ", rest="    ")
    if levers is not None:
        if levers:
            out.print("Top levers (polytrace whatif, saving ± its standard error):", highlight=False)
            for lever in levers:
                print_item(out, _lever_line(lever), first="  - ", rest="    ")
        else:
            out.print("No policy the model prices would save 0.5% of the run or more (polytrace whatif RUN "
                      "--policy P prices others).", highlight=False)
    if doc["findings"] and doc["basis"] == "seconds":
        table = Table(title="Where the time went, ranked", title_justify="left", header_style="bold")
        for name, justify in (("cause", "left"), ("seconds", "right"), ("share", "right"), ("steps", "right")):
            table.add_column(name, justify=justify)
        for finding in doc["findings"]:
            share = "—" if finding["share"] is None else (
                f"{finding['share']:.1%}" if finding["share"] >= 0.0005 else "<0.1%")
            name = f"{finding['cause']} (usual)" if finding.get("typical") else finding["cause"]
            table.add_row(name, _seconds(finding["seconds"]), share, f"{len(finding['steps']):,}")
        out.print(table)
    for finding in doc["findings"]:
        if finding["share"] is None or finding["share"] >= SMALL_FINDING:
            print_item(out, finding["text"])
    if doc.get("bounds"):
        _print_bounds(out, doc["bounds"])
    steps = doc["steps"] if shown_steps is None else doc["steps"][:shown_steps]
    if steps and doc["basis"] == "tokens":
        _print_token_steps(out, steps)
    elif steps:
        table = Table(title="Step" if one_step else "Slow steps, slowest first",
                      title_justify="left", header_style="bold")
        for name, justify in (("step", "right"), ("seconds", "right"), ("expected", "right"), ("excess", "right"),
                              ("causes: standing out, then largest", "left")):
            table.add_column(name, justify=justify, overflow="fold")
        for step in steps:
            table.add_row(f"{step['step']:,}", _seconds(step["seconds"]), _seconds(step["expected_s"]),
                          _seconds(step["excess_s"]), _causes_cell(step))
        out.print(table)
    hidden = len(doc["steps"]) - len(steps)
    if hidden > 0:
        out.print(f"{hidden} more slow steps: --top K or --json for all", highlight=False)
    if doc["slow_rule"]:
        out.print(f"[dim]slow: {doc['slow_rule']}[/]", highlight=False)
    for note in doc["notes"]:
        if note not in first_notes:
            print_item(out, f"note: {note}", first="", rest="  ")


def _print_bounds(out: Console, bounds: dict) -> None:
    from polytrace_cli.diagnose.bounds import bound_sentence

    sync = bounds["mode"] == "sync"
    columns = (("steps", "right"), ("bound", "left"), ("s/step", "right"), ("step", "right"),
               *((("gen", "right"), ("train", "right")) if sync else (("wait", "right"), ("idle", "right"))),
               ("sync", "right"), *(() if sync else (("wait %", "right"), ("idle %", "right"))))
    table = Table(title=f"What bounds the run ({bounds['mode']}), per window of steps", title_justify="left",
                  header_style="bold")
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=name == "bound")

    def number(value, percent=False):
        return "—" if value is None else (f"{value:.0%}" if percent else _seconds(value))

    for window in bounds["windows"]:
        first = (window["gen_s"], window["train_s"]) if sync else (window["wait_s"], window["rollout_idle_s"])
        ratios = () if sync else (number(window["trainer_idle_ratio"], True), number(window["rollout_idle_ratio"], True))
        table.add_row(f"{window['first_step']:,}–{window['last_step']:,}", window["bound"],
                      _seconds(window["seconds_per_step"]), number(window["step_s"]), *map(number, first),
                      number(window["overhead_s"]), *ratios)
    out.print(table)
    if not sync:
        print_item(out, "wait: the trainer's wait for a batch; idle: the rollout side idle; sync: weight sync and "
                        "switches (s per step); wait % and idle %: the idle ratios, recomputed from the timers")
    print_item(out, bound_sentence(bounds))
    if bounds["run"].get("rule"):
        print_item(out, bounds["run"]["rule"])
    for note in bounds["notes"]:
        print_item(out, note)


def _cause_rows(steps: list[dict]) -> list[tuple]:
    """The --csv rows (CSV_COLUMNS) of the explanation's steps."""
    rows = []
    for step in steps:
        head = (step["step"], step.get("segment"), step.get("seconds"), step.get("expected_s"), step.get("excess_s"),
                step.get("slow"))
        for cause in step.get("causes") or [{}]:
            rows.append((*head, cause.get("cause"), cause.get("seconds"), cause.get("tokens"), cause.get("stage"),
                         cause.get("stands_out")))
    return rows


def _print_token_steps(out: Console, steps: list[dict]) -> None:
    table = Table(title="Steps (tokens)", title_justify="left", header_style="bold")
    for name in ("step", "longest response", "busiest rank", "mean rank", "busiest/mean", "unusual"):
        table.add_column(name, justify="right")
    for step in steps:
        busiest, mean = step["busiest_rank_tokens"], step["mean_rank_tokens"]
        ratio = f"{busiest / mean:.2f}" if busiest and mean else "—"
        table.add_row(f"{step['step']:,}", f"{step['r_max']:,.0f}", f"{busiest:,.0f}" if busiest else "—",
                      f"{mean:,.0f}" if mean else "—", ratio, "yes" if step["slow"] else "")
    out.print(table)


def _print_comparison(comparison) -> None:
    from rich.markup import escape

    # No emoji codes: a window label such as "steps 1:100" must print as written.
    out = Console(width=TABLE_WIDTH if not sys.stdout.isatty() else None, emoji=False)
    doc = comparison.to_dict()
    out.print(f"[bold]{escape(doc['b'])}[/] against [bold]{escape(doc['a'])}[/]: mean step {_seconds(doc['b_step_s'])} s against "
              f"{_seconds(doc['a_step_s'])} s, {doc['delta_s']:+,.1f} s per step", highlight=False)
    table = Table(title="Causes, largest first (s per step, B − A)", title_justify="left",
                  header_style="bold")
    for name, justify in (("cause", "left"), ("stage", "left"), ("seconds", "right"), ("share", "right")):
        table.add_column(name, justify=justify)
    shown = [c for c in doc["causes"] if abs(c["seconds"]) >= 0.005 * abs(doc["a_step_s"] or 0)] or doc["causes"][:1]
    for cause in shown:
        share = "—" if cause["share"] is None else f"{cause['share']:.0%}"
        table.add_row(cause["cause"], cause["stage"] or "", f"{cause['seconds']:+,.2f}", share)
    hidden = len(doc["causes"]) - len(shown)
    table.add_row("sum" if not hidden else f"sum (with {hidden} smaller)", "", f"{doc['delta_s']:+,.2f}",
                  "—" if all(c["share"] is None for c in doc["causes"]) else "100%", style="dim")
    out.print(table)
    for finding in doc["findings"]:
        print_item(out, finding)
    scaling = doc["scaling"]
    if scaling:
        table = Table(title=f"Scaling per stage, {scaling['fewer_gpus']} → {scaling['more_gpus']} GPUs (ideal speedup "
                            f"{scaling['ideal_speedup']:.2f}×)", title_justify="left", header_style="bold")
        for name, justify in (("stage", "left"), (f"s at {scaling['fewer_gpus']}", "right"),
                              (f"s at {scaling['more_gpus']}", "right"), ("speedup", "right"),
                              ("efficiency", "right"), ("", "left")):
            table.add_column(name, justify=justify)
        for row in scaling["stages"]:
            speedup = "—" if row["speedup"] is None else f"{row['speedup']:.2f}×"
            efficiency = "—" if row["efficiency"] is None else f"{row['efficiency']:.0%}"
            table.add_row(row["stage"], f"{row['fewer_gpus_s']:,.1f}", f"{row['more_gpus_s']:,.1f}", speedup,
                          efficiency, "stopped scaling" if row["stopped"] else "")
        out.print(table)
    for note in doc["notes"]:
        out.print(f"[dim]{note}[/]", highlight=False)


@user_errors
def explain(
    run: Annotated[str, typer.Argument(help="The run to explain.")],
    step: Annotated[int | None, typer.Option("--step", help="Explain this step, slow or not.")] = None,
    top: Annotated[int | None, typer.Option("--top", help="Keep the K largest findings and K slowest steps.")] = None,
    against: Annotated[str | None, typer.Option(
        "--against", help="Explain why RUN's mean step differs from this run's (the baseline).")] = None,
    steps: StepsOption = None,
    against_steps: Annotated[str | None, typer.Option(
        "--against-steps", metavar="A:B", help="The baseline's step range (alone: a window of RUN itself).")] = None,
    as_json: JsonOption = False,
    as_csv: CsvOption = False,
    db: DbOption = None,
    wait: WaitOption = 0,
) -> None:
    """Why steps were slow: each step's excess over the run's model split into causes, and the run's
    findings ranked by seconds."""
    if as_json and as_csv:
        raise PolytraceError("choose one of --json and --csv")
    if against is not None or against_steps is not None:
        if step is not None or top is not None:
            raise PolytraceError("--step and --top explain one run's slow steps; drop them with --against")
        _explain_against(run, against, steps, against_steps, as_json, as_csv, db, wait)
        return
    if steps is not None:
        raise PolytraceError("--steps selects the window compared with --against or --against-steps; "
                             "to explain one step give --step N")
    from polytrace_cli.facade import Store

    with Store.open(db, read_only=True, wait=wait) as store:
        explanation = store.explain(run, step=step, top=top)
        # The levers cost a what-if of the run: only for a person reading the whole run's story.
        levers = (store.levers(run) if not (as_json or as_csv) and step is None
                  and explanation.basis == "seconds" else None)
    if as_json:
        sys.stdout.write(explanation.to_json() + "\n")
    elif as_csv:
        emit_rows(list(CSV_COLUMNS), _cause_rows(explanation.to_dict()["steps"]), as_csv=True)
    else:
        _print(explanation, None if (top or step is not None) else DEFAULT_TABLE_STEPS, one_step=step is not None,
               levers=levers)


def _explain_against(run: str, against: str | None, steps: str | None, against_steps: str | None, as_json: bool,
                     as_csv: bool, db, wait: float) -> None:
    from polytrace_cli.diagnose.against import CAUSE_COLUMNS
    from polytrace_cli.facade import Store

    with Store.open(db, read_only=True, wait=wait) as store:
        comparison = store.explain_against(run, against, steps, against_steps)
        meanings = store.stage_meanings([against, run]) if against not in (None, run) else None
    if as_json:
        sys.stdout.write(comparison.to_json() + "\n")
    elif as_csv:
        causes = comparison.to_dict()["causes"]
        emit_rows(list(CAUSE_COLUMNS), [tuple(c.get(k) for k in CAUSE_COLUMNS) for c in causes], as_csv=True)
    else:
        _print_comparison(comparison)
        if meanings is not None:
            from polytrace_cli.commands.analyze import print_stage_meanings

            print_stage_meanings(meanings)
