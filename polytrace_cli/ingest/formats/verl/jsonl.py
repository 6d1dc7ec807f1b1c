"""verl file logger: JSON lines, one per step (verl 0.6+, `trainer.logger=['file']`).

    {"step": 12, "data": {"timing_s/gen": 30.5, "actor/pg_loss": NaN, "resize/mode": "schedule"}}

How a file is read (FORMATS.md, section 2):

- The lines are read in bulk with polars; bare `NaN`, `Infinity` and `-Infinity` (older writers;
  not strict JSON) are rewritten into marker strings, then DuckDB checks each line with
  `json_valid` and unnests `data` with `json_each` into one `step_metrics` row per key.
- Values: numbers as `value`; the bare non-finite tokens as NaN / ±inf; `null` (newer writers'
  spelling of NaN) as NaN; booleans as 1/0 with text 'True'/'False'; strings, lists and objects as
  `text_value` (value NULL).
- A line that is not JSON, not an object, lacks an integer `step` (a whole number, `3` or `3.0`,
  within the step range: `base.step_sql`) or an object `data` is rejected with the reason;
  blank lines are ignored under `blank`.
- Segments follow the console rule (`segments.line_segments`): a step lower than the previous
  one, or equal to it with a key the previous line also had, starts a new segment (flag
  `restart`); a step written twice in a row with different keys (a validation line, then the
  training line) is one step. A file whose first step is above 1 is flagged `resumed`.
- Run meta: the version class, GPUs, and whether `timing_s/step` includes the testing and
  checkpoint timers (`semantics.step_timers.step_time_inclusion`, as for the console log).
- A log that grew since its last read is read from there on (`appendable`): its new lines are
  numbered after the stored ones and cut into segments on from the last line stored before
  (`resume_state`: that line, its step and segment; its keys are its stored pairs).
"""

from __future__ import annotations

import codecs

import json
import re

import duckdb
from pathlib import Path

from polytrace_cli.errors import ErrorCode
from polytrace_cli.lazy import polars as pl

from polytrace_cli.ingest import run_metadata
from polytrace_cli.ingest.arrow import ArrowStream
from polytrace_cli.ingest.base import FileContext, Ingester, step_problem_sql, step_sql
from polytrace_cli.ingest.formats.verl import names as verl_names
from polytrace_cli.ingest.registry import register
from polytrace_cli.ingest.segments import insert_step_flags, line_segments
from polytrace_cli.store.sql import fetch_first
from polytrace_cli.semantics.step_timers import step_time_inclusion

_NONFINITE_MARK = "__polytrace_nonfinite__:"
# A bare non-finite token in value position: after ':' '[' or ',' and before ',' '}' or ']'.
_BARE_NONFINITE = r"([:\[,]\s*)(-?Infinity|NaN)(\s*[,}\]])"
_SNIFF = re.compile(rb'^\s*\{\s*"step"\s*:\s*-?\d+\s*,\s*"data"\s*:\s*\{')
_SNIFF_ANY_ORDER = re.compile(rb'^\s*\{.*"data"\s*:\s*\{.*"step"\s*:\s*-?\d+')


def _first_lines(head: bytes) -> list[bytes]:
    """The lines of the head that may be a record (they start with `{`): warnings, a traceback or
    damaged records of any length may come before the first record."""
    return [line for line in head.split(b"\n") if line.lstrip().startswith(b"{")]


@register
class VerlJsonlIngester(Ingester):
    name = "verl-jsonl"
    version = "4"
    framework = "verl"
    appendable = True
    description = 'verl file logger JSONL (`{"step": N, "data": {...}}` per line)'
    metric_aliases = verl_names.METRIC_ALIASES
    validation_prefixes = verl_names.VALIDATION_PREFIXES

    def sniff(self, path: Path, head: bytes) -> bool:
        return any(_SNIFF.match(line) or _SNIFF_ANY_ORDER.match(line) for line in _first_lines(head))

    def load(self, ctx: FileContext) -> None:
        con = ctx.con
        if _read_clean_file(ctx):
            ctx.lines = ctx.stored = ctx.text_lines
        else:
            _read_line_by_line(ctx)
        _store_pairs(con)
        _reject_beyond_double(ctx)
        last = _store(ctx, (ctx.resume or {}).get("last"))
        # The file logger writes full-precision JSON numbers and exists from verl 0.6.
        meta = {"framework": "verl", "verl_version": ">=0.6", "value_precision": None}
        meta.update(run_metadata.gpu_meta({}, run_metadata.n_gpus_from_throughput(con, ctx.file_id)))
        if ctx.stored:
            meta.update(step_time_inclusion(con, ctx.run_id))
        ctx.run_meta.update(meta)
        ctx.format_version = "verl>=0.6 file logger"
        ctx.resume_state = {"last": last, "recomputed_meta": sorted(run_metadata.VERL_META_FROM_STORED_ROWS)}


