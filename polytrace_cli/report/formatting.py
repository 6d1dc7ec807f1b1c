"""Tables as text, shared by the HTML and Markdown renderers; every value goes through `display.cell`."""

from __future__ import annotations

import polars as pl

from polytrace_cli.display import cell


def rows(frame: pl.DataFrame, limit: int | None = None) -> tuple[list[str], list[list[str]]]:
    """Column names and formatted cells of a frame (the first `limit` rows)."""
    shown = frame if limit is None else frame.head(limit)
    return list(frame.columns), [[cell(v) for v in row] for row in shown.iter_rows()]
