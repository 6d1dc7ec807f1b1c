"""The `polytrace` command line: a thin layer of typer commands over the library."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable

import typer

from polytrace_cli import __version__
from polytrace_cli.commands import analyze as analyze_commands
from polytrace_cli.commands import ingest as ingest_commands
from polytrace_cli.commands import report as report_commands
from polytrace_cli.commands import simulate as simulate_commands
from polytrace_cli.commands import store as store_commands
from polytrace_cli.commands import workload as workload_commands

HELP = "Characterize RLVR training runs: ingest logs and traces, analyze, report, gate CI."


def version() -> None:
    """Print the polytrace version."""
    typer.echo(__version__)


COMMANDS: dict[str, Callable] = {
    "ingest": ingest_commands.ingest,
    "formats": ingest_commands.formats,
    "runs": store_commands.runs,
    "query": store_commands.query,
    "errors": store_commands.errors,
    "analyze": analyze_commands.analyze,
    "compare": analyze_commands.compare,
    "synth": workload_commands.synth,
    "demo": workload_commands.demo,
    "fit": workload_commands.fit,
    "export": workload_commands.export,
    "replay-check": workload_commands.replay_check,
    "fidelity": workload_commands.fidelity,
    "report": report_commands.report,
    "check": report_commands.check,
    "whatif": simulate_commands.whatif,
    "version": version,
}


def build_app(names: Iterable[str] | None = None) -> typer.Typer:
    """The command line with the named commands (all of them by default)."""
    cli = typer.Typer(name="polytrace", help=HELP, no_args_is_help=True, add_completion=False,
                      pretty_exceptions_enable=False)
    chosen = list(COMMANDS) if names is None else list(names)
    if len(chosen) == 1:
        # With one command and no callback typer would make the command the whole program.
        cli.callback()(lambda: None)
    for name in chosen:
        cli.command(name)(COMMANDS[name])
    return cli


app = build_app()


def main() -> None:
    """Console-script entry point. A named command is built alone: typer inspects the signature
    of every command it builds, which costs about 40 ms for all sixteen."""
    requested = sys.argv[1] if len(sys.argv) > 1 else None
    (build_app([requested]) if requested in COMMANDS else app)()


if __name__ == "__main__":
    main()
