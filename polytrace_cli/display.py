"""Values as short text for people: one rule for the command line's tables and the report's.

`cell` formats one value on its own; `column_cells` formats a table column, whose numbers share one
number of decimals so that they line up and read as one quantity.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

# A column's typical value shows this many significant digits (at most MAX_DECIMALS decimals).
COLUMN_SIGNIFICANT = 4
MAX_DECIMALS = 3
# Fewer significant digits than this at the column's decimals, and a value is shown on its own (`cell`).
KEPT_SIGNIFICANT = 3


def cell(value: Any) -> str:
    """A value as short text for people: null "—", booleans "yes"/"no", integers with thousands
    separators, floats with at most 3 decimals (trailing zeros dropped), no decimals from 10,000 on,
    3 significant digits below 0.001 or from 10 million on, NaN "nan", infinities "∞"/"−∞"; lists
    show their first 8 items, dicts their key=value pairs."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "∞" if value > 0 else "−∞"
        if value != 0 and (abs(value) >= 1e7 or abs(value) < 1e-3):
            return f"{value:.3g}"
        if abs(value) >= 1e4:
            return f"{value:,.0f}"
        text = f"{value:,.3f}".rstrip("0").rstrip(".")
        return "0" if text == "-0" else text
    if isinstance(value, (list, tuple)):
        text = ", ".join(cell(v) for v in value[:8])
        return f"[{text}{', …' if len(value) > 8 else ''}]"
    if isinstance(value, dict):
        return ", ".join(f"{k}={cell(v)}" for k, v in value.items())
    return str(value)


def _in_plain_range(value: float) -> bool:
    """True for the floats `cell` writes in plain notation: finite, and 0 or 0.001 <= |value| < 10 million."""
    return math.isfinite(value) and (value == 0 or 1e-3 <= abs(value) < 1e7)


def column_decimals(values: Sequence[Any]) -> int | None:
    """The decimals a column's floats share, from the median m of their nonzero magnitudes in plain
    range: d = COLUMN_SIGNIFICANT − 1 − ⌊log10 m⌋, clamped to 0..MAX_DECIMALS (m = 425 gives 1 decimal,
    m = 7.1 gives 3, m = 9,655 gives 0), and never more than the values are written with: a column of
    whole numbers held as floats gets 0, one already rounded to 1 decimal gets 1. None when the column
    has no such float."""
    plain = [v for v in values if isinstance(v, float) and _in_plain_range(v)]
    magnitudes = [abs(v) for v in plain if v != 0]
    if not magnitudes:
        return None
    typical = statistics.median(magnitudes)
    wanted = min(MAX_DECIMALS, max(0, COLUMN_SIGNIFICANT - 1 - math.floor(math.log10(typical))))
    return min(wanted, max(_decimals_written(v) for v in plain))


def _decimals_written(value: float) -> int:
    """Decimals of the shortest text that reads back as the value: 2.7 has 1, 3.0 has 0, 0.1 + 0.2 has 17."""
    text = repr(value)
    if "e" in text or "E" in text:
        mantissa, exponent = text.lower().split("e")
        fraction = mantissa.split(".")[1] if "." in mantissa else ""
        return max(0, len(fraction.rstrip("0")) - int(exponent))
    fraction = text.split(".")[1] if "." in text else ""
    return len(fraction.rstrip("0"))


def column_cells(values: Sequence[Any]) -> list[str]:
    """One column's values as text: the floats in plain range with the column's shared decimals
    (`column_decimals`) and thousands separators, so they line up right-aligned; a float that would
    keep fewer than KEPT_SIGNIFICANT significant digits at fewer than MAX_DECIMALS decimals (12.3 in a
    column of thousands), and every other value, as `cell` writes it on its own."""
    decimals = column_decimals(values)
    if decimals is None:
        return [cell(value) for value in values]
    smallest_kept = 10.0 ** (KEPT_SIGNIFICANT - 1 - decimals)
    texts = []
    for value in values:
        if isinstance(value, float) and _in_plain_range(value) and (
                value == 0 or decimals == MAX_DECIMALS or abs(value) >= smallest_kept):
            texts.append(f"{value + 0.0:,.{decimals}f}")
        else:
            texts.append(cell(value))
    return texts


def duration(seconds: float) -> str:
    """Seconds in the unit a person reads best: '42 s', '12.5 min', '3.2 h'."""
    if abs(seconds) < 120:
        return f"{seconds:,.1f} s" if abs(seconds) < 10 else f"{seconds:,.0f} s"
    if abs(seconds) < 7200:
        return f"{seconds / 60:,.1f} min"
    return f"{seconds / 3600:,.1f} h"
