"""What every command shares: the --db option, error handling and table/JSON/CSV output.

The command modules import only typer, rich and the standard library at module level; DuckDB,
polars and the library modules are imported inside the commands. `polytrace --help` then starts
fast, and `polytrace ingest` hashes its files while those libraries load.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import os
import sys
from pathlib import Path
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from polytrace_cli.commands.tables import print_table
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
StepsOption = Annotated[
    str | None, typer.Option("--steps", metavar="A:B", help="Step range A:B, A:, :B or N (default: every step).")
]
WideOption = Annotated[bool, typer.Option("--wide", help="Print every column (lines may be wider than the terminal).")]
WaitOption = Annotated[
    float,
    typer.Option("--wait", metavar="SECONDS", min=0, show_default=False,
                 help="If another process holds the store, retry for up to this many seconds (default: 0)."),
]


def _width(stream) -> int | None:
    # Piped output is read by people in CI logs too: give tables 200 columns instead of 80, unless
    # COLUMNS says how wide the reader is.
    return None if stream.isatty() or os.environ.get("COLUMNS", "").isdigit() else 200


console = Console(width=_width(sys.stdout))
err_console = Console(stderr=True, width=_width(sys.stderr))


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print one error line on stderr and return the Exit to raise."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
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


def emit_frame(frame: pl.DataFrame, *, as_json: bool = False, as_csv: bool = False, title: str | None = None,
               identity: Sequence[str] = (), order: Sequence[str] | None = None, wide: bool = False,
               right: Sequence[str] = ()) -> None:
    """Print a frame as a table fitted to the terminal (see `tables`), or as JSON records / CSV for scripts.
    Numeric columns and those named in `right` are right-aligned."""
    if as_json:
        sys.stdout.write(json.dumps(frame.to_dicts(), default=json_default, indent=2) + "\n")
        return
    if as_csv:
        buffer = io.StringIO()
        frame.write_csv(buffer)
        sys.stdout.write(buffer.getvalue())
        return
    numeric = {name for name, dtype in frame.schema.items() if dtype.is_numeric()} | set(right)
    print_table(console, frame.columns, frame.iter_rows(), numeric, title=title, identity=identity, order=order,
                wide=wide)


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=json_default)
    return value


def emit_rows(columns: list[str], rows: list[Sequence[Any]], *, as_json: bool = False, as_csv: bool = False,
              title: str | None = None, identity: Sequence[str] = (), wide: bool = False) -> None:
    """`emit_frame` for plain rows (tuples from DuckDB), for commands that need no polars."""
    if as_json:
        records = [dict(zip(columns, row)) for row in rows]
        sys.stdout.write(json.dumps(records, default=json_default, indent=2) + "\n")
        return
    if as_csv:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([_csv_value(value) for value in row] for row in rows)
        sys.stdout.write(buffer.getvalue())
        return
    numeric = {name for i, name in enumerate(columns)
               if any(isinstance(row[i], (int, float)) and not isinstance(row[i], bool) for row in rows)}
    print_table(console, columns, rows, numeric, title=title, identity=identity, wide=wide)


def emit_table(columns: list[str], rows: Iterable[Sequence[Any]], numeric: set[str], title: str | None = None,
               order: Sequence[str] | None = None) -> None:
    """Print rows as a table fitted to the terminal (the first column always, the others in `order` while
    they fit); the `numeric` columns are right-aligned."""
    print_table(console, columns, rows, numeric, title=title, identity=columns[:1], order=order, more="--json or --csv")
