"""What every command shares: the --db option, error handling and table/JSON/CSV output.

The command modules import only typer, rich and the standard library at module level; DuckDB,
polars and the library modules are imported inside the commands. `polytrace --help` then starts
fast, and `polytrace ingest` hashes its files while those libraries load.
"""

from __future__ import annotations

import csv
import datetime
import decimal
import errno
import functools
import io
import json
import math
import os
import sys
import uuid
from pathlib import Path
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

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
                 help="If another process holds the store, retry for up to this many seconds, saying so once on"
                      " stderr (default: 0)."),
]


def _width(stream) -> int | None:
    # Piped output is read by people in CI logs too: give tables 200 columns instead of 80, unless
    # COLUMNS says how wide the reader is.
    return None if stream.isatty() or os.environ.get("COLUMNS", "").isdigit() else 200


# Emoji codes are off: data such as `postgres:x:101` must print as written. Text from data goes
# into tables as rich Text and into messages through `escape`, never as markup.
console = Console(width=_width(sys.stdout), emoji=False)
# Errors are one line each: never wrapped at the terminal's width.
err_console = Console(stderr=True, width=_width(sys.stderr), emoji=False, soft_wrap=True)


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print one error line on stderr and return the Exit to raise."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


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
            from polytrace_cli.facade import Store

            worded = Store.error_message(error)
            if worded is not None:
                raise fail(worded) from None
            if isinstance(error, OSError) and error.errno == errno.ENOSPC:
                raise fail(f"the disk is full: {error.strerror}; free space and run again") from None
            raise

    return wrapper


def plain(value: Any) -> Any:
    """`value` as JSON-ready Python: lists, dicts with text keys, numbers, text, bool, None.

    Blobs become text with non-printable bytes as \\xNN, dates and times ISO 8601, intervals
    their Python spelling, decimals numbers, UUIDs text; NaN and infinities stay floats.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(plain(key)): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [plain(item) for item in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "".join(chr(b) if 32 <= b < 127 and b != 92 else f"\\x{b:02x}" for b in bytes(value))
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (datetime.timedelta, uuid.UUID)):
        return str(value)
    return str(value)


def _finite_json(value: Any) -> Any:
    # JSON has no NaN or infinity: they are written as the strings "NaN", "Infinity", "-Infinity".
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: _finite_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite_json(item) for item in value]
    return value


def _text(value: Any) -> str:
    """One value as text for a CSV field: nested values as JSON."""
    value = plain(value)
    if value is None:
        return ""
    if isinstance(value, (list, dict)):
        return json.dumps(_finite_json(value), ensure_ascii=False)
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if value != value else ("inf" if value > 0 else "-inf")
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# What a narrow table of runs keeps first, after the run's name: what the run is, then how much it holds.
RUNS_ORDER = ("framework", "mode", "task", "samples", "steps", "first_step", "last_step", "files", "rejected",
              "segments", "formats")


def emit_rows(columns: list[str], rows: list[Sequence[Any]], numeric: set[str] | None = None, *,
              as_json: bool = False, as_csv: bool = False, title: str | None = None, identity: Sequence[str] = (),
              order: Sequence[str] | None = None, wide: bool = False) -> None:
    """Print Python rows (any DuckDB type: lists, structs, maps, blobs, dates, intervals, NaN) as a table
    fitted to the terminal, JSON records or CSV, for commands that need no polars. Without `numeric`, the
    columns holding numbers are right-aligned. A narrow table keeps the `identity` columns, then the others
    in `order` (default: as given) while they fit."""
    if as_json:
        records = [dict(zip(columns, (_finite_json(plain(v)) for v in row))) for row in rows]
        sys.stdout.write(json.dumps(records, indent=2, ensure_ascii=False) + "\n")
        return
    if as_csv:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([_text(v) for v in row] for row in rows)
        sys.stdout.write(buffer.getvalue())
        return
    if numeric is None:
        numeric = {name for i, name in enumerate(columns)
                   if any(isinstance(row[i], (int, float)) and not isinstance(row[i], bool) for row in rows)}
    shown = [[_text(v) if isinstance(v, (list, tuple, dict, set)) else plain(v) for v in row] for row in rows]
    print_table(console, columns, shown, numeric, title=title, identity=identity, order=order, wide=wide)


def emit_frame(frame: pl.DataFrame, *, as_json: bool = False, as_csv: bool = False, title: str | None = None,
               identity: Sequence[str] = (), order: Sequence[str] | None = None, wide: bool = False,
               right: Sequence[str] = (), shared_decimals: str = "column", wrap: Sequence[str] = ()) -> None:
    """Print a frame as a table fitted to the terminal (see `tables`), or as JSON records / CSV for scripts.
    Numeric columns and those named in `right` are right-aligned; `shared_decimals="row"` formats a row's
    numbers alike, for rows that are quantities; `wrap` columns wrap instead of being cut (`tables.fit_columns`)."""
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
                wide=wide, shared_decimals=shared_decimals, wrap=wrap)


def emit_table(columns: list[str], rows: Iterable[Sequence[Any]], numeric: set[str], title: str | None = None,
               order: Sequence[str] | None = None) -> None:
    """Print rows as a table fitted to the terminal (the first column always, the others in `order` while
    they fit); the `numeric` columns are right-aligned."""
    print_table(console, columns, rows, numeric, title=title, identity=columns[:1], order=order, more="--json or --csv")
