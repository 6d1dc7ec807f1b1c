"""verl console log: the trainer's stdout (or wandb's `files/output.log`), one metric line per step.

    step:{N} - {key}:{value} - {key}:{value} - ...

The console pipeline (`ingest/console`) reads, cleans and classifies the lines, counts noise,
cuts segments and stores; this module is verl's grammar in it (FORMATS.md, section 1):

- Bulk path, in polars: a cleaned line starting with `step:` is a metric line, split on " - " and
  then on the first ":"; values are unwrapped (`np.float64(..)`) and cast, non-numbers kept as text.
- Dirty lines go to Python one by one: metric lines with a pair that is not `key:value`, a step
  that is not written as an integer (`step:1e20`, `step:2.5`), or exactly `WANDB_LINE_LIMIT` characters (wandb's console capture cuts
  lines there: the complete pairs are kept, the last piece is dropped as a fragment since it may
  be cut, and the step is flagged `truncated_line`). Lines that still do not parse are rejected
  (`unparsable-line`); a step that is a number but not a whole one in range is rejected by the
  pipeline (`type-error`, `out-of-range`).
- Every other line is ignored under a named rule (`console_lines.NOISE_RULES`, plus `ray-log` for
  other lines a Ray actor printed).
- A step going back, or printed again with a key it already had, starts a new segment (a
  restarted job in the same file), flagged `restart`; a validation line and the training line of
  the same step are one step; a log whose first step is above 1 is flagged `resumed`.
- With no metric line at all, the `Training Progress` tqdm bar is the fallback source of step
  times (`tqdm/elapsed_s`, `tqdm/s_per_it`, `tqdm/step_s`, flag `tqdm_estimate`); with neither,
  the run has zero steps and a note says how the log ends.
- Run meta: settings from Hydra overrides and the config dict printed at start, the version class
  and value precision, GPUs, whether a step total is logged and whether it includes the testing
  and checkpoint timers, and the error the log ends with after its last step (`crash`).
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass, field
from pathlib import Path

from polytrace_cli.errors import ErrorCode
from polytrace_cli.lazy import polars as pl

from polytrace_cli.ingest import console_lines as cl
from polytrace_cli.ingest import run_metadata
from polytrace_cli.ingest.arrow import ArrowStream
from polytrace_cli.ingest.base import FileContext, Ingester
from polytrace_cli.ingest.console import (ConsoleGrammar, ParsedMetrics, flag_schema, load_console, metric_schema,
                                          printed_step_schema)
from polytrace_cli.ingest.console.pipeline import DIRTY, METRIC, in_slices, int64_step, printed_sample
from polytrace_cli.ingest.console.reading import read_lines as _read_lines  # noqa: F401  (tests read through it)
from polytrace_cli.ingest.formats.verl import names as verl_names
from polytrace_cli.ingest.registry import is_binary, register
from polytrace_cli.semantics.step_timers import step_time_inclusion

WANDB_LINE_LIMIT = 4096
STEP_PREFIX = r"^step:(-?\d+)"
METRIC_LINE = re.compile(r"^step:(\S*)(?: - (.*))?$", re.DOTALL)
# A printed step that is a number; whether it is a whole one in range is the pipeline's check.
STEP_NUMBER = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$")
_SNIFF_METRIC = re.compile(r"^step:\d+ - [^:\s][^:]*:\S")
# A training job's stdout recognised by its head when the first metric line lies beyond it.
_VERL_HEAD_MARKERS = (b"(TaskRunner pid=", b"(main_task pid=", b"actor_rollout_ref.", b"verl.trainer", b"from verl")
_FOREIGN_HEAD_MARKERS = (b"Global step", b"openrlhf", b"OpenRLHF")
_TQDM_PIECE = (r"Training Progress:\s*\d+%.*?(\d+)/(\d+) \[((?:\d+:)?\d+:\d+)<[^,\]]*,\s*"
               r"([\d.]+|\?)\s*(s/it|it/s)")


@dataclass
class MetricLine:
    """A metric line parsed in Python: its step (an int when printed as an integer) and the step's
    text as printed, (key, value text) pairs, and what went wrong."""

    step: int | None
    pairs: list[tuple[str, str]] = field(default_factory=list)
    fragment: str | None = None
    problem: str | None = None
    step_text: str | None = None


def parse_metric_line(cleaned: str, cut: bool = False) -> MetricLine:
    """Parse one cleaned `step:N - key:value - ...` line. The printed step must be a number (`3`,
    `-1`, `2.5`, `1e20`); `console.check_steps` decides from `step_text` whether it is a step.

    When `cut` (the line was cut at wandb's limit), the last piece is a fragment: it is returned
    in `fragment`, not in `pairs`, whether or not it looks complete. Otherwise any piece that is not
    `key:value` with a non-empty key and value makes the line a `problem`.
    """
    match = METRIC_LINE.match(cleaned)
    if not match or not STEP_NUMBER.match(match.group(1)):
        head = cleaned.split(" - ", 1)[0]
        return MetricLine(None, problem=f"metric line with a bad step field {head[:40]!r}")
    step_text = match.group(1)
    step = int(step_text) if re.fullmatch(r"[+-]?\d+", step_text) else None
    body = match.group(2)
    if not body:
        return MetricLine(step, problem="metric line without key:value pairs", step_text=step_text)
    pieces = body.split(" - ")
    parsed = MetricLine(step, step_text=step_text)
    if cut:
        parsed.fragment = pieces.pop()
    for index, piece in enumerate(pieces, start=1):
        key, sep, value = piece.partition(":")
        if not sep or not key.strip() or not value.strip():
            parsed.problem = f"pair {index} {piece[:60]!r} is not key:value"
            return parsed
        parsed.pairs.append((key.strip(), value.strip()))
    if not parsed.pairs:
        parsed.problem = "metric line without key:value pairs"
    return parsed


def looks_like_verl_console(head: bytes) -> str | None:
    """Why `head` (a file's first bytes) is a verl console log, or None.

    Either a cleaned line within it is a `step:N - key:value` metric line (after the time it may be
    printed with), or it carries verl's own markers (a Ray `TaskRunner`/`main_task` actor,
    `actor_rollout_ref.` overrides, verl imports) and none of another framework's.
    """
    text = head.removeprefix(codecs.BOM_UTF8).decode("utf-8", errors="replace")
    for line in text.split("\n"):
        if "step:" in line and _SNIFF_METRIC.match(cl.strip_stamp(cl.clean_line(line))):
            return "metric line"
    if any(marker in head for marker in _VERL_HEAD_MARKERS) and not any(m in head for m in _FOREIGN_HEAD_MARKERS):
        return "verl markers in the head"
    return None


@register
class VerlConsoleIngester(Ingester):
    name = "verl-console"
    version = "2"
    framework = "verl"
    appendable = True
    description = "verl console log / wandb output.log (`step:N - key:value - ...` lines)"
    metric_aliases = verl_names.METRIC_ALIASES
    validation_prefixes = verl_names.VALIDATION_PREFIXES

    def sniff(self, path: Path, head: bytes) -> bool:
        if is_binary(head):
            return False
        if b"step:" in head and looks_like_verl_console(head) == "metric line":
            return True
        # The first metric line may lie beyond the sniff window in a long job's stdout.
        return path.suffix in (".log", ".txt", ".out") and looks_like_verl_console(head) is not None

    def load(self, ctx: FileContext) -> None:
        load_console(ctx, VerlGrammar())


# How many printed values tell the verl version and the printed precision (`_record_meta`).
PRINTED_SAMPLE_SIZE = 5000


class VerlGrammar(ConsoleGrammar):
    """verl's metric lines: `step:N - key:value - ...`, parsed in bulk, dirty lines in Python."""

    anchor = "step:"
    # `step:N - key:value`, anywhere in the line (after a bar, a prefix, colour codes).
    record_hint = r"step:\s*\d+\s+-\s+[\w/@.\-]+:"
    reclaimable = "tqdm"
    printed_values_read = PRINTED_SAMPLE_SIZE
    # `crash` is read from the lines after the last metric line: new steps decide it again.
    recomputed_meta = run_metadata.VERL_META_FROM_STORED_ROWS | {"step_time_logged", "crash"}

    def metric_kind(self, cleaned: pl.Expr, raw_chars: pl.Expr) -> pl.Expr:
        metric_like = cleaned.str.starts_with("step:")
        well_formed = cleaned.str.contains(r"^step:-?\d+ - \S") & (raw_chars != WANDB_LINE_LIMIT)
        return pl.when(metric_like & well_formed).then(pl.lit("metric")).when(metric_like).then(pl.lit("dirty"))

    def parse(self, ctx: FileContext, lines: pl.DataFrame) -> ParsedMetrics:
        metrics, lines = _parse_metric_lines(lines)
        printed = lines.filter(pl.col("kind") == "metric").select("line_no", printed=pl.col("c").str.extract(STEP_PREFIX, 1))
        metrics, flags, dirty_printed = _parse_dirty_lines(ctx, lines, metrics)
        printed = pl.concat([printed, dirty_printed]).sort("line_no")
        metrics, rejected = _unglue_numbers(ctx, metrics, lines)
        if rejected:
            keep = ~pl.col("line_no").is_in(rejected)
            flags, printed = flags.filter(keep), printed.filter(keep)
        return ParsedMetrics(metrics, flags, printed)

    def fallback(self, ctx: FileContext, lines: pl.DataFrame) -> int:
        return _store_tqdm_estimates(ctx, lines.filter(pl.col("kind") == "tqdm").select("line_no", "raw"))

    def zero_steps(self, ctx: FileContext, lines: pl.DataFrame) -> None:
        _note_zero_steps(ctx, lines)

    def record_meta(self, ctx: FileContext, lines: pl.DataFrame, metrics: pl.DataFrame) -> None:
        _record_meta(ctx, lines, metrics)


def _parse_metric_lines(lines: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(metrics, lines): one row per pair of every well-formed metric line, and the lines with
    kind 'dirty' set on metric lines holding a pair that is not key:value (left to Python)."""
    pairs = in_slices(lines.filter(pl.col("kind") == "metric").select("line_no", "c"), _pairs,
                       lambda part: cl.scalar_columns(part, "raw_value"))
    bad = pairs.filter(pl.col("raw_value").is_null() | (pl.col("key") == "") | (pl.col("raw_value") == ""))
    bad_lines = bad.get_column("line_no").unique()
    if len(bad_lines):
        pairs = pairs.filter(~pl.col("line_no").is_in(bad_lines.implode()))
        lines = lines.with_columns(
            kind=pl.when(pl.col("line_no").is_in(bad_lines.implode())).then(pl.lit("dirty")).otherwise(pl.col("kind")))
    schema = metric_schema()
    return pairs.select(*schema).cast(schema), lines


def _pairs(metric: pl.LazyFrame) -> pl.LazyFrame:
    """Metric lines (line_no, c) to one row per pair: line_no, step, pair_index, key, raw_value."""
    pairs = (
        metric.select(
            "line_no",
            # A step no Int64 holds is left null here; `check_steps` rejects it from its printed text.
            pl.col("c").str.extract(STEP_PREFIX, 1).cast(pl.Int64, strict=False).alias("step"),
            # A well-formed line's first piece is `step:N`: the pairs are the pieces after it.
            pl.col("c").str.split(" - ").list.slice(1).alias("pair"),
        )
        .with_columns(pl.int_ranges(1, pl.col("pair").list.len() + 1).alias("pair_index"))
        .explode("pair", "pair_index")
        .with_columns(pl.col("pair").str.splitn(":", 2).alias("kv"))
        .select(
            "line_no", "step", "pair_index",
            pl.col("kv").struct.field("field_0").str.strip_chars().alias("key"),
            pl.col("kv").struct.field("field_1").str.strip_chars().alias("raw_value"),
        )
    )
    return pairs


# A value that starts as a number and runs on into other text with no space between: another
# stream's output written into the metric line (`0.0712/home/.../distributed_c10d.py:4807: UserWarning`).
GLUED_NUMBER = r"^([-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][-+]?[0-9]+)?)(\S.*)$"
# What the rest must start with to be plainly not part of the number: a path, a Ray prefix, a word of
# three letters or more, a bracket, an ANSI escape.
NOT_OF_THE_NUMBER = r"^(?:/[\w.~\-]|\([A-Za-z_][\w.\-]* pid=|[A-Za-z_]{3,}(?:\W|$)|\[|\x1b)"


def _unglue_numbers(ctx: FileContext, metrics: pl.DataFrame, lines: pl.DataFrame) -> tuple[pl.DataFrame, list[int]]:
    """Metrics with each value that is a number glued to text (`GLUED_NUMBER`) read as its leading
    number when the rest is plainly not part of it (`NOT_OF_THE_NUMBER`, noted), and the lines
    holding any other such value rejected (`unparsable-line`, with the key and value): a number
    is never stored as a long text, nor guessed from an ambiguous one."""
    text = pl.col("text_value")
    glued = metrics.filter(pl.col("value").is_null() & text.is_not_null() & text.str.contains(GLUED_NUMBER))
    if not glued.height:
        return metrics, []
    parts = glued.select("line_no", "pair_index", "key", "text_value",
                         number=text.str.extract(GLUED_NUMBER, 1), rest=text.str.extract(GLUED_NUMBER, 2))
    plain = parts.filter(pl.col("rest").str.contains(NOT_OF_THE_NUMBER))
    ambiguous = parts.filter(~pl.col("rest").str.contains(NOT_OF_THE_NUMBER))
    rejected = ambiguous.get_column("line_no").unique().sort().to_list()
    raw = dict(lines.filter(pl.col("line_no").is_in(rejected)).select("line_no", "raw").iter_rows()) if rejected else {}
    for line_no, key, value in ambiguous.unique("line_no", keep="first", maintain_order=True).select(
            "line_no", "key", "text_value").iter_rows():
        ctx.reject(line_no, f"key {key}: value {value[:60]!r} is a number run into other text", raw.get(line_no),
                   code=ErrorCode.UNPARSABLE_LINE)
    if plain.height:
        fixed = plain.select("line_no", "pair_index", fixed=pl.col("number").cast(pl.Float64))
        metrics = metrics.join(fixed, on=["line_no", "pair_index"], how="left", maintain_order="left").with_columns(
            value=pl.coalesce("fixed", "value"),
            text_value=pl.when(pl.col("fixed").is_not_null()).then(None).otherwise(pl.col("text_value")),
            raw_value=pl.when(pl.col("fixed").is_not_null()).then(pl.col("fixed").cast(pl.String))
            .otherwise(pl.col("raw_value"))).drop("fixed")
        first = plain.row(0, named=True)
        ctx.note(f"{plain.height} value(s) glued to text that is not part of them (another stream's output): the "
                 f"leading number kept, e.g. line {first['line_no']} key {first['key']}: {first['number']} "
                 f"before {first['rest'][:40]!r}")
    if rejected:
        metrics = metrics.filter(~pl.col("line_no").is_in(rejected))
    return metrics, rejected


def _parse_dirty_lines(ctx: FileContext, lines: pl.DataFrame,
                       metrics: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The Python path: parse each dirty line, reject what cannot be parsed, flag cut lines.

    Returns the metrics with the recovered rows added, the step flags found, and the printed step
    of each recovered line.
    """
    rows: list[tuple] = []
    flags: list[tuple] = []
    printed: list[tuple] = []
    for line_no, raw_chars, cleaned, raw in lines.filter(pl.col("kind") == "dirty").select(
            "line_no", "raw_chars", "c", "raw").iter_rows():
        cut = raw_chars == WANDB_LINE_LIMIT
        parsed = parse_metric_line(cleaned, cut=cut)
        if parsed.problem:
            ctx.reject(line_no, parsed.problem, raw, code=ErrorCode.UNPARSABLE_LINE)
            continue
        printed.append((line_no, parsed.step_text))
        step = int64_step(parsed.step_text)
        for index, (key, text) in enumerate(parsed.pairs, start=1):
            value, text_value = cl.parse_scalar(text)
            rows.append((line_no, step, index, key, value, text_value, text))
        if cut:
            flags.append((line_no, step, "truncated_line",
                          f"line cut at {WANDB_LINE_LIMIT} characters; fragment dropped: {parsed.fragment[:80]!r}"))
    if rows:
        recovered = pl.DataFrame(rows, schema=metric_schema(), orient="row", strict=False)
        metrics = pl.concat([metrics, recovered]).sort("line_no", "pair_index")
    return (metrics, pl.DataFrame(flags, schema=flag_schema(), orient="row", strict=False),
            pl.DataFrame(printed, schema=printed_step_schema(), orient="row"))


def _store_tqdm_estimates(ctx: FileContext, tqdm_lines: pl.DataFrame) -> int:
    """Step times from the `Training Progress` bar when the log has no metric line.

    Per bar count n (the last update printed for it): `tqdm/elapsed_s` (the bar's elapsed time),
    `tqdm/s_per_it` (tqdm's smoothed rate) and `tqdm/step_s` = (elapsed(n) - elapsed(m)) / (n - m),
    m being the previous count seen, when there is one. Returns the lines that produced rows.
    """
    con = ctx.con
    con.register("console_tqdm", ArrowStream(tqdm_lines))
    con.execute(
        """
        CREATE OR REPLACE TEMP TABLE tqdm_updates AS
        WITH pieces AS (
            SELECT r.line_no, piece_index, piece
            FROM console_tqdm r,
                 LATERAL (SELECT unnest(range(1, len(string_split(r.raw, chr(13))) + 1)) AS piece_index,
                                 unnest(string_split(r.raw, chr(13))) AS piece)
            WHERE contains(r.raw, 'Training Progress')
        ), matched AS (
            SELECT line_no, piece_index, regexp_extract(piece, ?, ['n', 'total', 'elapsed', 'rate', 'unit']) AS m
            FROM pieces WHERE regexp_matches(piece, ?)
        ), parsed AS (
            SELECT line_no, piece_index, CAST(m.n AS BIGINT) AS n,
                   list_sum(list_transform(list_reverse(string_split(m.elapsed, ':')),
                            lambda part, i: CAST(part AS DOUBLE) * pow(60, i - 1))) AS elapsed_s,
                   CASE WHEN m.rate = '?' THEN NULL WHEN m.unit = 's/it' THEN try_cast(m.rate AS DOUBLE)
                        ELSE 1 / nullif(try_cast(m.rate AS DOUBLE), 0) END AS s_per_it
            FROM matched
        ), last_per_count AS (
            SELECT * FROM parsed QUALIFY row_number() OVER (PARTITION BY n ORDER BY line_no DESC, piece_index DESC) = 1
        )
        SELECT line_no, n AS step, elapsed_s, s_per_it,
               (elapsed_s - lag(elapsed_s) OVER w) / (n - lag(n) OVER w) AS step_s
        FROM last_per_count WINDOW w AS (ORDER BY line_no, piece_index)
        """,
        [_TQDM_PIECE, _TQDM_PIECE],
    )
    con.unregister("console_tqdm")
    con.execute("DELETE FROM tqdm_updates WHERE step = 0")
    steps = con.execute("SELECT count(*) FROM tqdm_updates").fetchall()[0][0]
    if not steps:
        return 0
    ctx.insert(
        """
        INSERT INTO step_metrics (run_id, segment, step, key, value, text_value, file_id, line_no)
        SELECT ?, 0, step, key, value, NULL, ?, line_no FROM (
            SELECT line_no, step, unnest(['tqdm/elapsed_s', 'tqdm/s_per_it', 'tqdm/step_s']) AS key,
                   unnest([elapsed_s, s_per_it, step_s]) AS value FROM tqdm_updates)
        WHERE value IS NOT NULL ORDER BY line_no, key
        """,
        [ctx.run_id, ctx.file_id],
    )
    ctx.insert(
        """
        INSERT INTO step_flags (run_id, segment, step, flag, detail, file_id, line_no)
        SELECT ?, 0, step, 'tqdm_estimate', 'no metric lines; step time from the Training Progress bar', ?, line_no
        FROM tqdm_updates ORDER BY line_no
        """,
        [ctx.run_id, ctx.file_id],
    )
    ctx.note(f"no metric lines; {steps} step times estimated from the tqdm progress bar")
    return con.execute("SELECT count(DISTINCT line_no) FROM tqdm_updates").fetchall()[0][0]


def _note_zero_steps(ctx: FileContext, lines: pl.DataFrame) -> None:
    crash = run_metadata.crash_after_last_step(lines.get_column("c").to_list())
    ending = f"; the job died before its first step: {crash}" if crash else ""
    ctx.note(f"zero steps: the log ends before step 1{ending}")


def _printed_config(lines: pl.DataFrame) -> dict:
    """Settings from the last config dict verl printed at start (`run_metadata.verl_config_from_lines`)."""
    cleaned = lines.get_column("c")
    starts = lines.with_row_index("_row").filter(
        pl.col("c").str.starts_with("{'") & pl.col("c").str.contains(run_metadata.VERL_CONFIG_START)
    ).get_column("_row")
    if not len(starts):
        return {}
    first = starts[-1]
    return run_metadata.verl_config_from_lines(cleaned.slice(first, 5000).to_list())


# The keys of a step total.
STEP_TOTALS = ("timing_s/step", "timing/step")


def _step_time_logged(ctx: FileContext, metrics: pl.DataFrame) -> dict:
    """`step_time_logged`: whether the log holds a step total (`timing_s/step`, or verl <= 0.1's
    `timing/step`). verl <= 0.1 logs `timing/<stage>` often without one; the stages are read and
    every view takes the step time as their sum, labelled "derived from stage timers"
    (`analyze.semantics`). An appended read whose lines hold none (a validation line alone) asks the
    file's stored pairs, as a whole read would see them."""
    keys = set(metrics.filter(pl.col("key").str.starts_with("timing")).get_column("key").unique().to_list())
    logged = bool(keys & set(STEP_TOTALS))
    if not logged and ctx.resume is not None:
        logged = bool(ctx.con.execute("SELECT count(*) FROM (SELECT 1 FROM step_metrics WHERE file_id = ?"
                                      " AND key IN (SELECT unnest(?)) LIMIT 1)",
                                      [ctx.file_id, list(STEP_TOTALS)]).fetchall()[0][0])
    if not logged and any(key.startswith("timing/") for key in keys):
        ctx.note("verl <= 0.1 timers (timing/*) without a step total: the step time is derived from stage timers "
                 "(their sum)")
    return {"step_time_logged": logged}


def _record_meta(ctx: FileContext, lines: pl.DataFrame, metrics: pl.DataFrame) -> None:
    # A settings line holds '=' or "':" (VERL_SETTINGS_LINE); literal tests pick those before the regex.
    candidates = (
        lines.select("c")
        .filter(pl.col("c").str.contains("=", literal=True) | pl.col("c").str.contains("':", literal=True))
        .filter(pl.col("c").str.contains(run_metadata.VERL_SETTINGS_LINE)).get_column("c")
    )
    settings = run_metadata.verl_settings(candidates.to_list())
    settings.update(_printed_config(lines))
    meta = {"framework": "verl", **settings}
    reads_a_step = lines.filter(pl.col("kind").is_in([METRIC, DIRTY])).height > 0
    if metrics.height:
        # The values whose printed text was kept: the file's first PRINTED_SAMPLE_SIZE (none in an appended
        # read of a log whose earlier lines gave them all; its class then stays the one they gave).
        sample = metrics.filter(printed_sample() & pl.col("raw_value").is_not_null()).head(PRINTED_SAMPLE_SIZE) \
            .get_column("raw_value")
        version, precision = run_metadata.verl_console_version(sample.to_list())
        meta["verl_version"] = version
        meta["value_precision"] = precision
        ctx.format_version = {"<=0.4": "verl<=0.4 (.3f values)", ">=0.5": "verl>=0.5 (repr values)"}.get(version)
        meta.update(run_metadata.gpu_meta(settings, run_metadata.n_gpus_from_throughput(ctx.con, ctx.file_id)))
        meta.update(_step_time_logged(ctx, metrics))
        meta.update(step_time_inclusion(ctx.con, ctx.run_id))
        # The lines after the last metric line (metric lines are kept without their text).
        last_metric_line = lines.filter(pl.col("kind").is_in([METRIC, DIRTY])).get_column("line_no").max()
        if last_metric_line is not None:
            lines = lines.filter(pl.col("line_no") > last_metric_line)
    else:
        meta.update(run_metadata.gpu_meta(settings, None))
    # Lines read that hold a step decide how the log ends: no error after the last one is False (a crash
    # an earlier read of a growing log saw is over), while lines without a step cannot tell (None keeps it).
    crash = run_metadata.crash_after_last_step(lines.get_column("c").to_list())
    if crash is not None or reads_a_step:
        meta["crash"] = crash if crash is not None else False
    ctx.run_meta.update(meta)
