"""Numbers and tables as text, shared by the HTML and Markdown renderers."""

from __future__ import annotations

import math
from typing import Any

import polars as pl


def cell(value: Any) -> str:
    """A value as a short human-readable string, one rule for every table: floats of magnitude ≥ 100 as whole
    numbers, 1–100 with 2 decimals, below 1 with 3 decimals (scientific below 0.001 and from 10^7), thousands
    separators, '—' for null."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "∞" if value > 0 else "−∞"
        if value == 0:
            return "0"
        if abs(value) >= 1e7 or abs(value) < 1e-3:
            return f"{value:.3g}"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.2f}" if abs(value) >= 1 else f"{value:.3f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, (list, tuple)):
        text = ", ".join(cell(v) for v in value[:8])
        return f"[{text}{', …' if len(value) > 8 else ''}]"
    return str(value)


def rows(frame: pl.DataFrame, limit: int | None = None) -> tuple[list[str], list[list[str]]]:
    """Column names and formatted cells of a frame (the first `limit` rows)."""
    shown = frame if limit is None else frame.head(limit)
    return list(frame.columns), [[cell(v) for v in row] for row in shown.iter_rows()]
