"""What every command shares: the --db option, error handling and table/JSON/CSV output.

The command modules import only typer, rich and the standard library at module level; DuckDB,
polars and the library modules are imported inside the commands. `polytrace --help` then starts
fast, and `polytrace ingest` hashes its files while those libraries load.
"""

from __future__ import annotations

import functools
import io
import json
import sys
from pathlib import Path
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from polytrace_cli.errors import PolytraceError
from polytrace_cli.jsontext import json_default

if TYPE_CHECKING:
    import polars as pl

DbOption = Annotated[
    Path | None,
    typer.Option("--db", envvar="POLYTRACE_DB", help="Store file (default: ./polytrace.duckdb)."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
CsvOption = Annotated[bool, typer.Option("--csv", help="Print CSV for scripts.")]

# Piped output is read by people in CI logs too: give tables room instead of 80 columns.
console = Console(width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 200)


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print one error line on stderr and return the Exit to raise."""
    from rich.markup import escape

    # A message names files and options ("polytrace[ray]", "run[1].log"): brackets are text, not markup.
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def user_errors(command):
    """Turn the errors a user can cause into one line on stderr and a non-zero exit."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except PolytraceError as error:
            raise fail(str(error), error.exit_code) from None
        except KeyboardInterrupt:
            raise fail("interrupted; the file being read was rolled back", 130) from None
        except Exception as error:
            if _is_duckdb_error(error):
                raise fail(_first_line(error)) from None
            raise

    return wrapper


def _is_duckdb_error(error: Exception) -> bool:
    # DuckDB is imported only by the commands that use it; an error cannot come from it otherwise.
    duckdb = sys.modules.get("duckdb")
    return duckdb is not None and isinstance(error, duckdb.Error)


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        if value != value:
            return "nan"
        if abs(value) >= 1e6 or (0 < abs(value) < 1e-3):
            return f"{value:.3g}"
        return f"{value:,.3f}".rstrip("0").rstrip(".") if abs(value) < 1e4 else f"{value:,.1f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def emit_frame(frame: pl.DataFrame, *, as_json: bool = False, as_csv: bool = False, title: str | None = None) -> None:
    """Print a frame as a rich table, or as JSON records / CSV for scripts."""
    if as_json:
        sys.stdout.write(json.dumps(frame.to_dicts(), default=json_default, indent=2) + "\n")
        return
    if as_csv:
        buffer = io.StringIO()
        frame.write_csv(buffer)
        sys.stdout.write(buffer.getvalue())
        return
    numeric = {name for name, dtype in frame.schema.items() if dtype.is_numeric()}
    emit_table(frame.columns, frame.iter_rows(), numeric, title=title)


def emit_table(columns: list[str], rows: Iterable[Sequence[Any]], numeric: set[str], title: str | None = None) -> None:
    """Print rows as a rich table; the `numeric` columns are right-aligned."""
    table = Table(title=title, title_justify="left", header_style="bold")
    for name in columns:
        table.add_column(name, justify="right" if name in numeric else "left", overflow="fold")
    for row in rows:
        table.add_row(*(_cell(v) for v in row))
    console.print(table)