def _read_clean_file(ctx: FileContext) -> bool:
    """Temp table `verl_jsonl_maps` (line_no, step, data NULL, pairs) straight from DuckDB's
    `read_json`, which also reads bare NaN and ±Infinity; False (nothing left behind) unless every
    line is a record with a valid step and a data object whose keys are unique, with no blank line
    (a record's line is then its place in the file: the table keeps read order, rowid from 0)."""
    con = ctx.con
    try:
        con.execute(
            "CREATE OR REPLACE TEMP TABLE verl_jsonl_read AS SELECT step, data FROM read_json(?,"
            " format='newline_delimited', records=true, columns={'step': 'JSON', 'data': 'MAP(VARCHAR, JSON)'})",
            [str(ctx.path)],
        )
    except duckdb.Error:
        return False
    step_text = "json_extract_string(step, '$')"
    clean = fetch_first(con, f"SELECT count(*) = ? AND bool_and(json_type(step) IN ('BIGINT', 'UBIGINT', 'DOUBLE')"
                             f" AND {step_sql(step_text)} IS NOT NULL AND data IS NOT NULL) FROM verl_jsonl_read",
                        [ctx.text_lines])[0]
    if clean:
        con.execute(f"CREATE OR REPLACE TEMP TABLE verl_jsonl_maps AS SELECT rowid + 1 + {int(ctx.line_offset)}"
                    f" AS line_no, {step_sql(step_text)} AS step, NULL::JSON AS data, data AS pairs FROM verl_jsonl_read")
        con.execute("CREATE OR REPLACE TEMP TABLE verl_jsonl_checked AS"
                    " SELECT line_no, step, NULL::VARCHAR AS problem FROM verl_jsonl_maps")
    con.execute("DROP TABLE verl_jsonl_read")
    return bool(clean)


