"""Values and tables for people: every number and boolean the command line prints is formatted here,
and tables are cut to the terminal's width instead of wrapping their cells.

Formatting (`polytrace_cli.display`, which the report shares): null is "—", booleans "yes"/"no",
integers with thousands separators, NaN "nan" and infinities "∞"/"−∞". A table column's floats share
one number of decimals, set by the column's typical magnitude, so they line up (`column_cells`); a
single value, and a float the column's decimals would cut below 3 significant digits, has at most 3
decimals (trailing zeros dropped), none from 10,000 on, and 3 significant digits below 0.001 or from
10 million on (`cell`).

Fitting (`fit_columns`): a table spends 3 characters per column on padding and rule plus 1 for the
closing rule. The identity columns (run, kind, ...) always stay; the other columns are kept in the
order given while the table still fits, and the rest are named in a note under the table. A kept
column is as wide as its widest cell and the longest word of its header, so no cell ever wraps
(only headers may break between words). A cell is one line: line breaks in text show as "↵". In a
fitted table, text cells longer than `MAX_TEXT` are cut with "…", a path at its start (so the file
name stays), other text at its end; `--wide` prints them whole. A `wrap` column (prose, such as a
format's description) is never cut: it takes the width the kept columns leave (at least
MIN_WRAP_WIDTH) and its cells wrap between words.
"""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from polytrace_cli.display import cell, column_cells

MAX_TEXT = 40
# A wrapped column is given at least this many characters, even when the terminal is narrower.
MIN_WRAP_WIDTH = 24
_NUMBER_AND_UNIT = re.compile(r"(\d) (?=(?:s|ms|min|h|tokens?|steps?)\b)")
COLUMN_OVERHEAD = 3
TABLE_OVERHEAD = 1


def percent(value: float | None) -> str:
    """A share as a signed percentage with one decimal ("+12.5%"), "—" for null."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return f"{value * 100:+.1f}%"


def print_item(console: Console, text: str, first: str = "- ", rest: str = "  ") -> None:
    """Print plain text (no markup) as a list item wrapped to the console's width, its continuation
    lines indented under the item's first word; a number and its unit ("68 s") stay on one line."""
    kept_together = _NUMBER_AND_UNIT.sub("\\1\0", text)
    lines = textwrap.wrap(kept_together, width=max(console.width, len(first) + 20), initial_indent=first,
                          subsequent_indent=rest, break_long_words=False, break_on_hyphens=False)
    console.print("\n".join(lines).replace("\0", " ") or first.rstrip(), highlight=False, markup=False,
                  soft_wrap=True)


def _short(text: str, limit: int | None) -> str:
    """The text on one line (a line break shown as ↵, a trailing one dropped), cut to `limit` characters
    with "…": a path (a "/" and no space) loses its start, so its file name stays; other text its end."""
    text = text.rstrip("\r\n").replace("\r\n", "↵").replace("\n", "↵").replace("\r", "↵")
    if limit is None or len(text) <= limit:
        return text
    if "/" in text and " " not in text:
        return "…" + text[len(text) - limit + 1:]
    return text[: limit - 1] + "…"


def _header_word(name: str) -> int:
    return max((len(word) for word in name.replace("_", " ").split()), default=0)


@dataclass
class Fitted:
    """The columns chosen for a width, their cells and widths, and the columns left out."""

    columns: list[str]
    rows: list[list[str]]
    widths: dict[str, int]
    left_out: list[str] = field(default_factory=list)


