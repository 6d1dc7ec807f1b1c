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

from polytrace_cli.analyze.common import TRAINING, VALIDATION, StepRange, ids_sql
from polytrace_cli.analyze.registry import SAMPLE_ANALYSES, Analysis, all_analyses, named_analyses
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
    """Each analysis' summary frame for the runs and step range, in registry order: in the validation
    split, only the analyses that apply to it (`applies_to_split`)."""
    return {name: analysis.summary(con, run_ids, steps) for name, analysis in analyses.items()
            if applies_to_split(name, steps.split)}


def applies_to_split(name: str, split: str) -> bool:
    """Whether the analysis answers on the split: every analysis on training, on validation those that
    read samples (`registry.SAMPLE_ANALYSES`)."""
    return split == TRAINING or name in SAMPLE_ANALYSES


def split_notes(con: duckdb.DuckDBPyConnection, run_ids: list[int], names: list[str], steps: StepRange) -> list[str]:
    """What the validation split leaves out, one line each: the named analyses that do not apply to it
    and the runs with no validation sample in the step range (none in the training split). An error
    when nothing could be analyzed: no named analysis applies, or no run holds a validation sample."""
    if steps.split != VALIDATION:
        return []
    left_out = [name for name in names if not applies_to_split(name, VALIDATION)]
    if len(left_out) == len(names):
        one = len(left_out) == 1
        raise PolytraceError(f"{', '.join(left_out)} {'reads' if one else 'read'} step metrics or training batches, "
                             f"not samples: {'it does' if one else 'they do'} not apply to the validation split "
                             f"(those that do: {', '.join(SAMPLE_ANALYSES)})")
    rows = con.execute(
        f"SELECT r.name, count(s.run_id) FROM runs r LEFT JOIN samples s ON s.run_id = r.run_id "
        f"AND coalesce(s.validate, false) AND {steps.sql('s.step')} "
        f"WHERE r.run_id IN {ids_sql(run_ids)} GROUP BY r.name ORDER BY r.name").fetchall()
    without = [name for name, count in rows if count == 0]
    if len(without) == len(rows):
        raise PolytraceError(f"no validation samples (samples with validate true) in {_runs_named(without)}"
                             f"{'' if steps == StepRange(split=VALIDATION) else ' within the step range'}")
    notes = [f"{name}: does not apply to the validation split (it reads step metrics or training batches, "
             "not samples)" for name in left_out]
    notes += [f"run {name} has no validation samples (samples with validate true): left out" for name in without]
    return notes


def _runs_named(names: list[str]) -> str:
    return f"run {names[0]}" if len(names) == 1 else f"runs {', '.join(names)}"


def summaries(con: duckdb.DuckDBPyConnection, runs: list[str] | None, only: str | None = None,
              steps: StepRange | str | None = None, split: str | None = None) -> dict[str, pl.DataFrame]:
    """The summary frames of the analyses named in `only` (all by default) over the named runs
    (every run by default), steps and split (None: the step range's, training unless said); an
    empty store, an unknown run or analysis is an error, and so is a validation split with nothing
    to analyze (`split_notes`)."""
    from polytrace_cli.store.queries import run_ids_to_analyze

    step_range = StepRange.of(steps).of_split(split)
    # Runs are resolved before the analyses load (scipy): a mistyped name fails at once.
    ids = run_ids_to_analyze(con, runs)
    analyses = select_analyses(only)
    split_notes(con, ids, list(analyses), step_range)
    return run_analyses(con, ids, analyses, step_range)


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


NEAR_ZERO = 0.01


def compare_frame(a_name: str, b_name: str, results: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """Side by side: one row per analysis × metric × key (kind/stage/tool) with the values of run A
    and run B, delta = B − A and relative delta = (B − A) / |A| (null when A is missing or near zero:
    |A| below NEAR_ZERO of max(|A|, |B|), a change of more than 99×)."""
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
                # No relative change over a base near zero: |A| must be at least 1% of the larger value.
                relative = delta / abs(a) if delta is not None and abs(a or 0.0) >= NEAR_ZERO * max(abs(a), abs(b)) \
                    and a else None
                rows.append({"analysis": name, "metric": metric, "key": label, a_name: a, b_name: b,
                             "delta": delta, "relative_delta": relative})
    schema = {"analysis": pl.String, "metric": pl.String, "key": pl.String, a_name: pl.Float64, b_name: pl.Float64,
              "delta": pl.Float64, "relative_delta": pl.Float64}
    return pl.DataFrame(rows, schema=schema)