def _read_line_by_line(ctx: FileContext) -> None:
    """Temp tables `verl_jsonl_checked` (every non-blank line, its step and problem) and
    `verl_jsonl_maps` (line_no, step, data, pairs) of the lines without a problem; blank and
    rejected lines accounted on `ctx`."""
    con = ctx.con
    lines = _read_lines(ctx.path, ctx.line_offset)
    ctx.lines = lines.height
    blank = lines.filter(pl.col("raw").str.strip_chars() == "")
    ctx.ignore("blank", blank.height)
    lines = lines.filter(pl.col("raw").str.strip_chars() != "").with_columns(
        j=pl.col("raw").str.replace_all(_BARE_NONFINITE, f'${{1}}"{_NONFINITE_MARK}${{2}}"${{3}}')
        .str.replace_all(_BARE_NONFINITE, f'${{1}}"{_NONFINITE_MARK}${{2}}"${{3}}'))
    con.register("verl_jsonl_lines", ArrowStream(lines))
    try:
        # Each line is parsed three times (valid? an object? its step and data), then only its data.
        con.execute(
            """
            CREATE OR REPLACE TEMP TABLE verl_jsonl_parts AS
            SELECT line_no, raw, j, kind,
                   CASE WHEN kind = 'OBJECT' THEN json_extract(j, ['$.step', '$.data']) END AS parts
            FROM (SELECT *, CASE WHEN json_valid(j) THEN json_type(j::JSON) END AS kind FROM verl_jsonl_lines)
            """
        )
    finally:
        con.unregister("verl_jsonl_lines")
    step_text = "json_extract_string(parts[1], '$')"
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE verl_jsonl_checked AS
        SELECT line_no, raw, {step_sql(step_text)} AS step, parts[2] AS data,
            CASE WHEN kind IS NULL THEN 'not JSON'
                 WHEN kind <> 'OBJECT' THEN 'not a JSON object'
                 WHEN json_type(parts[1]) IS NULL OR json_type(parts[1]) = 'NULL' THEN 'missing field step'
                 WHEN json_type(parts[1]) NOT IN ('BIGINT', 'UBIGINT', 'DOUBLE')
                      OR ({step_sql(step_text)} IS NULL AND {step_problem_sql(step_text)} = '{ErrorCode.TYPE_ERROR}')
                      THEN 'field step: expected an integer'
                 WHEN {step_sql(step_text)} IS NULL
                      THEN 'field step: ' || {step_text} || ' is out of range for INTEGER'
                 WHEN json_type(parts[2]) IS NULL OR json_type(parts[2]) = 'NULL' THEN 'missing field data'
                 WHEN json_type(parts[2]) <> 'OBJECT' THEN 'field data: expected an object'
            END AS problem
        FROM verl_jsonl_parts
        """
    )
    con.execute("DROP TABLE verl_jsonl_parts")
    for line_no, raw, problem in con.execute(
            "SELECT line_no, raw, problem FROM verl_jsonl_checked WHERE problem IS NOT NULL ORDER BY line_no"
    ).fetchall():
        ctx.reject(line_no, _json_reason(raw) if problem == "not JSON" else problem, raw,
                   code=_problem_code(problem))
    # Each data object is read as a MAP in one pass; an object with a key written twice (which a
    # MAP cannot hold) is walked with json_each instead, keeping both pairs.
    con.execute(
        """
        CREATE OR REPLACE TEMP TABLE verl_jsonl_maps AS
        SELECT line_no, step, data, json_transform(data, '"MAP(VARCHAR, JSON)"') AS pairs
        FROM verl_jsonl_checked WHERE problem IS NULL
        """
    )
    ctx.stored = con.execute("SELECT count(*) FROM verl_jsonl_maps").fetchall()[0][0]


def _store_pairs(con) -> None:
    """Temp table `verl_jsonl_metrics`: one row per key/value pair of `verl_jsonl_maps`, typed."""
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE verl_jsonl_metrics AS
        WITH pairs AS (
            SELECT line_no, step, unnest(map_keys(pairs)) AS key, unnest(map_values(pairs)) AS value,
                   unnest(range(1, cardinality(pairs)::BIGINT + 1)) AS pair_index
            FROM verl_jsonl_maps WHERE pairs IS NOT NULL
            UNION ALL
            SELECT m.line_no, m.step, e.key, e.value, e.id FROM verl_jsonl_maps m, json_each(m.data) AS e
            WHERE m.pairs IS NULL
        ), typed AS (SELECT *, coalesce(json_type(value), 'NULL') AS type FROM pairs)
        SELECT line_no, step, key,
            CASE WHEN type IN ('BIGINT', 'UBIGINT', 'DOUBLE') THEN CAST(value AS DOUBLE)
                 WHEN type = 'BOOLEAN' THEN CASE WHEN CAST(value AS BOOLEAN) THEN 1.0 ELSE 0.0 END
                 WHEN type = 'NULL' THEN CAST('nan' AS DOUBLE)
                 WHEN type = 'VARCHAR' AND starts_with(value ->> '$', '{_NONFINITE_MARK}') THEN
                      CAST(replace(replace(value ->> '$', '{_NONFINITE_MARK}', ''), 'Infinity', 'inf') AS DOUBLE)
            END AS value,
            CASE WHEN type = 'BOOLEAN' THEN CASE WHEN CAST(value AS BOOLEAN) THEN 'True' ELSE 'False' END
                 WHEN type = 'VARCHAR' AND NOT starts_with(value ->> '$', '{_NONFINITE_MARK}') THEN value ->> '$'
                 WHEN type IN ('ARRAY', 'OBJECT') THEN CAST(value AS VARCHAR)
            END AS text_value,
            pair_index,
            CASE WHEN type IN ('BIGINT', 'UBIGINT', 'DOUBLE') THEN NOT isfinite(CAST(value AS DOUBLE))
                AND regexp_matches(CAST(value AS VARCHAR), '^-?[0-9]') ELSE false END AS beyond_double
        FROM typed
        """
    )
    con.execute("DROP TABLE verl_jsonl_maps")


def _reject_beyond_double(ctx: FileContext) -> None:
    """Reject each line holding a number literal too large for a DOUBLE (`1e400`, 400 digits): read
    as ±inf it would pass for a bare `Infinity`, which only the writer may mean. Its pairs are
    dropped and it leaves the lines that set segments."""
    con = ctx.con
    found = con.execute("SELECT line_no, min(key) FROM verl_jsonl_metrics WHERE beyond_double"
                        " GROUP BY line_no ORDER BY line_no").fetchall()
    if found:
        wanted = {line_no: key for line_no, key in found}
        for line_no, raw in _lines_numbered(ctx.path, wanted, ctx.line_offset):
            ctx.reject(line_no, f"field data.{wanted[line_no]}: the number is out of range for DOUBLE", raw,
                       code=ErrorCode.OUT_OF_RANGE)
        con.execute("DELETE FROM verl_jsonl_metrics WHERE line_no IN (SELECT unnest(?::BIGINT[]))", [list(wanted)])
        con.execute("UPDATE verl_jsonl_checked SET problem = 'out of range' WHERE line_no IN"
                    " (SELECT unnest(?::BIGINT[]))", [list(wanted)])
        ctx.stored -= len(wanted)
    con.execute("ALTER TABLE verl_jsonl_metrics DROP COLUMN beyond_double")


