"""Helpers every analysis shares: step ranges, run names, and SQL snippets for filtering."""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import polars as pl

from polytrace_cli.errors import PolytraceError


@dataclass(frozen=True)
class StepRange:
    """An inclusive range of steps; None on either side means unbounded."""

    first: int | None = None
    last: int | None = None

    @classmethod
    def parse(cls, text: str | None) -> "StepRange":
        """'A:B', 'A:', ':B' or 'N' (a single step); None means every step.

        A range that holds no step (A > B) or an empty text is an error, never a silent empty selection.
        """
        if text is None:
            return cls()
        try:
            if ":" not in text:
                return cls(int(text), int(text))
            first, last = text.split(":", 1)
            parsed = cls(int(first) if first.strip() else None, int(last) if last.strip() else None)
        except ValueError:
            raise PolytraceError(f"--steps takes A:B, A:, :B or N, not {text!r}") from None
        if parsed.first is not None and parsed.last is not None and parsed.first > parsed.last:
            raise PolytraceError(f"--steps {text} is empty: the first step is after the last")
        return parsed

    def sql(self, column: str = "step") -> str:
        """A SQL condition restricting `column` to the range ('true' when unbounded)."""
        parts = []
        if self.first is not None:
            parts.append(f"{column} >= {int(self.first)}")
        if self.last is not None:
            parts.append(f"{column} <= {int(self.last)}")
        return " AND ".join(parts) or "true"


ALL_STEPS = StepRange()


def run_names(con: duckdb.DuckDBPyConnection, run_ids: list[int]) -> dict[int, str]:
    """run_id -> name for the given runs."""
    rows = con.execute("SELECT run_id, name FROM runs WHERE run_id IN (SELECT unnest(?))", [run_ids]).fetchall()
    return dict(rows)


def frame(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None) -> pl.DataFrame:
    """Run SQL and return a polars DataFrame."""
    return con.sql(sql, params=params or None).pl()
