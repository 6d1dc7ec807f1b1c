"""The steps every console format shares, and the grammar a format plugs into them.

`load_console(ctx, grammar)`:

1. read the file's lines, a block at a time (`reading.read_console_blocks`; steps 2 to 5 run
   per block);
2. clean each line (`console_lines.clean_columns`: ANSI colours, Ray prefixes, the Ray repeat
   suffix, progress-bar redraws, keeping the last carriage-return piece that starts with the
   grammar's anchor) and classify it: the grammar's `metric_kind` says 'metric' (its bulk parse
   reads it), 'dirty' (its line-by-line parse must look at it) or nothing; every other line gets
   the name of its noise rule (`grammar.noise`);
3. reject damaged text that is not a metric line (a NUL byte, bytes that are not UTF-8:
   `encoding-error`);
4. count the noise lines as ignored, under their rule names;
5. parse the metric lines (`grammar.parse`), which may reject lines and flag steps;
   check each line's step and values (`check_steps`): a step that is not a whole number
   (`type-error`) or lies outside STEP_MIN..STEP_MAX (`out-of-range`), or a value too large for
   a double, rejects its line;
6. cut segments (`segments.line_segments`: a step going back, or repeated with the same keys,
   or the first metric line after a line saying the job loaded a checkpoint, starts a new one)
   and store `step_metrics` and `step_flags`, and the steps' console clock from the times their metric
   lines start with (`clock.store_console_clock`);
7. with no metric line, let the grammar find steps elsewhere (`grammar.fallback`, e.g. progress
   bars), reclaiming the ignored lines it stored;
8. record run meta (`grammar.record_meta`).

The runner then checks `lines = stored + ignored + rejected`. Bulk steps run in polars over
slices of the file, one per polars thread (`in_slices`), so both cores of a small machine work.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import ClassVar

from polytrace_cli.errors import ErrorCode
from polytrace_cli.lazy import polars as pl

from polytrace_cli.ingest import console_lines as cl
from polytrace_cli.ingest.arrow import ArrowStream
from polytrace_cli.ingest.base import STEP_MAX, STEP_MIN, UNREAD_RECORD, FileContext, step_problem_sql, step_sql
from polytrace_cli.ingest.console.clock import stamped_lines, store_console_clock
from polytrace_cli.ingest.console.noise import CONSOLE_NOISE, NoiseRules
from polytrace_cli.ingest.console.reading import read_console_blocks, read_console_lines
from polytrace_cli.ingest.segments import insert_step_flags, line_segments, lone_line_segment
from polytrace_cli.store.sql import whole_row_groups

# Kinds of line that are not noise.
METRIC, DIRTY, ENCODING = "metric", "dirty", "encoding"


def metric_schema() -> dict:
    """Columns of the metric pairs a console grammar yields (step: the step when printed as an
    integer, else null, until `check_steps` sets it; raw_value: the printed value text)."""
    return {"line_no": pl.Int64, "step": pl.Int64, "pair_index": pl.Int64, "key": pl.String,
            "value": pl.Float64, "text_value": pl.String, "raw_value": pl.String}


def printed_step_schema() -> dict:
    """Columns of the steps as printed: one row per line holding pairs or flags."""
    return {"line_no": pl.Int64, "printed": pl.String}


def flag_schema() -> dict:
    """Columns of the step flags a console grammar yields (step as in `metric_schema`)."""
    return {"line_no": pl.Int64, "step": pl.Int64, "flag": pl.String, "detail": pl.String}


@dataclass
class ParsedMetrics:
    """What a grammar read from its metric lines: pairs (`metric_schema`, in line and pair order),
    step flags (`flag_schema`) and the step text of each of their lines (`printed_step_schema`),
    which `check_steps` reads. Each line holding at least one pair counts as stored."""

    metrics: pl.DataFrame
    flags: pl.DataFrame
    printed: pl.DataFrame

    @classmethod
    def from_rows(cls, metrics: list[tuple], flags: list[tuple] = ()) -> ParsedMetrics:
        """From row tuples in the order of `metric_schema` and `flag_schema`, each step given as
        printed (text) or as an int."""
        printed: dict[int, str] = {}
        for rows in (metrics, flags):
            for row in rows:
                printed.setdefault(row[0], str(row[1]))

        def integer_steps(rows):
            return [(row[0], int64_step(row[1]), *row[2:]) for row in rows]

        return cls(pl.DataFrame(integer_steps(metrics), schema=metric_schema(), orient="row", strict=False),
                   pl.DataFrame(integer_steps(flags), schema=flag_schema(), orient="row"),
                   pl.DataFrame(list(printed.items()), schema=printed_step_schema(), orient="row"))


def int64_step(step: int | str) -> int | None:
    """The step when written as an integer that an Int64 holds, else None."""
    try:
        number = int(step)
    except ValueError:
        return None
    return number if -(2**63) <= number < 2**63 else None


class ConsoleGrammar:
    """How one console format's metric lines look and parse; the pipeline does the rest.

    Set `anchor` (the text a metric line starts with once cleaned, used to pick the piece of a line
    redrawn by carriage returns; not empty, no ESC, not starting with a space or '('), `noise` (the
    rules non-metric lines are counted under) and `reclaimable` (the noise rule whose lines
    `fallback` may turn into steps); implement `metric_kind` and `parse`.
    """

    anchor: ClassVar[str]
    noise: ClassVar[NoiseRules] = CONSOLE_NOISE
    reclaimable: ClassVar[str | None] = None
    # How many leading pairs with a finite number (`printed_sample`) `record_meta` reads the printed
    # text (`raw_value`) of, counted from the file's first line over the reads of a growing log; None:
    # all. The pipeline keeps no other printed text once steps are checked.
    printed_values_read: ClassVar[int | None] = None
    # Run meta keys `record_meta` computes from the rows stored for the whole file or run (not from
    # the lines it is given): an appended read gives them as a whole read would, so they may change.
    recomputed_meta: ClassVar[frozenset[str]] = frozenset()
    # True for a grammar whose parse needs the whole log at once (TRL numbers its dicts from the
    # progress bars and stages of the whole log): the log is then read as one block. Such a grammar
    # follows a grown log only with the state its `follow_state` keeps.
    whole_log: ClassVar[bool] = False
    # A regex over a raw line that marks text of a metric record (None: no check). A line it matches
    # that is not read as a metric line is ignored under UNREAD_RECORD, never under a noise rule.
    record_hint: ClassVar[str | None] = None

    def metric_kind(self, cleaned: pl.Expr, raw_chars: pl.Expr) -> pl.Expr:
        """Per line, from its cleaned text and the raw line's length in characters (without a final
        carriage return): 'metric', 'dirty' or null (a noise line)."""
        raise NotImplementedError

    def parse(self, ctx: FileContext, lines: pl.DataFrame) -> ParsedMetrics:
        """Pairs and flags of the metric lines. `lines` has line_no, raw, raw_chars, c (cleaned)
        and kind for every line; reject (ctx.reject, code `unparsable-line`) each metric or dirty
        line that cannot be read, including one whose step is not a number. Give each line's step
        as printed in `ParsedMetrics.printed` (`from_rows` does it from the rows); the pipeline
        checks that it is a whole number in range (`check_steps`).
        A line that is neither stored nor rejected must be counted with ctx.ignore."""
        raise NotImplementedError

    def fallback(self, ctx: FileContext, lines: pl.DataFrame) -> int:
        """Steps from elsewhere when the log has no metric line (stored with `store_parsed` or by
        the grammar itself); returns the lines that produced rows, all of rule `reclaimable`."""
        return 0

    def zero_steps(self, ctx: FileContext, lines: pl.DataFrame) -> None:
        """Note a log that yields no step at all."""
        ctx.note("zero steps: no metric lines")

    def record_meta(self, ctx: FileContext, lines: pl.DataFrame, metrics: pl.DataFrame) -> None:
        """Fill ctx.run_meta (and ctx.format_version) from the lines (metric lines without their
        text) and a digest of the stored pairs: the first pair of each key and the first
        `printed_values_read` pairs of `printed_sample` with their printed text, in line order."""

    def follow_state(self) -> dict | None:
        """What the grammar itself needs to read the lines appended to the log after this read as a
        whole read would (kept in the file's resume state, given back in `ctx.resume`), or None when
        they cannot be read on their own (the next read of the grown log is then whole)."""
        return {}


def load_console(ctx: FileContext, grammar: ConsoleGrammar) -> None:
    """Read ctx.path with `grammar` into the store, accounting for every line (see the module).

    Steps 1 to 6 run on one block of lines at a time (`reading.read_console_blocks`), so neither the
    file's text nor its pairs are ever held whole: each block's pairs are stored in their segments
    (`BlockWriter`) before the next block is read; its metric lines lose their text, the other lines
    are kept for the steps that read the whole log (run meta, the fallback).

    An appended read (ctx.resume set) numbers its lines after ctx.line_offset and cuts segments on
    from the last metric line stored before (`resume_segments_state`), as one more block would; the
    fallback and the zero-step note belong to a whole read, since an appended read only follows a
    log that had metric lines.
    """
    ctx.lines = 0
    kept, stamps, resumes = [], [], list(ctx.resume["resumes_after"]) if ctx.resume is not None else []
    writer = BlockWriter(ctx, grammar.printed_values_read, ctx.resume)
    whole = ctx.path.stat().st_size + 1 if grammar.whole_log else None
    for block in read_console_blocks(ctx.path, whole):
        if ctx.line_offset:
            block = block.with_columns(pl.col("line_no") + ctx.line_offset)
        lines = classify(block, grammar)
        ctx.lines += lines.height
        lines = _reject_bad_text(ctx, lines)
        noise = lines.filter(~pl.col("kind").is_in([METRIC, DIRTY, ENCODING])).group_by("kind").len()
        for rule, count in noise.sort("kind").iter_rows():
            ctx.ignore(rule, count)
        resumes.extend(resume_lines(lines))
        stamps.append(stamped_lines(lines))
        writer.write(check_steps(ctx, grammar.parse(ctx, lines), lines), resumes)
        parsed_text = pl.col("kind").is_in([METRIC, DIRTY])
        kept.append(_detached(lines.with_columns(raw=pl.when(parsed_text).then(pl.lit("")).otherwise(pl.col("raw")),
                                                 c=pl.when(parsed_text).then(pl.lit("")).otherwise(pl.col("c")))))
        del lines, block
    lines = pl.concat(kept) if len(kept) > 1 else kept[0]
    del kept
    ctx.stored = writer.finish()
    store_console_clock(ctx, pl.concat(stamps))
    from_metrics = bool(ctx.stored) or ctx.resume is not None
    if not ctx.stored and ctx.resume is None:
        # No pairs: the whole log is small enough to read again, with the text of its metric lines.
        lines = _mark_bad_text(classify(read_console_lines(ctx.path), grammar))
        ctx.stored = grammar.fallback(ctx, lines)
        _reclaim(ctx, grammar.reclaimable, ctx.stored)
        if not ctx.stored:
            grammar.zero_steps(ctx, lines)
    metrics = writer.digest()
    if ctx.resume is not None and not metrics.height:
        # No new pairs: the facts a whole read takes from the pairs stay those of the last metric line
        # (its keys; the printed value texts are not stored, so they decide nothing here).
        metrics = _stored_line(ctx, ctx.resume["last_line"]).select(metrics.columns).with_columns(
            value=pl.lit(None, dtype=pl.Float64))
    grammar.record_meta(ctx, lines, metrics)
    follow = grammar.follow_state() if from_metrics else None
    if follow is not None:
        ctx.resume_state = {**resume_segments_state(writer.last_line_no, resumes),
                            "recomputed_meta": sorted(grammar.recomputed_meta), "printed_sampled": writer.sampled,
                            **follow}


def resume_segments_state(last_line: int, resumes: list[int]) -> dict:
    """What an appended read needs to cut segments as a whole read would: the last metric line
    (`last_line`, whose stored pairs give its step, keys and segment) and the checkpoint loads after
    it (`resumes_after`; `resumes`: every checkpoint load read so far)."""
    return {"last_line": last_line, "resumes_after": [line for line in resumes if line > last_line]}


class BlockWriter:
    """Stores the checked pairs of a log block by block, as `store_parsed` stores them all at once.

    A line's segment depends only on the metric line before it (`segments.line_segments`): each
    block is cut into segments together with the last metric line of the block before (and its
    pairs), numbered on from that line's segment. The segments of every line (one row per metric
    line) and the flags are kept, and the step flags written at the end. What `record_meta` reads
    of the pairs is kept too (`digest`).

    In an appended read, `previous` (the resume state the last read left) names the last metric line
    stored before: its stored pairs and segment are the block before the first one, and only the
    flags of later lines are written. Its `printed_sampled` (the printed texts kept so far) goes on,
    so that the texts kept are those of the file's first pairs, as in one read of the whole log.
    """

    def __init__(self, ctx: FileContext, printed_values_read: int | None, previous: dict | None = None):
        self.ctx = ctx
        self.printed_values_read = printed_values_read
        # Pairs of `printed_sample` whose printed text was kept, counted from the file's first line:
        # once the grammar's `printed_values_read` are reached, later reads keep none.
        self.sampled = previous.get("printed_sampled", 0) if previous is not None else 0
        self.segments: list[pl.DataFrame] = []
        self.flags: list[pl.DataFrame] = []
        self.digests: list[pl.DataFrame] = []
        self.last_line = None  # the pairs of the last metric line written, and its segment
        self.seed_line = None  # the last metric line stored before an appended read
        if previous is not None:
            seed = _stored_line(ctx, previous["last_line"])
            segment = seed.get_column("segment")[0]
            pairs = seed.select(list(metric_schema()))
            self.seed_line = previous["last_line"]
            self.last_line = (pairs, segment)
            self.segments.append(lone_line_segment(self.seed_line, pairs.get_column("step")[0], segment))

    @property
    def last_line_no(self) -> int | None:
        """The last metric line written (or stored before an appended read), None before any."""
        return None if self.last_line is None else self.last_line[0].get_column("line_no")[0]

    def write(self, parsed: ParsedMetrics, resumes: list[int]) -> None:
        """Store one block's pairs (`check_steps` done; `resumes`: every checkpoint-load line so far)."""
        if self.printed_values_read is not None:
            parsed, kept = _drop_printed_text(parsed, self.printed_values_read - self.sampled)
            self.sampled += kept
        self.flags.append(parsed.flags)
        metrics = parsed.metrics
        if not metrics.height:
            return
        before, offset = (self.last_line if self.last_line is not None
                          else (metrics.clear(), 0))
        segments = line_segments(pl.concat([before, metrics], how="vertical_relaxed"), resumes)
        if before.height:
            segments = segments.slice(1)
        segments = segments.with_columns(pl.col("segment") + offset)
        self.segments.append(segments)
        last = segments.get_column("line_no")[-1]
        self.last_line = (_detached(metrics.filter(pl.col("line_no") == last)), segments.get_column("segment")[-1])
        metrics = metrics.with_columns(segment=pl.col("line_no").replace_strict(
            segments.get_column("line_no"), segments.get_column("segment"), default=None, return_dtype=pl.Int32))
        con = self.ctx.con
        con.register("console_metrics", ArrowStream(metrics))
        try:
            with whole_row_groups(con, metrics.height):
                self.ctx.insert(
                    """
                    INSERT INTO step_metrics (run_id, segment, step, key, value, text_value, file_id, line_no)
                    SELECT ?, segment, step, key, value, text_value, ?, line_no FROM console_metrics
                    """,
                    [self.ctx.run_id, self.ctx.file_id],
                )
        finally:
            con.unregister("console_metrics")
        self.digests.append(_detached(metrics.drop("segment").filter(
            pl.col("raw_value").is_not_null() | pl.col("key").is_first_distinct())))

    def finish(self) -> int:
        """Write the step flags; return the number of lines that produced pairs."""
        seeded = self.seed_line is not None
        if len(self.segments) == seeded:
            return 0
        segments = pl.concat(self.segments, how="vertical_relaxed")
        flags = pl.concat(self.flags)
        if not flags.height and segments.get_column("segment").n_unique() == 1 \
                and (seeded or segments.get_column("step")[0] <= 1):
            # One segment, no grammar flag, and no `resumed` flag to write: `insert_step_flags` would
            # write nothing.
            return segments.height - seeded
        con = self.ctx.con
        con.register("console_segments", ArrowStream(segments))
        con.register("console_flags", ArrowStream(flags))
        try:
            insert_step_flags(self.ctx, "console_segments", extra_flags="console_flags", after_line=self.seed_line)
        finally:
            for view in ("console_segments", "console_flags"):
                con.unregister(view)
        return segments.height - seeded

    def digest(self) -> pl.DataFrame:
        """Of the stored pairs (`metric_schema`, in line and pair order): the first pair of each key
        and the pairs whose printed text was kept (see `ConsoleGrammar.printed_values_read`)."""
        if not self.digests:
            return pl.DataFrame(schema=metric_schema())
        pairs = pl.concat(self.digests)
        return pairs.filter(pl.col("raw_value").is_not_null() | pl.col("key").is_first_distinct())


