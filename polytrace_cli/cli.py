"""The `polytrace` command line: a thin layer of typer commands over the library."""

from __future__ import annotations

import typer

from polytrace_cli import __version__
from polytrace_cli.commands import analyze as analyze_commands
from polytrace_cli.commands import bench as bench_commands
from polytrace_cli.commands import ingest as ingest_commands
from polytrace_cli.commands import report as report_commands
from polytrace_cli.commands import store as store_commands
from polytrace_cli.commands import workloads as workload_commands

app = typer.Typer(
    name="polytrace",
    help="Characterize RLVR training runs: ingest logs and traces, analyze, report, gate CI.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

app.command("ingest")(ingest_commands.ingest)
app.command("formats")(ingest_commands.formats)
app.command("runs")(store_commands.runs)
app.command("query")(store_commands.query)
app.command("errors")(store_commands.errors)
app.command("analyze")(analyze_commands.analyze)
app.command("compare")(analyze_commands.compare)
app.command("synth")(bench_commands.synth)
app.command("demo")(bench_commands.demo)
app.command("fit")(workload_commands.fit)
app.command("export")(workload_commands.export)
app.command("replay-check")(workload_commands.replay_check)
app.command("fidelity")(workload_commands.fidelity)
app.command("report")(report_commands.report)
app.command("check")(report_commands.check)


@app.command("version")
def version() -> None:
    """Print the polytrace version."""
    typer.echo(__version__)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
