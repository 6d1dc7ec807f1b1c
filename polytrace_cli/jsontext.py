"""JSON text for values the json module does not know."""

from __future__ import annotations

import decimal
import json
from typing import Any


def json_default(value: Any) -> Any:
    """JSON for values the json module does not know: decimals (DuckDB sums), dates, others as text."""
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return str(value)


def json_text(document: Any) -> str:
    """A document as the commands' `--json` print it: indented, unknown values by `json_default`."""
    return json.dumps(document, indent=2, default=json_default)
