"""Running the registered analyses and shaping their results: JSON, one CSV, two runs side by side.

JSON is `{"<analysis>": [row, ...], ...}` with each analysis' own column names (NaN and infinities
as null). The CSV holds every analysis: an `analysis` column first, then the union of the
analyses' columns (a cell is empty where an analysis has no such column; list and JSON values are
written as JSON text).
"""

from __future__ import annotations

import io
import json
import math
from typing import Any

import duckdb
import polars as pl

from polytrace_cli.analyze.common import StepRange
from polytrace_cli.analyze.registry import Analysis, all_analyses, named_analyses
from polytrace_cli.errors import PolytraceError
from polytrace_cli.jsontext import json_default

# String columns that name what a summary row is about (the rest of a row are its numbers).
KEY_COLUMNS = ("kind", "stage", "tool")

# What a person reads first in each analysis' summary, in order; the terminal table keeps as many
# of these as fit beside the run and key columns. Every column stays in --wide, JSON and CSV.
HEADLINE_COLUMNS = {
    "lengths": ("count", "mean_tokens", "p50_tokens", "p90_tokens", "p99_tokens", "max_tokens", "cv", "clip_ratio",
                "cap_tokens", "max_p50", "estimate", "basis"),
    "drift": ("steps", "mean_tokens", "slope_tokens_per_step", "slope_ci_low", "slope_ci_high", "r_squared",
              "spearman_p", "relative_slope_per_step", "basis"),
    "longtail": ("steps", "mean_slot_idle", "max_slot_idle", "mean_straggler_share", "estimate", "basis"),
    "fit": ("family", "ks", "aic", "note", "n_fitted", "excluded_at_cap", "basis"),
    "imbalance": ("steps", "ranks", "mean_lambda", "mean_lambda_before_balancing", "max_lambda", "mean_makespan_lambda",
                  "mean_lambda_balanced",
                  "mean_saving", "straggler_ranks", "mean_reward_spread_s", "basis"),
    "stages": ("steps", "mean_s", "share", "cv", "max_over_min", "p95_over_p50", "outlier_steps",
               "mean_unexplained_s", "basis"),
    "tools": ("calls", "p50_s", "p90_s", "p99_s", "max_s", "error_share", "mean_turns", "tool_share",
              "cache_hit_ratio", "basis"),
    "filtering": ("batches", "trainer_steps", "kept_share", "mean_batches_per_trainer_step", "discarded_token_share",
                  "unused_token_share", "used_share", "basis"),
}


def select_analyses(only: str | None) -> dict[str, Analysis]:
    """The registered analyses named in a comma-separated list (all when None); unknown names are an error."""
    if not only:
        return all_analyses()
    names = list(dict.fromkeys(name.strip() for name in only.split(",") if name.strip()))
    # Only the named modules are imported: `--only lengths` does not load scipy for the others.
    chosen = named_analyses(names)
    unknown = [name for name in names if name not in chosen]
    if unknown or not names:
        known = ", ".join(all_analyses())
        if unknown:
            raise PolytraceError(f"unknown analysis {', '.join(unknown)} (known: {known})")
        raise PolytraceError(f"--only names no analysis (known: {known})")
    return chosen


def run_analyses(con: duckdb.DuckDBPyConnection, run_ids: list[int], analyses: dict[str, Analysis],
                 steps: StepRange) -> dict[str, pl.DataFrame]:
    """Each analysis' summary frame for the runs and step range, in registry order."""
    return {name: analysis.summary(con, run_ids, steps) for name, analysis in analyses.items()}


def summaries(con: duckdb.DuckDBPyConnection, runs: list[str] | None, only: str | None = None,
              steps: StepRange | str | None = None) -> dict[str, pl.DataFrame]:
    """The summary frames of the analyses named in `only` (all by default) over the named runs
    (every run by default) and steps; an empty store, an unknown run or analysis is an error."""
    from polytrace_cli.store.queries import run_ids_to_analyze

    step_range = StepRange.of(steps)
    # Runs are resolved before the analyses load (scipy): a mistyped name fails at once.
    return run_analyses(con, run_ids_to_analyze(con, runs), select_analyses(only), step_range)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def results_json(results: dict[str, pl.DataFrame]) -> str:
    """`{"<analysis>": [rows...]}`; NaN and infinities become null so the output is strict JSON."""
    document = {name: [_finite(row) for row in df.to_dicts()] for name, df in results.items()}
    return json.dumps(document, default=json_default, indent=2, allow_nan=False)


def _as_text(df: pl.DataFrame) -> pl.DataFrame:
    columns = []
    for name, dtype in df.schema.items():
        if dtype.is_nested():
            columns.append(pl.col(name).map_elements(lambda v: json.dumps(_finite(v.to_list() if hasattr(v, "to_list") else v),
                                                                          default=json_default),
                                                     return_dtype=pl.String).alias(name))
        else:
            columns.append(pl.col(name).cast(pl.String))
    return df.select(columns)


def results_csv(results: dict[str, pl.DataFrame]) -> str:
    """One CSV of every analysis: `analysis` first, then the union of their columns (see module docstring)."""
    parts = [_as_text(df).select(pl.lit(name).alias("analysis"), pl.all()) for name, df in results.items() if df.height]
    buffer = io.StringIO()
    if parts:
        pl.concat(parts, how="diagonal").write_csv(buffer)
    else:
        buffer.write("analysis\n")
    return buffer.getvalue()


def compare_frame(a_name: str, b_name: str, results: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """Side by side: one row per analysis × metric × key (kind/stage/tool) with the values of run A
    and run B, delta = B − A and relative delta = (B − A) / |A| (null when A is 0 or missing)."""
    rows = []
    for name, df in results.items():
        if not df.height:
            continue
        keys = [c for c in KEY_COLUMNS if c in df.columns]
        metrics = [c for c, dtype in df.schema.items() if dtype.is_numeric() and c not in keys]
        side = {}
        for run_name in (a_name, b_name):
            part = df.filter(pl.col("run") == run_name)
            side[run_name] = {tuple(str(r[k]) for k in keys): r for r in part.iter_rows(named=True)}
        key_order = list(dict.fromkeys([*side[a_name], *side[b_name]]))
        for key in key_order:
            label = ", ".join(f"{k}={v}" for k, v in zip(keys, key)) or None
            row_a, row_b = side[a_name].get(key, {}), side[b_name].get(key, {})
            for metric in metrics:
                a, b = _finite(row_a.get(metric)), _finite(row_b.get(metric))
                if a is None and b is None:
                    continue
                delta = b - a if a is not None and b is not None else None
                relative = delta / abs(a) if delta is not None and a else None
                rows.append({"analysis": name, "metric": metric, "key": label, a_name: a, b_name: b,
                             "delta": delta, "relative_delta": relative})
    schema = {"analysis": pl.String, "metric": pl.String, "key": pl.String, a_name: pl.Float64, b_name: pl.Float64,
              "delta": pl.Float64, "relative_delta": pl.Float64}
    return pl.DataFrame(rows, schema=schema)
