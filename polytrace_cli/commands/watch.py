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
    metrics_port: Annotated[int | None, typer.Option(
        "--metrics-port", metavar="PORT", min=0, max=65535,
        help="Serve the run's step time, expected time, stages, ETA and alerts as Prometheus metrics.")] = None,
    metrics_host: Annotated[str, typer.Option(
        "--metrics-host", metavar="ADDRESS", help="Address --metrics-port listens on.")] = "127.0.0.1",
    webhook: Annotated[str | None, typer.Option(
        "--webhook", metavar="URL", help="POST each alert as JSON (with a Slack-ready `text`) to this URL.")] = None,
    wait: WaitOption = 0,
) -> None:
    """Follow a log as the job writes it: ingest each step, compare it with the run's model, alert.

    Each new step is stored and judged against the step-time model fitted on the steps before it;
    slow steps, a crash in the log and a stall are alerts. A crash exits 3 with its reason once the
    log stays still after it; --idle-exit exits 0. --metrics-port serves the run's numbers to
    Prometheus; --webhook posts each alert, never holding the watch up."""
    from polytrace_cli.facade import Store
    from polytrace_cli.telemetry.webhook import Webhook
    from polytrace_cli.watch import EXIT_CRASH, WatchSettings
    from polytrace_cli.watch.follow import event_json

    if not path.exists():
        raise fail(f"{path}: no such file or directory")
    if baseline_db is not None and baseline is None:
        raise fail("--baseline-db names where --baseline is read: give --baseline RUN too")
    settings = WatchSettings(poll=poll, idle_exit=idle_exit, stall_factor=stall_factor, run=run)
    hook = None
    if webhook:
        try:
            hook = Webhook(webhook)
        except ValueError as error:
            raise fail(str(error), 2) from None
    exporter = _exporter(metrics_port, metrics_host) if metrics_port is not None else None
    store = Store.open(db, wait=wait)
    view = None
    live = None

    def on_run(name: str) -> None:
        total = store.configured_steps(name)
        if view is not None:
            view.run, view.total_steps = name, total
        if exporter is not None:
            exporter.set_run(name, total)
        if hook is not None:
            hook.run = name

    def on_event(event: dict) -> None:
        if exporter is not None:
            exporter.observe(event)
        if hook is not None and event["event"] == "alert":
            hook.post(event)
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
            result = store.watch(path, on_event, settings, on_run=on_run, baseline=baseline, baseline_db=baseline_db)
        else:
            from rich.live import Live

            from polytrace_cli.watch.view import WatchView

            view = WatchView(str(path))
            with Live(view, console=console, auto_refresh=False, transient=False) as live:
                result = store.watch(path, on_event, settings, on_run=on_run, baseline=baseline,
                                     baseline_db=baseline_db)
    finally:
        store.close()
        if exporter is not None:
            exporter.close()
        if hook is not None:
            hook.close()
            if hook.failures or hook.dropped:
                err_console.print(f"note: --webhook: {hook.sent} alert(s) posted, {hook.failures} failed, "
                                  f"{hook.dropped} dropped", highlight=False, markup=False)
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


def _exporter(port: int, host: str):
    """The Prometheus endpoint of the watch, or a one-line error (a missing extra, a port in use)."""
    from polytrace_cli.telemetry.exporter import WatchMetrics

    try:
        exporter = WatchMetrics(port, host)
    except RuntimeError as error:
        raise fail(str(error), 2) from None
    except OSError as error:
        raise fail(f"--metrics-port {port}: cannot listen on {host}: {error.strerror or error}", 2) from None
    err_console.print(f"serving Prometheus metrics on http://{host}:{exporter.port}/metrics", highlight=False,
                      markup=False)
    return exporter


def _seconds(text: str, option: str) -> float:
    """'2s', '500ms', '10m', '1h' or a bare number of seconds."""
    import re

    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", text)
    if not match:
        raise fail(f"{option} {text!r}: give a duration such as 2s, 10m or 1h", 2)
    scale = {"ms": 0.001, "s": 1.0, None: 1.0, "m": 60.0, "h": 3600.0}[match.group(2)]
    return float(match.group(1)) * scale


@user_errors
def scrape(
    urls: Annotated[list[str], typer.Argument(help="Engine /metrics addresses (vLLM, SGLang), e.g. http://node1:8000/metrics.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Scrape file to append to (ingest reads it).")],
    every: Annotated[str, typer.Option("--every", metavar="DURATION", help="Time between rounds: 2s, 500ms, 1m.")] = "2s",
    duration: Annotated[str, typer.Option("--for", metavar="DURATION", help="Stop after this long: 30m, 2h.")] = "1h",
    rounds: Annotated[int | None, typer.Option("--rounds", min=1, help="Stop after this many rounds.")] = None,
    timeout: Annotated[float, typer.Option("--timeout", metavar="SECONDS", min=0.1, help="Seconds to wait for a page.")] = 5.0,
) -> None:
    """Record rollout engines' Prometheus metrics beside a run, for `ingest` to join to its steps.

    Each round fetches every address once and appends the pages, each sample stamped with its fetch
    time; a failed fetch is noted in the file and recording goes on. Stops by itself after --for (or
    --rounds)."""
    from polytrace_cli.telemetry.scrape import record

    step = _seconds(every, "--every")
    if step <= 0:
        raise fail("--every must be more than 0", 2)
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise fail(f"{url}: give an http:// or https:// address", 2)
    result = record(urls, output, every=step, duration=_seconds(duration, "--for"), rounds=rounds, timeout=timeout)
    console.print(f"{result.rounds} round(s), {result.pages} page(s), {result.samples} sample(s) written to {output}"
                  + (f"; {result.failures} fetch(es) failed (noted in the file)" if result.failures else ""),
                  highlight=False, markup=False)
    if result.pages == 0:
        raise fail("no page could be fetched", 1)
