"""verl console log: the trainer's stdout (or wandb's `files/output.log`), one metric line per step.

    step:{N} - {key}:{value} - {key}:{value} - ...

How a file is read (FORMATS.md, section 1):

- Bulk path, in DuckDB: the whole file is split into numbered lines; each line is cleaned (ANSI
  codes, carriage returns, Ray prefix and repeat suffix; `console_lines.clean_line_sql`); a
  cleaned line starting with `step:` is a metric line, split on " - " and then on the first ":";
  values are unwrapped (`np.float64(..)`) and cast, non-numbers kept as text.
- Dirty lines go to Python one by one: metric lines with a pair that is not `key:value`, a step
  that is not an integer, or exactly `WANDB_LINE_LIMIT` characters (wandb's console capture cuts
  lines there: the complete pairs are kept, the last piece is dropped as a fragment since it may
  be cut, and the step is flagged `truncated_line`). Lines that still do not parse are rejected.
- Every other line is ignored under a named rule (`console_lines.NOISE_RULES`, plus `ray-log` for
  other lines a Ray actor printed).
- A step lower than or equal to the previous one starts a new segment (a restarted job in the
  same file), flagged `restart`; a log whose first step is above 1 is flagged `resumed`.
- With no metric line at all, the `Training Progress` tqdm bar is the fallback source of step
  times (`tqdm/elapsed_s`, `tqdm/s_per_it`, `tqdm/step_s`, flag `tqdm_estimate`); with neither,
  the run has zero steps and a note says how the log ends.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa

from polytrace_cli.ingest import console_lines as cl
from polytrace_cli.ingest import run_metadata
from polytrace_cli.ingest.base import FileContext, Ingester
from polytrace_cli.ingest.registry import register

WANDB_LINE_LIMIT = 4096
METRIC_LINE = re.compile(r"^step:(-?\d+)(?: - (.*))?$", re.DOTALL)
_SNIFF_METRIC = re.compile(r"^step:\d+ - [^:\s][^:]*:\S")
# A training job's stdout recognised by its head when the first metric line lies beyond it.
_VERL_HEAD_MARKERS = (b"(TaskRunner pid=", b"(main_task pid=", b"actor_rollout_ref.", b"verl.trainer", b"from verl")
_FOREIGN_HEAD_MARKERS = (b"Global step", b"openrlhf", b"OpenRLHF")
_TQDM_PIECE = (r"Training Progress:\s*\d+%.*?(\d+)/(\d+) \[((?:\d+:)?\d+:\d+)<[^,\]]*,\s*"
               r"([\d.]+|\?)\s*(s/it|it/s)")


@dataclass
class MetricLine:
    """A metric line parsed in Python: its step, (key, value text) pairs, and what went wrong."""

    step: int | None
    pairs: list[tuple[str, str]] = field(default_factory=list)
    fragment: str | None = None
    problem: str | None = None


def parse_metric_line(cleaned: str, cut: bool = False) -> MetricLine:
    """Parse one cleaned `step:N - key:value - ...` line.

    When `cut` (the line was cut at wandb's limit), the last piece is a fragment: it is returned
    in `fragment`, not in `pairs`, whether or not it looks complete. Otherwise any piece that is not
    `key:value` with a non-empty key and value makes the line a `problem`.
    """
    match = METRIC_LINE.match(cleaned)
    if not match:
        head = cleaned.split(" - ", 1)[0]
        return MetricLine(None, problem=f"metric line with a bad step field {head[:40]!r}")
    step = int(match.group(1))
    body = match.group(2)
    if not body:
        return MetricLine(step, problem="metric line without key:value pairs")
    pieces = body.split(" - ")
    parsed = MetricLine(step)
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

    Either a cleaned line within it is a `step:N - key:value` metric line, or it carries verl's own
    markers (a Ray `TaskRunner`/`main_task` actor, `actor_rollout_ref.` overrides, verl imports)
    and none of another framework's.
    """
    text = head.decode("utf-8", errors="replace")
    for line in text.split("\n"):
        if "step:" in line and _SNIFF_METRIC.match(cl.clean_line(line)):
            return "metric line"
    if any(marker in head for marker in _VERL_HEAD_MARKERS) and not any(m in head for m in _FOREIGN_HEAD_MARKERS):
        return "verl markers in the head"
    return None


@register
class VerlConsoleIngester(Ingester):
    name = "verl-console"
    version = "1"
    framework = "verl"
    description = "verl console log / wandb output.log (`step:N - key:value - ...` lines)"

    def sniff(self, path: Path, head: bytes) -> bool:
        if b"\x00" in head[:4096]:
            return False
        if b"step:" in head and looks_like_verl_console(head) == "metric line":
            return True
        # The first metric line may lie beyond the sniff window in a long job's stdout.
        return path.suffix in (".log", ".txt", ".out") and looks_like_verl_console(head) is not None

    def load(self, ctx: FileContext) -> None:
        con = ctx.con
        _read_lines(ctx)
        _classify_lines(con)
        ctx.lines = con.execute("SELECT count(*) FROM console_lines").fetchall()[0][0]
        _ignore_noise(ctx)
        _parse_clean_metric_lines(con)
        _parse_dirty_lines(ctx)
        metric_lines = con.execute("SELECT count(DISTINCT line_no) FROM console_metrics").fetchall()[0][0]
        ctx.stored = metric_lines
        tqdm_total = con.execute("SELECT count(*) FROM console_lines WHERE kind = 'tqdm'").fetchall()[0][0]
        if metric_lines:
            _store_metrics(ctx)
            ctx.ignore("tqdm", tqdm_total)
        else:
            tqdm_lines = _store_tqdm_estimates(ctx)
            ctx.stored = tqdm_lines
            ctx.ignore("tqdm", tqdm_total - tqdm_lines)
            if not tqdm_lines:
                _note_zero_steps(ctx)
        _record_meta(ctx, metric_lines)
        ctx.con.execute("DROP TABLE IF EXISTS console_raw")


def _read_lines(ctx: FileContext) -> None:
    """Temp table console_raw(line_no, raw): the file's lines, numbered from 1."""
    con = ctx.con
    try:
        con.execute(
            """
            CREATE OR REPLACE TEMP TABLE console_raw AS
            WITH doc AS (SELECT string_split(content, chr(10)) AS parts FROM read_text(?))
            SELECT unnest(range(1, len(parts) + 1)) AS line_no, unnest(parts) AS raw FROM doc
            """,
            [str(ctx.path)],
        )
    except duckdb.Error:
        # Not valid UTF-8: decode in Python, replacing bad bytes, and number the same lines.
        text = ctx.path.read_bytes().decode("utf-8", errors="replace")
        parts = text.split("\n")
        table = pa.table({"line_no": pa.array(range(1, len(parts) + 1), pa.int64()), "raw": pa.array(parts)})
        con.register("_console_decoded", table)
        try:
            con.execute("CREATE OR REPLACE TEMP TABLE console_raw AS SELECT * FROM _console_decoded")
        finally:
            con.unregister("_console_decoded")
    # A final newline ends the last line; it does not start another one.
    con.execute("DELETE FROM console_raw WHERE raw = '' AND line_no = (SELECT max(line_no) FROM console_raw)")


def _classify_lines(con: duckdb.DuckDBPyConnection) -> None:
    """Temp table console_lines(line_no, raw_chars, c, kind): kind is 'metric', 'dirty' or a noise rule."""
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE console_lines AS
        WITH cleaned AS (
            SELECT line_no, length(rtrim(raw, chr(13))) AS raw_chars, {cl.clean_line_sql('raw')} AS c,
                   regexp_matches(raw, ?) AS ray
            FROM console_raw
        )
        SELECT line_no, raw_chars, c,
               CASE WHEN starts_with(c, 'step:') THEN
                        CASE WHEN raw_chars = {WANDB_LINE_LIMIT} OR NOT regexp_matches(c, ?) THEN 'dirty'
                             ELSE 'metric' END
                    ELSE CASE WHEN ray AND {cl.classify_noise_sql('c')} = 'other' THEN 'ray-log'
                              ELSE {cl.classify_noise_sql('c')} END
               END AS kind
        FROM cleaned
        """,
        [r"^\s*(?:\x1b\[[0-9;]*m)*\s*\([A-Za-z_][\w.\-]* pid=\d+", r"^step:-?\d+ - \S"],
    )


def _ignore_noise(ctx: FileContext) -> None:
    # tqdm lines are counted later: with no metric line they are the fallback source of steps.
    for rule, count in ctx.con.execute(
        "SELECT kind, count(*) FROM console_lines WHERE kind NOT IN ('metric', 'dirty', 'tqdm') GROUP BY kind"
    ).fetchall():
        ctx.ignore(rule, count)


def _parse_clean_metric_lines(con: duckdb.DuckDBPyConnection) -> None:
    """console_metrics(line_no, step, key, value, text_value, raw_value) from well-formed metric lines.

    A line with any malformed pair is moved to kind 'dirty' for the Python path.
    """
    con.execute(
        """
        CREATE OR REPLACE TEMP TABLE console_pairs AS
        SELECT line_no, step, pair_index, pair, position(':' IN pair) AS colon
        FROM (
            SELECT line_no, CAST(regexp_extract(c, '^step:(-?\\d+)', 1) AS BIGINT) AS step,
                   string_split(c[position(' - ' IN c) + 3:], ' - ') AS pieces
            FROM console_lines WHERE kind = 'metric'
        ), LATERAL (SELECT unnest(range(1, len(pieces) + 1)) AS pair_index, unnest(pieces) AS pair)
        """
    )
    con.execute(
        """
        UPDATE console_lines SET kind = 'dirty' WHERE line_no IN (
            SELECT DISTINCT line_no FROM console_pairs
            WHERE colon = 0 OR trim(pair[:colon - 1]) = '' OR trim(pair[colon + 1:]) = '')
        """
    )
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE console_metrics AS
        SELECT p.line_no, p.step, p.pair_index, trim(pair[:colon - 1]) AS key,
               {cl.scalar_value_sql('pair[colon + 1:]')} AS value,
               {cl.scalar_text_sql('pair[colon + 1:]')} AS text_value,
               trim(pair[colon + 1:]) AS raw_value
        FROM console_pairs p SEMI JOIN console_lines l ON l.line_no = p.line_no AND l.kind = 'metric'
        """
    )
    con.execute("DROP TABLE console_pairs")
    con.execute("CREATE OR REPLACE TEMP TABLE console_flags (line_no BIGINT, step BIGINT, flag VARCHAR, detail VARCHAR)")


