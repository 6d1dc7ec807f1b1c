"""Tables as text, shared by the HTML and Markdown renderers; every column goes through `display.column_cells`."""

from __future__ import annotations

import polars as pl

from polytrace_cli.display import column_cells


def rows(frame: pl.DataFrame, limit: int | None = None) -> tuple[list[str], list[list[str]]]:
    """Column names and formatted cells of a frame (the first `limit` rows), each column's numbers with
    shared decimals."""
    shown = frame if limit is None else frame.head(limit)
    by_column = [column_cells(shown.get_column(name).to_list()) for name in shown.columns]
    return list(frame.columns), [list(row) for row in zip(*by_column)] if by_column else []