def fit_columns(columns: Sequence[str], rows: Iterable[Sequence[Any]], width: int | None,
                identity: Sequence[str] = (), order: Sequence[str] | None = None,
                shared_decimals: str = "column", wrap: Sequence[str] = ()) -> Fitted:
    """Format the rows and keep the columns that fit in `width` characters (all when None).

    The floats of a column share their decimals (`column_cells`); with `shared_decimals="row"`, those
    of a row do, for tables whose rows are quantities and whose columns are runs. `identity` columns
    always stay; the others are tried in `order` (default: as given), and a column in neither is left
    out of a narrow table. Text is cut to MAX_TEXT characters only when a width is given, and never in
    a `wrap` column, which is kept whatever the width and takes the room the others leave."""
    if shared_decimals not in ("column", "row"):
        raise ValueError(f"shared_decimals is 'column' or 'row', not {shared_decimals!r}")
    limit = None if width is None else MAX_TEXT
    rows = [tuple(row) for row in rows]
    if shared_decimals == "row":
        formatted = [column_cells(row) for row in rows]
    else:
        by_column = [column_cells([row[i] for row in rows]) for i in range(len(columns))]
        formatted = [[by_column[i][r] for i in range(len(columns))] for r in range(len(rows))]
    position = {name: i for i, name in enumerate(columns)}
    wrapped = {position[name] for name in wrap if name in position}
    texts = [[_short(text, None if i in wrapped else limit) for i, text in enumerate(row)] for row in formatted]
    widths = {}
    for name, i in position.items():
        widest = max((len(row[i]) for row in texts), default=1)
        widths[name] = max(widest, _header_word(name), 1)
    kept_identity = [name for name in identity if name in position]
    candidates = [name for name in (order if order is not None else columns) if name in position and name not in kept_identity]
    if width is None:
        chosen = kept_identity + candidates
    else:
        wrapping = [name for name in (*kept_identity, *candidates) if position[name] in wrapped]
        used = TABLE_OVERHEAD + sum((MIN_WRAP_WIDTH if name in wrapping else widths[name]) + COLUMN_OVERHEAD
                                    for name in dict.fromkeys((*kept_identity, *wrapping)))
        chosen = list(kept_identity)
        for name in candidates:
            if name in wrapping:
                chosen.append(name)
                continue
            need = widths[name] + COLUMN_OVERHEAD
            if used + need <= width:
                chosen.append(name)
                used += need
        room = width - used + len(wrapping) * MIN_WRAP_WIDTH
        for name in wrapping:
            widths[name] = max(MIN_WRAP_WIDTH, min(widths[name], room // len(wrapping)))
    left_out = [name for name in columns if name not in chosen]
    return Fitted(chosen, [[row[position[name]] for name in chosen] for row in texts], widths, left_out)


def build_table(fitted: Fitted, numeric: set[str], title: str | None = None) -> Table:
    """A rich table of fitted cells: numeric columns right-aligned, each column as wide as its widest cell."""
    # Cells and titles are Text, not markup: a run name or key such as "[kind=prompt]" stays as written.
    # A title wider than the table wraps to the table's width; `print_table` prints it on its own line.
    table = Table(title=Text(title) if title else None, title_justify="left", header_style="bold")
    for name in fitted.columns:
        table.add_column(Text(name.replace("_", " ")), justify="right" if name in numeric else "left",
                         width=fitted.widths[name], no_wrap=False, overflow="fold")
    for row in fitted.rows:
        table.add_row(*(Text(text) for text in row))
    return table


def print_table(console: Console, columns: Sequence[str], rows: Iterable[Sequence[Any]], numeric: set[str], *,
                title: str | None = None, identity: Sequence[str] = (), order: Sequence[str] | None = None,
                wide: bool = False, more: str = "--wide or --json", shared_decimals: str = "column",
                wrap: Sequence[str] = ()) -> None:
    """Print a table fitted to the console's width; with `wide`, every column at full width
    (lines may then run past the terminal, but cells stay whole). `shared_decimals` and `wrap` as in
    `fit_columns`."""
    rows = list(rows)
    if title:
        console.print(Text(title, style="italic"))
    if wide:
        fitted = fit_columns(columns, rows, None, identity, order, shared_decimals)
        table = build_table(fitted, numeric)
        needed = TABLE_OVERHEAD + sum(fitted.widths[n] + COLUMN_OVERHEAD for n in fitted.columns)
        # rich caps print(width=...) at the console's width, so widen the console for this table.
        width = console.width
        console.width = max(width, needed)
        try:
            console.print(table, crop=False)
        finally:
            console.width = width
        return
    fitted = fit_columns(columns, rows, console.width, identity, order, shared_decimals, wrap)
    console.print(build_table(fitted, numeric))
    if fitted.left_out:
        note = f"{len(fitted.left_out)} more column(s) with {more}: {', '.join(fitted.left_out)}"
        if len(note) > console.width:
            note = f"{len(fitted.left_out)} more column(s) with {more}"
        console.print(note, style="dim", highlight=False, markup=False)