def _parse_dirty_lines(ctx: FileContext) -> None:
    """The Python path: parse each dirty line, reject what cannot be parsed, flag cut lines."""
    con = ctx.con
    dirty = con.execute(
        "SELECT l.line_no, l.raw_chars, l.c, r.raw FROM console_lines l JOIN console_raw r USING (line_no)"
        " WHERE l.kind = 'dirty' ORDER BY l.line_no"
    ).fetchall()
    rows: dict[str, list] = {name: [] for name in ("line_no", "step", "pair_index", "key", "value", "text_value", "raw_value")}
    flags = []
    for line_no, raw_chars, cleaned, raw in dirty:
        cut = raw_chars == WANDB_LINE_LIMIT
        parsed = parse_metric_line(cleaned, cut=cut)
        if parsed.problem:
            ctx.reject(line_no, parsed.problem, raw)
            continue
        for index, (key, text) in enumerate(parsed.pairs, start=1):
            value, text_value = cl.parse_scalar(text)
            for name, item in zip(rows, (line_no, parsed.step, index, key, value, text_value, text)):
                rows[name].append(item)
        if cut:
            flags.append((line_no, parsed.step, "truncated_line",
                          f"line cut at {WANDB_LINE_LIMIT} characters; fragment dropped: {parsed.fragment[:80]!r}"))
    if rows["line_no"]:
        table = pa.table({
            "line_no": pa.array(rows["line_no"], pa.int64()), "step": pa.array(rows["step"], pa.int64()),
            "pair_index": pa.array(rows["pair_index"], pa.int64()), "key": pa.array(rows["key"], pa.string()),
            "value": pa.array(rows["value"], pa.float64()), "text_value": pa.array(rows["text_value"], pa.string()),
            "raw_value": pa.array(rows["raw_value"], pa.string()),
        })
        con.register("_dirty_rows", table)
        try:
            con.execute("INSERT INTO console_metrics SELECT * FROM _dirty_rows")
        finally:
            con.unregister("_dirty_rows")
    if flags:
        con.executemany("INSERT INTO console_flags VALUES (?, ?, ?, ?)", flags)


