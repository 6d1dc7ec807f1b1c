"""AReaL's console log: the trainer's stats table per step.

`areal/utils/stats_logger.py` `StatsLogger.commit` logs, through AReaL's logger
(`(AReaL) %(asctime)s.%(msecs)03d %(name)s %(levelname)s: %(message)s`, `areal/utils/logging.py`):

    (AReaL) 20260521-18:37:16.101 StatsLogger INFO: Epoch 1/2 Step 3/50 Train step 3/100 done.
    (AReaL) 20260521-18:37:16.101 StatsLogger INFO: Stats (1/1):
    (AReaL) 20260521-18:37:16.102 StatsLogger INFO:
    ╒══════════════════╤════════════╤═════════════════════╤════════════╕
    │ timeperf/rollout │ 4.1250e+01 │ ppo_actor/seq_len/… │ 8.1250e+02 │
    ├──────────────────┼────────────┼─────────────────────┼────────────┤
    ...
    ╘══════════════════╧════════════╧═════════════════════╧════════════╛

the step's stats drawn by `tabulate(..., floatfmt=".4e", tablefmt="fancy_grid")` as key and value pairs,
four to a row (`areal/utils/printing.py` `tabulate_stats`): five significant digits, recorded in the run
meta. The step is the one the trackers are given: `Train step N` is global step N-1, and a commit of
several dicts (`Stats (i/n)`) logs them at consecutive steps, never below the step after the last one
logged (`log_step = max(global_step, last + 1)`). Table rows are stored (each pair at its step); the
borders, the step and `Stats` lines are ignored under named rules; a row whose cells do not pair up,
or whose value is not a number, is rejected. A step lower than or equal to the one before starts a new
segment (a restarted job appending to the log), flagged `restart`.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from polytrace_cli.errors import ErrorCode
from polytrace_cli.lazy import polars as pl

from polytrace_cli.ingest import console_lines as cl
from polytrace_cli.ingest.base import FileContext, Ingester
from polytrace_cli.ingest.console import ConsoleGrammar, NoiseRules, ParsedMetrics
from polytrace_cli.ingest.console.pipeline import METRIC, check_steps, classify
from polytrace_cli.ingest.console.reading import read_console_lines
from polytrace_cli.ingest.console.records import account_other_lines, went_back, step_segments, store_metrics
from polytrace_cli.ingest.formats.areal import names
from polytrace_cli.ingest.registry import is_binary, register

TRAIN_STEP = r"Train step (\d+)/\d+ done\.\s*$"
STATS = r"Stats \((\d+)/(\d+)\):\s*$"
TABLE_ROW = r"^│.*│\s*$"
_TRAIN_STEP = re.compile(TRAIN_STEP)
_STATS = re.compile(STATS)
_NUMBER = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$|^[-+]?(?:nan|inf)$")
_SNIFF = re.compile(rb"Train step \d+/\d+ done\.")
_SNIFF_TABLE = "╒".encode()

AREAL_NOISE = NoiseRules(
    (("table border", r"^[╒╞├╘][═─╤╪┼╧]+[╕╡┤╛]\s*$"), *cl.NOISE_RULES),
    default="other", ray="ray-log")


class ArealGrammar(ConsoleGrammar):
    """Cleaning and classifying AReaL's lines (the console pipeline's first steps); `load` parses."""

    anchor = "│"
    noise = AREAL_NOISE

    def metric_kind(self, cleaned: pl.Expr, raw_chars: pl.Expr) -> pl.Expr:
        return pl.when(cleaned.str.contains(TABLE_ROW) | cleaned.str.contains(TRAIN_STEP)
                       | cleaned.str.contains(STATS)).then(pl.lit(METRIC))


def parse_lines(ctx: FileContext, lines: pl.DataFrame) -> ParsedMetrics:
    """Pairs of the stats tables' rows, each at the step its `Stats (i/n)` line gives (see the module)."""
    rows: list[tuple] = []
    base, last, step = None, None, None
    for line_no, cleaned, raw in lines.filter(pl.col("kind") == METRIC).select("line_no", "c", "raw").iter_rows():
        if match := _TRAIN_STEP.search(cleaned):
            global_step = int(match.group(1)) - 1
            # Below the last step logged: a restarted job, which counts from its own step again.
            base = global_step if last is None or global_step < last else max(global_step, last + 1)
            step = None
            ctx.ignore("step line")
            continue
        if match := _STATS.search(cleaned):
            step = None if base is None else base + int(match.group(1)) - 1
            last = step if step is not None else last
            ctx.ignore("stats line")
            continue
        cells = [cell.strip() for cell in cleaned.strip().strip("│").split("│")]
        pairs = [(cells[i], cells[i + 1]) for i in range(0, len(cells) - 1, 2)] if len(cells) % 2 == 0 else None
        if step is None or pairs is None:
            reason = "stats table row before any `Stats (i/n):` line" if step is None else "cells do not pair up"
            ctx.reject(line_no, f"AReaL stats table: {reason}", raw, code=ErrorCode.UNPARSABLE_LINE)
            continue
        filled = [(key, value) for key, value in pairs if key or value]
        huge = next((value for _, value in filled if _NUMBER.match(value) and "inf" not in value.lower()
                     and math.isinf(float(value))), None)
        if huge is not None:
            ctx.reject(line_no, f"AReaL stats table row: {huge} is out of range for a double", raw, code=ErrorCode.OUT_OF_RANGE)
            continue
        bad = next((value for key, value in filled if not key or not _NUMBER.match(value)), None)
        if bad is not None or not filled:
            ctx.reject(line_no, f"AReaL stats table row holds a value that is not a number: {bad!r}", raw,
                       code=ErrorCode.UNPARSABLE_LINE)
            continue
        for index, (key, value) in enumerate(filled, start=1):
            rows.append((line_no, str(step), index, key, float(value), None, value))
    return ParsedMetrics.from_rows(rows)


@register
class ArealConsoleIngester(Ingester):
    name = "areal-console"
    version = "1"
    framework = "areal"
    description = "AReaL trainer log: `Train step N/M done.` and the step's stats as a fancy_grid table"
    metric_aliases = names.METRIC_ALIASES
    validation_prefixes = names.VALIDATION_PREFIXES

    def sniff(self, path: Path, head: bytes) -> bool:
        return not is_binary(head) and _SNIFF.search(head) is not None and _SNIFF_TABLE in head

    def load(self, ctx: FileContext) -> None:
        lines = classify(read_console_lines(ctx.path), ArealGrammar())
        ctx.lines = lines.height
        lines = account_other_lines(ctx, lines, pl.col("kind") != METRIC)
        metrics = check_steps(ctx, parse_lines(ctx, lines), lines).metrics
        ctx.run_meta.update({"framework": "areal", "value_significant_digits": 5})
        if not metrics.height:
            ctx.note("zero steps: no AReaL stats tables")
            return
        segments = step_segments(list(metrics.select("line_no", "step").unique("line_no", maintain_order=True)
                                      .iter_rows()), went_back)
        ctx.stored = segments.height
        store_metrics(ctx, metrics, segments, "areal", lines=lines)
