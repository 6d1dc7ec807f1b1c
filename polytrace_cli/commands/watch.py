"""`polytrace watch`: follow a log as the job writes it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from polytrace_cli.commands.common import DbOption, WaitOption, console, err_console, fail, user_errors

# Seconds an --on-alert command may take before it is stopped.
ALERT_COMMAND_TIMEOUT = 60


@user_errors
def watch(
    path: Annotated[Path, typer.Argument(help="The log file, or the run folder, the job is writing.")],
    db: DbOption = None,
    run: Annotated[str | None, typer.Option(help="Name the run instead of deriving it from the folder.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON event per line for scripts.")] = False,
    idle_exit: Annotated[float | None, typer.Option(
        "--idle-exit", metavar="SECONDS", min=0, help="Exit 0 after this many seconds without growth.")] = None,
    on_alert: Annotated[str | None, typer.Option(
        "--on-alert", metavar="CMD", help="Run this shell command per alert, with the alert's JSON on stdin.")] = None,
    poll: Annotated[float, typer.Option(
        "--poll", metavar="SECONDS", min=0.05, help="Seconds between looks at the file.")] = 1.0,
    stall_factor: Annotated[float, typer.Option(
        "--stall-factor", metavar="K", min=1.0,
        help="Alert a stall after K times the usual time between steps without a new one.")] = 3.0,
    baseline: Annotated[str | None, typer.Option(
        "--baseline", metavar="RUN",
        help="Alert when a stage's efficiency leaves this run's band (its seconds at the step's workload).")] = None,
    baseline_db: Annotated[str | None, typer.Option(
        "--baseline-db", metavar="STORE", help="Read --baseline from this store file or lake folder.")] = None,
    wait: WaitOption = 0,
) -> None:
    """Follow a log as the job writes it: ingest each step, compare it with the run's model, alert.

    Each new step is stored and judged against the step-time model fitted on the steps before it;
    slow steps, a crash in the log and a stall are alerts. A crash exits 3 with its reason once the
    log stays still after it; --idle-exit exits 0."""
    from polytrace_cli.facade import Store
    from polytrace_cli.watch import EXIT_CRASH, WatchSettings
    from polytrace_cli.watch.follow import event_json

    if not path.exists():
        raise fail(f"{path}: no such file or directory")
    if baseline_db is not None and baseline is None:
        raise fail("--baseline-db names where --baseline is read: give --baseline RUN too")
    settings = WatchSettings(poll=poll, idle_exit=idle_exit, stall_factor=stall_factor, run=run)
    store = Store.open(db, wait=wait)
    view = None
    live = None

    def on_event(event: dict) -> None:
        if as_json:
            sys.stdout.write(event_json(event) + "\n")
            sys.stdout.flush()
        else:
            view.add(event)
            live.refresh()
        if on_alert and event["event"] == "alert":
            _run_alert_command(on_alert, event_json(event))

    try:
        if as_json:
            result = store.watch(path, on_event, settings, baseline=baseline, baseline_db=baseline_db)
        else:
            from rich.live import Live

            from polytrace_cli.watch.view import WatchView

            view = WatchView(str(path))

            def on_run(name: str) -> None:
                view.run, view.total_steps = name, store.configured_steps(name)

            with Live(view, console=console, auto_refresh=False, transient=False) as live:
                result = store.watch(path, on_event, settings, on_run=on_run, baseline=baseline,
                                     baseline_db=baseline_db)
    finally:
        store.close()
    if result.exit_code == EXIT_CRASH:
        raise fail(f"the job crashed: {result.reason}", EXIT_CRASH)


def _run_alert_command(command: str, alert_json: str) -> None:
    """Run `command` in a shell with the alert on stdin; a failure is said on stderr, watching goes on."""
    try:
        done = subprocess.run(command, shell=True, input=alert_json + "\n", text=True, timeout=ALERT_COMMAND_TIMEOUT,
                              stdout=sys.stderr, stderr=sys.stderr)
    except subprocess.TimeoutExpired:
        err_console.print(f"note: --on-alert command stopped after {ALERT_COMMAND_TIMEOUT} s", highlight=False,
                          markup=False)
        return
    if done.returncode:
        err_console.print(f"note: --on-alert command exited {done.returncode}", highlight=False, markup=False)