def _store_metrics(ctx: FileContext) -> None:
    """Segments from step order, then step_metrics and step_flags rows."""
    con = ctx.con
    con.execute(
        """
        CREATE OR REPLACE TEMP TABLE console_segments AS
        WITH ordered AS (
            SELECT line_no, step, lag(step) OVER (ORDER BY line_no) AS previous
            FROM (SELECT DISTINCT line_no, step FROM console_metrics)
        )
        SELECT line_no, step, previous,
               sum(CASE WHEN step <= previous THEN 1 ELSE 0 END) OVER (ORDER BY line_no) AS segment
        FROM ordered
        """
    )
    ctx.insert(
        """
        INSERT INTO step_metrics (run_id, segment, step, key, value, text_value, file_id, line_no)
        SELECT ?, s.segment, m.step, m.key, m.value, m.text_value, ?, m.line_no
        FROM console_metrics m JOIN console_segments s USING (line_no)
        ORDER BY m.line_no, m.pair_index
        """,
        [ctx.run_id, ctx.file_id],
    )
    con.execute(
        """
        INSERT INTO console_flags
        SELECT line_no, step, 'restart', 'step went back from ' || previous || ' to ' || step
        FROM console_segments WHERE step <= previous
        UNION ALL
        SELECT line_no, step, 'resumed', 'log starts at step ' || step
        FROM (SELECT * FROM console_segments ORDER BY line_no LIMIT 1) WHERE step > 1
        """
    )
    ctx.insert(
        """
        INSERT INTO step_flags (run_id, segment, step, flag, detail, file_id, line_no)
        SELECT ?, s.segment, f.step, f.flag, f.detail, ?, f.line_no
        FROM console_flags f JOIN console_segments s USING (line_no)
        ORDER BY f.line_no
        """,
        [ctx.run_id, ctx.file_id],
    )


