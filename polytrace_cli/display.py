"""Values as short text for people: one rule for the command line's tables and the report's."""

from __future__ import annotations

import math
from typing import Any


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


def duration(seconds: float) -> str:
    """Seconds in the unit a person reads best: '42 s', '12.5 min', '3.2 h'."""
    if abs(seconds) < 120:
        return f"{seconds:,.1f} s" if abs(seconds) < 10 else f"{seconds:,.0f} s"
    if abs(seconds) < 7200:
        return f"{seconds / 60:,.1f} min"
    return f"{seconds / 3600:,.1f} h"
