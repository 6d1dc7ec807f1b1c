"""Named rules for console lines that are not metric lines.

Every line a console format does not store is counted under the first rule whose regex (Rust
regex syntax, run by polars over the cleaned line) matches it, else under `default`; a line a Ray
actor printed that no rule names falls under `ray` when that is set.
"""

from __future__ import annotations

from dataclasses import dataclass

from polytrace_cli.lazy import polars as pl

from polytrace_cli.ingest import console_lines as cl

# A line that began with a Ray actor prefix, perhaps in colour, before it was cleaned.
RAY_LINE = r"^(?:\x1b\[[0-9;]*m)*\([A-Za-z_][\w.\-]* pid=\d+"


@dataclass(frozen=True)
class NoiseRules:
    """Ordered (name, regex) rules, the name for lines none matches, and the name for such lines
    a Ray actor printed (None: they fall under `default` too)."""

    rules: tuple[tuple[str, str], ...]
    default: str = "other"
    ray: str | None = None

    def expr(self, cleaned: pl.Expr, raw: pl.Expr) -> pl.Expr:
        """The rule name of each line, from its cleaned text and its raw text."""
        named = pl.when(pl.lit(False)).then(pl.lit(None, pl.String))
        for rule, pattern in self.rules:
            named = named.when(cleaned.str.contains(pattern)).then(pl.lit(rule))
        if self.ray is not None:
            named = named.when(raw.str.contains(RAY_LINE)).then(pl.lit(self.ray))
        return named.otherwise(pl.lit(self.default))


# The rules of verl's console logs (`console_lines.NOISE_RULES`: blank, tqdm, traceback, warning,
# pprint, logging), 'ray-log' for other lines of Ray actors, 'other' for the rest.
CONSOLE_NOISE = NoiseRules(cl.NOISE_RULES, default="other", ray="ray-log")