def _detached(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` with its text columns copied: rows filtered out of a block still point into the
    block's text buffers, which would stay in memory as long as any of them is kept."""
    return frame.with_columns(pl.concat_str([pl.col(name), pl.lit("")]).alias(name)
                              for name, dtype in frame.schema.items() if dtype == pl.String)


def printed_sample() -> pl.Expr:
    """The pairs whose printed text tells how values were printed: a finite number, no text value."""
    return pl.col("value").is_not_null() & pl.col("text_value").is_null() & pl.col("value").is_finite()


def _drop_printed_text(parsed: ParsedMetrics, wanted: int) -> tuple[ParsedMetrics, int]:
    """`parsed` keeping the printed text of its first `wanted` pairs of `printed_sample` only, and
    how many it kept."""
    wanted = max(wanted, 0)
    sample = printed_sample()
    keep = sample & (sample.cast(pl.Int64).cum_sum() <= wanted)
    metrics = parsed.metrics.with_columns(raw_value=pl.when(keep).then(pl.col("raw_value")))
    kept = min(wanted, parsed.metrics.select(sample.sum()).item())
    return ParsedMetrics(metrics, parsed.flags, parsed.printed), kept


def check_steps(ctx: FileContext, parsed: ParsedMetrics, lines: pl.DataFrame) -> ParsedMetrics:
    """`parsed` with its steps checked, without the lines rejected for their step or a value.

    A step is read by `base.step_sql`, the rule of every format: a whole number (`3`, `3.0`,
    `3e0`) within STEP_MIN..STEP_MAX, never rounded or wrapped; otherwise the line is rejected as
    `type-error` (not a whole number) or `out-of-range`. A value parsed as ±inf from a printed
    number that is not an infinity (`1e400`) is out of range for a double: its line is rejected
    as `out-of-range` rather than stored as a false infinity. `lines` (line_no, raw) gives the
    rejected lines' text. The checks read one printed step per line; the pairs are only rewritten
    when some line is rejected or was not printed as its integer step (`3.0`).
    """
    metrics, flags = parsed.metrics, parsed.flags
    schema = {"line_no": pl.Int64, "printed": pl.String, "step": pl.Int64, "code": pl.String}
    if parsed.printed.select(pl.col("printed").str.contains(CANONICAL_STEP).fill_null(False).all()).item():
        # Every step printed as an integer in its shortest form, well within range: the step is the
        # integer the text names, and `step_sql` need not be asked.
        steps = parsed.printed.sort("line_no").select("line_no", "printed", step=pl.col("printed").cast(pl.Int64),
                                                      code=pl.lit(None, pl.String))
    else:
        con = ctx.con
        con.register("console_printed_steps", ArrowStream(parsed.printed))
        try:
            rows = con.execute(
                f"SELECT line_no, printed, {step_sql('printed')} AS step, {step_problem_sql('printed')} AS code"
                " FROM console_printed_steps ORDER BY line_no"
            ).fetchall()
        finally:
            con.unregister("console_printed_steps")
        steps = pl.DataFrame(rows, schema=schema, orient="row")
    bad_steps = steps.filter(pl.col("step").is_null())
    overflow = metrics.filter(pl.col("value").is_infinite() & pl.col("raw_value").is_not_null()
                              & ~pl.col("raw_value").str.contains("(?i)inf"))
    overflow = overflow.filter(~pl.col("line_no").is_in(bad_steps.get_column("line_no").implode()))
    overflow = overflow.unique("line_no", keep="first", maintain_order=True)
    if not bad_steps.height and not overflow.height:
        return ParsedMetrics(_with_steps(metrics, steps), _with_steps(flags, steps), parsed.printed)
    problems = pl.concat([
        bad_steps.select("line_no", reason=pl.when(pl.col("code") == ErrorCode.OUT_OF_RANGE)
                         .then(pl.format("step {} is out of range ({}..{})", "printed", pl.lit(STEP_MIN), pl.lit(STEP_MAX)))
                         .otherwise(pl.format("step {} is not a whole number", "printed")), code=pl.col("code")),
        overflow.select("line_no", reason=pl.format("key {}: value {} is out of range for a double", "key", "raw_value"),
                        code=pl.lit(ErrorCode.OUT_OF_RANGE)),
    ]).sort("line_no").join(lines.select("line_no", "raw"), on="line_no", how="left", maintain_order="left")
    for line_no, reason, code, raw in problems.select("line_no", "reason", "code", "raw").iter_rows():
        ctx.reject(line_no, reason, raw, code=code)
    rejected = problems.get_column("line_no").implode()
    kept = ~pl.col("line_no").is_in(rejected)
    return ParsedMetrics(_with_steps(metrics.filter(kept), steps), _with_steps(flags.filter(kept), steps),
                         parsed.printed.filter(kept))


# A step printed as an integer in its shortest form (no sign but a minus, no leading zero) of at most
# nine digits: a whole number within STEP_MIN..STEP_MAX, which `step_sql` reads as that integer.
CANONICAL_STEP = r"^(?:0|-?[1-9][0-9]{0,8})$"


def _with_steps(frame: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """`frame` with the checked step of each line (unchanged when every step was printed as its
    integer, the grammar's step then being that integer)."""
    if steps.select((pl.col("printed") == pl.col("step").cast(pl.String)).all()).item():
        return frame
    checked = steps.select("line_no", "step")
    return frame.drop("step").join(checked, on="line_no", how="left", maintain_order="left").select(frame.columns)


def resume_lines(lines: pl.DataFrame) -> list[int]:
    """The numbers of the lines (classified by `classify`) saying the job loaded a checkpoint."""
    return lines.filter(pl.col("kind") == cl.CHECKPOINT_LOAD).get_column("line_no").to_list()


def store_parsed(ctx: FileContext, parsed: ParsedMetrics, resumes: list[int] = ()) -> int:
    """Write the pairs (each in its line's segment) and flags of `parsed` with the `restart` and
    `resumed` flags of its segments (steps checked by `check_steps`; `resumes`: the lines saying
    the job loaded a checkpoint); returns the number of lines that produced pairs."""
    metrics = parsed.metrics
    if not metrics.height:
        return 0
    segments = line_segments(metrics, resumes)
    # A column looked up by line, not a join: the pairs' other columns are shared, not copied.
    metrics = metrics.with_columns(segment=pl.col("line_no").replace_strict(
        segments.get_column("line_no"), segments.get_column("segment"), default=None, return_dtype=pl.Int32))
    con = ctx.con
    con.register("console_metrics", ArrowStream(metrics))
    con.register("console_segments", ArrowStream(segments))
    con.register("console_flags", ArrowStream(parsed.flags))
    try:
        with whole_row_groups(con, metrics.height):
            ctx.insert(
                """
                INSERT INTO step_metrics (run_id, segment, step, key, value, text_value, file_id, line_no)
                SELECT ?, segment, step, key, value, text_value, ?, line_no FROM console_metrics
                """,
                [ctx.run_id, ctx.file_id],
            )
        insert_step_flags(ctx, "console_segments", extra_flags="console_flags")
    finally:
        for view in ("console_metrics", "console_segments", "console_flags"):
            con.unregister(view)
    return segments.height


def _stored_line(ctx: FileContext, line_no: int) -> pl.DataFrame:
    """The pairs a metric line stored (`metric_schema` columns and its segment), read back from the store."""
    rows = ctx.con.execute(
        "SELECT line_no, step, key, value, text_value, segment FROM step_metrics WHERE file_id = ? AND line_no = ?",
        [ctx.file_id, line_no]).fetchall()
    if not rows:
        raise RuntimeError(f"line {line_no} of {ctx.path} is not in the store")
    frame = pl.DataFrame(rows, schema={"line_no": pl.Int64, "step": pl.Int64, "key": pl.String, "value": pl.Float64,
                                       "text_value": pl.String, "segment": pl.Int64}, orient="row")
    return frame.with_columns(pair_index=pl.int_range(1, frame.height + 1, dtype=pl.Int64),
                              raw_value=pl.lit(None, dtype=pl.String))


def classify(lines: pl.DataFrame, grammar: ConsoleGrammar) -> pl.DataFrame:
    """Adds raw_chars, c (the cleaned line) and kind: 'metric', 'dirty' or a noise rule name."""
    return in_slices(lines, lambda part: _classify_slice(part, grammar))


def _classify_slice(lines: pl.LazyFrame, grammar: ConsoleGrammar) -> pl.LazyFrame:
    lines = cl.clean_columns(lines, "raw", "c", grammar.anchor).with_columns(
        # Only lines ending in CR pay for a stripped copy.
        raw_chars=pl.coalesce(pl.when(pl.col("raw").str.ends_with("\r")).then(pl.col("raw")).str.strip_chars_end("\r"),
                              pl.col("raw")).str.len_chars(),
    )
    # A line the grammar does not read as it is may be a metric line behind a printed time (a logging
    # prefix, `kubectl logs --timestamps`): it is read without the time. Every metric line keeps the
    # time it starts with in `stamp` (the step clock of `clock.store_console_clock`).
    stamp = pl.col("_stamp")
    lines = (
        lines.with_columns(_stamp=pl.col("c").str.extract(cl.STAMP_PREFIX_PATTERN, 0))
        .with_columns(_kind=grammar.metric_kind(pl.col("c"), pl.col("raw_chars")))
        .with_columns(_untimed=pl.when(pl.col("_kind").is_null() & stamp.is_not_null())
                      .then(cl.strip_stamp_expr(pl.col("c"), stamp)))
        .with_columns(_timed_kind=pl.when(pl.col("_untimed").is_not_null())
                      .then(grammar.metric_kind(pl.col("_untimed"), pl.col("raw_chars"))))
        .with_columns(c=pl.when(pl.col("_timed_kind").is_not_null()).then(pl.col("_untimed")).otherwise(pl.col("c")),
                      _kind=pl.coalesce(pl.col("_kind"), pl.col("_timed_kind")))
        .with_columns(stamp=pl.when(pl.col("_kind").is_not_null()).then(stamp))
    )
    # Noise rules only read non-metric lines: metric lines (most of the bytes) are blanked for them
    # in a column of their own first (inside one expression the blanking is redone per rule).
    return (
        lines.with_columns(_n=pl.when(pl.col("_kind").is_not_null()).then(pl.lit("")).otherwise(pl.col("c")))
        .with_columns(kind=pl.coalesce(pl.col("_kind"), _unread_record(grammar), grammar.noise.expr(pl.col("_n"), pl.col("raw"))))
        .drop("_kind", "_n", "_stamp", "_untimed", "_timed_kind")
    )


def _unread_record(grammar: ConsoleGrammar) -> pl.Expr:
    """UNREAD_RECORD on the lines that are not metric lines and match the grammar's `record_hint`."""
    if grammar.record_hint is None:
        return pl.lit(None, pl.String)
    return pl.when(pl.col("_kind").is_null() & pl.col("raw").str.contains(grammar.record_hint)).then(
        pl.lit(UNREAD_RECORD))


def _reject_bad_text(ctx: FileContext, lines: pl.DataFrame) -> pl.DataFrame:
    """Reject the damaged lines (`encoding` column of `read_console_lines`) that are not metric
    lines (their kind becomes 'encoding'); metric lines go on to be parsed."""
    if "encoding" not in lines.columns:
        return lines
    bad = pl.col("encoding").is_not_null() & ~pl.col("kind").is_in([METRIC, DIRTY])
    for line_no, reason, raw in lines.filter(bad).select("line_no", "encoding", "raw").iter_rows():
        ctx.reject(line_no, reason, raw, code=ErrorCode.ENCODING_ERROR)
    return _mark_bad_text(lines)


def _mark_bad_text(lines: pl.DataFrame) -> pl.DataFrame:
    """`lines` with the kind 'encoding' on the damaged lines that are not metric lines (those
    `_reject_bad_text` rejects), without the `encoding` column."""
    if "encoding" not in lines.columns:
        return lines
    bad = pl.col("encoding").is_not_null() & ~pl.col("kind").is_in([METRIC, DIRTY])
    return lines.with_columns(kind=pl.when(bad).then(pl.lit(ENCODING)).otherwise(pl.col("kind"))).drop("encoding")


def _reclaim(ctx: FileContext, rule: str | None, count: int) -> None:
    """Take `count` lines back from the ignored lines of `rule`: they produced rows."""
    if not count or rule is None:
        return
    ctx.ignored[rule] -= count
    if not ctx.ignored[rule]:
        del ctx.ignored[rule]


def in_slices(frame: pl.DataFrame, build, then=None) -> pl.DataFrame:
    """`build` (a LazyFrame -> LazyFrame step) over `frame` cut into one slice of rows per polars
    thread, each slice computed and then passed to `then` (an eager DataFrame -> DataFrame step)
    in a Python thread of its own (polars releases the GIL while it works), the results
    concatenated in order. One string expression over one column runs on one thread; slices let
    both cores of a small machine work on it without waiting for each other between steps."""
    slices = max(1, min(pl.thread_pool_size(), frame.height // 1000))
    size = -(-frame.height // slices) if frame.height else 1
    starts = range(0, max(frame.height, 1), size)

    def one(start: int) -> pl.DataFrame:
        part = build(frame.lazy().slice(start, size)).collect()
        return then(part) if then is not None else part

    if len(starts) == 1:
        return one(0)
    with ThreadPoolExecutor(max_workers=len(starts)) as pool:
        return pl.concat(list(pool.map(one, starts)))