def _store_tqdm_estimates(ctx: FileContext) -> int:
    """Step times from the `Training Progress` bar when the log has no metric line.

    Per bar count n (the last update printed for it): `tqdm/elapsed_s` (the bar's elapsed time),
    `tqdm/s_per_it` (tqdm's smoothed rate) and `tqdm/step_s` = (elapsed(n) - elapsed(m)) / (n - m),
    m being the previous count seen, when there is one. Returns the lines that produced rows.
    """
    con = ctx.con
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE tqdm_updates AS
        WITH pieces AS (
            SELECT r.line_no, piece_index, piece
            FROM console_raw r SEMI JOIN console_lines l ON l.line_no = r.line_no AND l.kind = 'tqdm',
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


def _note_zero_steps(ctx: FileContext) -> None:
    last_error = ctx.con.execute(
        "SELECT c FROM console_lines WHERE regexp_matches(c, '(?:Error|Exception)\\b') ORDER BY line_no DESC LIMIT 1"
    ).fetchall()
    ending = f"; last error: {last_error[0][0].strip()[:160]}" if last_error else ""
    ctx.note(f"zero steps: the log ends before step 1{ending}")


def _record_meta(ctx: FileContext, metric_lines: int) -> None:
    con = ctx.con
    settings = run_metadata.verl_settings_from_lines(con, "console_lines", "c")
    meta = {"framework": "verl", **settings}
    if metric_lines:
        version, precision = run_metadata.verl_console_version(con, "console_metrics", "raw_value")
        meta["verl_version"] = version
        meta["value_precision"] = precision
        ctx.format_version = {"<=0.4": "verl<=0.4 (.3f values)", ">=0.5": "verl>=0.5 (repr values)"}.get(version)
        meta.update(run_metadata.gpu_meta(settings, run_metadata.n_gpus_from_throughput(con, ctx.file_id)))
    else:
        meta.update(run_metadata.gpu_meta(settings, None))
    ctx.run_meta.update(meta)
