"""The `polytrace` command line: a thin layer of typer commands over the library."""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Callable
from typing import Annotated

import typer
from typer.core import TyperGroup

try:
    from typer._click import core as click_core, exceptions as click_errors  # typer 0.28 carries its own click
except ImportError:  # older typer runs on click itself
    from click import core as click_core, exceptions as click_errors

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


def usage_line(error: click_errors.UsageError) -> str:
    """A usage error as the one line a person reads: what was wrong, in which command, and the nearest
    option or command when one is close ("--step is not an option of steps; did you mean --steps?")."""
    ctx = error.ctx
    command = ctx.info_name if ctx is not None and ctx.parent is not None else None
    where = f" of {command}" if command else ""
    if isinstance(error, click_errors.NoSuchOption):
        text = f"{error.option_name} is not an option{where}"
        close = [name for name in error.possibilities or () if name not in ("--help", "-h")]
        if close:
            return f"{text}; did you mean {' or '.join(close)}?"
        argument = _argument_named(ctx, error.option_name)
        if argument:
            return f"{text}; {argument} is an argument: polytrace {command} {argument}"
        return f"{text}; polytrace {command or ''} -h lists them".replace("  ", " ")
    message = " ".join(error.format_message().split())
    if message.startswith("No such command"):
        wrong = message.split("'")[1] if "'" in message else ""
        close = difflib.get_close_matches(wrong, list(COMMANDS))
        text = f"{wrong} is not a polytrace command"
        return f"{text}; did you mean {' or '.join(close)}?" if close else f"{text}; polytrace -h lists them"
    first = message[:1].lower() + message[1:]
    return f"{first.rstrip('.')} (polytrace {command + ' ' if command else ''}-h for help)"


def _argument_named(ctx: click_core.Context | None, option: str) -> str | None:
    """The metavar of the command's argument that `--NAME` names (`errors --run x`: RUN), or None."""
    if ctx is None:
        return None
    wanted = option.lstrip("-").replace("-", "_").lower()
    for param in ctx.command.params:
        if param.param_type_name == "argument" and param.name and param.name.lower() == wanted:
            return param.name.upper()
    return None


class OneLineErrors(TyperGroup):
    """The command group whose usage errors (an unknown option or command, a missing argument, a value
    of the wrong type) print one line on stderr, `error: ...`, and exit 2, through one handler
    (`usage_line`); help for no arguments is printed as before."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click_errors.NoArgsIsHelpError as error:
            typer.echo(error.format_message())
            sys.exit(error.exit_code)
        except click_errors.UsageError as error:
            typer.echo(f"error: {usage_line(error)}", err=True)
            sys.exit(2)
        except click_errors.ClickException as error:
            typer.echo(f"error: {' '.join(error.format_message().split())}", err=True)
            sys.exit(error.exit_code)
        except (getattr(click_errors, "Abort", typer.Abort), typer.Abort):
            typer.echo("error: aborted", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def _new_app() -> typer.Typer:
    made = typer.Typer(name="polytrace", help=HELP, cls=OneLineErrors, no_args_is_help=True, add_completion=False,
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
