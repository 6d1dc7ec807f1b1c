"""The `polytrace` command line: a thin layer of typer commands over the library."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Annotated

import typer

from polytrace_cli import __version__
from polytrace_cli.commands import analyze as analyze_commands
from polytrace_cli.commands import diagnose as diagnose_commands
from polytrace_cli.commands import ingest as ingest_commands
from polytrace_cli.commands import lake as lake_commands
from polytrace_cli.commands import report as report_commands
from polytrace_cli.commands import simulate as simulate_commands
from polytrace_cli.commands import steps as steps_commands
from polytrace_cli.commands import store as store_commands
from polytrace_cli.commands import watch as watch_commands
from polytrace_cli.commands import workload as workload_commands

HELP = "Characterize RLVR training runs: ingest logs and traces, analyze, report, gate CI."


def version() -> None:
    """Print the polytrace version."""
    typer.echo(__version__)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit()


def _options(
    show_version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_print_version,
                                               help="Print the polytrace version and exit.")] = False,
) -> None:
    """Characterize RLVR training runs: ingest logs and traces, analyze, report, gate CI."""


COMMANDS: dict[str, Callable] = {
    "ingest": ingest_commands.ingest,
    "formats": ingest_commands.formats,
    "runs": store_commands.runs,
    "query": store_commands.query,
    "errors": store_commands.errors,
    "rm": store_commands.rm,
    "rename": store_commands.rename,
    "steps": steps_commands.steps,
    "lake": lake_commands.lake,
    "analyze": analyze_commands.analyze,
    "compare": analyze_commands.compare,
    "explain": diagnose_commands.explain,
    "synth": workload_commands.synth,
    "demo": workload_commands.demo,
    "fit": workload_commands.fit,
    "export": workload_commands.export,
    "replay-check": workload_commands.replay_check,
    "fidelity": workload_commands.fidelity,
    "report": report_commands.report,
    "check": report_commands.check,
    "whatif": simulate_commands.whatif,
    "watch": watch_commands.watch,
    "scrape": watch_commands.scrape,
    "version": version,
}


def _new_app() -> typer.Typer:
    made = typer.Typer(name="polytrace", help=HELP, no_args_is_help=True, add_completion=False,
                       pretty_exceptions_enable=False, context_settings={"help_option_names": ["-h", "--help"]})
    made.callback()(_options)
    return made


app = _new_app()


def _first_paragraph(command: Callable) -> str:
    """The first paragraph of the command's docstring on one line: the command list prints a short help
    as it is, so a docstring's line breaks would break its lines mid-sentence."""
    return " ".join((command.__doc__ or "").split("\n\n")[0].split())


for _name, _command in COMMANDS.items():
    app.command(_name, short_help=_first_paragraph(_command))(_command)


def _app_for(args: list[str]) -> typer.Typer:
    """`app`, or, when the first argument names a command, an app holding that command alone: typer
    builds the options of every command it holds before it runs one (about 25 ms of CPU for all of
    them, a tenth of a one-file ingest's start), and the command runs and reads its options the same."""
    name = args[0] if args else None
    if name not in COMMANDS:
        return app
    single = _new_app()
    single.command(name, short_help=_first_paragraph(COMMANDS[name]))(COMMANDS[name])
    return single


# Libraries whose teardown at interpreter exit takes a noticeable time (0.3-0.4 s together).
_SLOW_TO_TEAR_DOWN = ("matplotlib", "scipy", "sklearn")


def _one_blas_thread() -> None:
    """One BLAS thread per process unless the user says otherwise (set before numpy loads). polytrace's
    linear algebra is on small matrices (mixture fits, the step-time model), where BLAS threads only
    spin: they took 0.3 s of CPU from a report's two processes on two cores."""
    for variable in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(variable, "1")


# jemalloc's options for polars (read when polars loads): one arena for the process's threads, and
# dirty pages given back after a second. A 100 MB verl console log, read in blocks, peaked at
# 503-510 MB with the defaults and at 462-476 MB so, at the same CPU time (`benchmarks/ingest_memory.py`).
POLARS_ALLOCATOR = "narenas:1,dirty_decay_ms:1000,muzzy_decay_ms:0"


def _compact_polars_allocator() -> None:
    """`POLARS_ALLOCATOR` unless the user set jemalloc's options (set before polars loads)."""
    os.environ.setdefault("_RJEM_MALLOC_CONF", POLARS_ALLOCATOR)


def main() -> None:
    """Console-script entry point.

    A command that loaded matplotlib, scipy or scikit-learn ends without the interpreter's module
    teardown, once its output is flushed: every store it opened is closed by then, and the
    teardown only frees memory the process is about to give back. Not after Ray was loaded, whose
    exit handlers stop the cluster it started, nor under a profiler or tracer, which writes its
    results at exit.
    """
    from polytrace_cli import side_process

    _one_blas_thread()
    _compact_polars_allocator()
    side_process.mark_fresh()
    try:
        _app_for(sys.argv[1:])()
    except SystemExit as finished:
        if ("ray" in sys.modules or sys.getprofile() is not None or sys.gettrace() is not None
                or not any(name in sys.modules for name in _SLOW_TO_TEAR_DOWN)):
            raise
        code = finished.code if isinstance(finished.code, int) else (0 if finished.code is None else 1)
        if not isinstance(finished.code, (int, type(None))):
            print(finished.code, file=sys.stderr)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
                pass
        os._exit(code)


if __name__ == "__main__":
    main()