def _lines_numbered(path: Path, wanted, offset: int = 0) -> list[tuple[int, str]]:
    """(line number, text) of the wanted lines of a file, numbered from `offset` + 1."""
    found = []
    with open(path, "rb") as handle:
        for line_no, raw in enumerate(handle, start=offset + 1):
            if line_no in wanted:
                found.append((line_no, raw.decode("utf-8", errors="replace").rstrip("\r\n")))
    return found


def _read_lines(path: Path, offset: int = 0) -> pl.DataFrame:
    """The file's lines numbered from `offset` + 1 (columns line_no, raw); a final newline starts no
    line, a UTF-8 byte order mark before the file's first line is not part of it."""
    data = path.read_bytes()
    text = (data if offset else data.removeprefix(codecs.BOM_UTF8)).decode("utf-8", errors="replace")
    parts = text.split("\n")
    if parts[-1] == "":
        parts.pop()
    return pl.DataFrame({"raw": parts}, schema={"raw": pl.String}).with_row_index(
        "line_no", offset=offset + 1).with_columns(
        pl.col("line_no").cast(pl.Int64), pl.col("raw").str.strip_chars_end("\r"))


def _problem_code(problem: str) -> str:
    """The ingest error code of a problem named by the line check."""
    if problem == "not JSON":
        return ErrorCode.INVALID_JSON
    if problem == "not a JSON object":
        return ErrorCode.NOT_AN_OBJECT
    if problem.startswith("missing field"):
        return ErrorCode.MISSING_FIELD
    return ErrorCode.OUT_OF_RANGE if problem.endswith("out of range for INTEGER") else ErrorCode.TYPE_ERROR


def _json_reason(raw: str) -> str:
    """Why a line is not JSON, in Python's words (only rejected lines get here)."""
    try:
        json.loads(raw)
    except json.JSONDecodeError as error:
        if error.pos >= len(raw.rstrip()) or error.msg.startswith("Unterminated string"):
            return "truncated JSON (line cut short)"
        return f"not JSON: {error.msg}"
    except RecursionError:
        return "not JSON: nested too deep to read"
    return "not JSON"


def _store(ctx: FileContext, seed: dict | None = None) -> dict | None:
    """Segments (`segments.line_segments` over each stored line's step and keys), then
    step_metrics and step_flags rows; returns the last stored line, its step and segment (`seed`
    when no line is new, None when no line is stored).

    In an appended read, `seed` is the last line stored before: its step and keys (its pairs read
    back from the store) come first, so the new lines' segments go on from its segment as in a
    whole read, and only the new lines' flags are written."""
    con = ctx.con
    keyed_lines = con.sql(
        """
        SELECT c.line_no, c.step, m.key
        FROM verl_jsonl_checked c LEFT JOIN verl_jsonl_metrics m USING (line_no)
        WHERE c.problem IS NULL ORDER BY c.line_no, m.pair_index
        """
    ).pl()
    if seed is not None:
        keyed_lines = pl.concat([_stored_keys(ctx, seed), keyed_lines], how="vertical_relaxed")
    segments = line_segments(keyed_lines).with_columns(pl.col("segment") + (seed or {}).get("segment", 0))
    last = ({"line": segments["line_no"][-1], "step": segments["step"][-1], "segment": segments["segment"][-1]}
            if segments.height else None)
    con.register("verl_jsonl_line_segments", ArrowStream(segments))
    try:
        con.execute("CREATE OR REPLACE TEMP TABLE verl_jsonl_segments AS SELECT * FROM verl_jsonl_line_segments")
    finally:
        con.unregister("verl_jsonl_line_segments")
    ctx.insert(
        """
        INSERT INTO step_metrics (run_id, segment, step, key, value, text_value, file_id, line_no)
        SELECT ?, s.segment, m.step, m.key, m.value, m.text_value, ?, m.line_no
        FROM verl_jsonl_metrics m JOIN verl_jsonl_segments s USING (line_no)
        ORDER BY m.line_no, m.pair_index
        """,
        [ctx.run_id, ctx.file_id],
    )
    insert_step_flags(ctx, "verl_jsonl_segments", after_line=seed["line"] if seed else None)
    if last is None:
        ctx.note("zero steps: no valid step line")
    return last


def _stored_keys(ctx: FileContext, last: dict) -> pl.DataFrame:
    """(line_no, step, key) of each pair the last line read before stored (`last`: its line, step
    and segment), read back from the store; one row with a null key when its data object was empty."""
    keys = [key for (key,) in ctx.con.execute(
        "SELECT key FROM step_metrics WHERE file_id = ? AND line_no = ?",
        [ctx.file_id, last["line"]]).fetchall()] or [None]
    return pl.DataFrame({"line_no": [last["line"]] * len(keys), "step": [last["step"]] * len(keys), "key": keys},
                        schema={"line_no": pl.Int64, "step": pl.Int64, "key": pl.String})
