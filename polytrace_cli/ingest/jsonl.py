"""Bulk loading of JSON-lines files into a typed temporary table.

The fast path hands the whole file to DuckDB's `read_json` with the expected columns. It is
taken only when the file is clean: every line parses, every required field is present with the
right type, and every record passes the ingester's checks. Otherwise the file is read again line
by line in Python, which names each bad line in `ingest_errors`, and only the good lines are
handed to DuckDB. Either way the ingester then works on the table `records` with SQL.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import duckdb

from polytrace_cli.ingest.base import FileContext

# A spec maps field names to DuckDB scalar type names, [spec] for lists, {..} for objects.
Spec = dict


@dataclass(frozen=True)
class Check:
    """A per-record rule in SQL over `records`: rows where `bad_when` holds are rejected."""

    bad_when: str
    reason: str


def duckdb_type(spec) -> str:
    """The DuckDB type string of a spec node: 'INTEGER', [x] -> 'X[]', {k: v} -> STRUCT(...)."""
    if isinstance(spec, str):
        return spec
    if isinstance(spec, list):
        return f"{duckdb_type(spec[0])}[]"
    fields = ", ".join(f'"{name}" {duckdb_type(sub)}' for name, sub in spec.items())
    return f"STRUCT({fields})"


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _columns_literal(spec: Spec) -> str:
    return "{" + ", ".join(f"{_sql_string(k)}: {_sql_string(duckdb_type(v))}" for k, v in spec.items()) + "}"


_PY_TYPES = {
    "INTEGER": "integer",
    "BIGINT": "integer",
    "SMALLINT": "integer",
    "DOUBLE": "number",
    "FLOAT": "number",
    "BOOLEAN": "boolean",
    "VARCHAR": "string",
    "JSON": "any",
}


def _json_kind(value) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return "null"


def type_problem(value, spec, where: str) -> str | None:
    """Why `value` does not fit `spec` (None when it fits). Nulls fit anything."""
    if value is None:
        return None
    kind = _json_kind(value)
    if isinstance(spec, str):
        expected = _PY_TYPES[spec]
        if expected == "any" or kind == expected or (expected == "number" and kind == "integer"):
            return None
        if expected == "integer" and kind == "number" and float(value).is_integer():
            return None
        return f"field {where}: expected {expected}, got {kind}"
    if isinstance(spec, list):
        if kind != "list":
            return f"field {where}: expected a list, got {kind}"
        for index, item in enumerate(value):
            problem = type_problem(item, spec[0], f"{where}[{index}]")
            if problem:
                return problem
        return None
    if kind != "object":
        return f"field {where}: expected an object, got {kind}"
    for name, sub in spec.items():
        problem = type_problem(value.get(name), sub, f"{where}.{name}")
        if problem:
            return problem
    return None


def _iter_lines(path) -> Iterator[tuple[int, bytes]]:
    with open(path, "rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            yield line_no, raw


def _fast_path(ctx: FileContext, spec: Spec, required: Sequence[str], checks: Sequence[Check]) -> bool:
    con = ctx.con
    try:
        con.execute(
            "CREATE OR REPLACE TEMP TABLE records AS SELECT * FROM read_json(?, format='newline_delimited',"
            f" columns={_columns_literal(spec)})",
            [str(ctx.path)],
        )
    except duckdb.Error:
        return False
    conditions = [f'"{name}" IS NULL' for name in required] + [f"({c.bad_when})" for c in checks]
    if conditions:
        bad = con.execute(f"SELECT count(*) FROM records WHERE {' OR '.join(conditions)}").fetchall()[0][0]
        if bad:
            return False
    return True


def _slow_path(ctx: FileContext, spec: Spec, required: Sequence[str], checks: Sequence[Check]) -> None:
    import pyarrow as pa  # only dirty files come this way; clean ones never pay for the import

    good_lines: list[int] = []
    good_text: list[str] = []
    for line_no, raw in _iter_lines(ctx.path):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            ctx.reject(line_no, "not UTF-8 text", raw)
            continue
        if not text.strip():
            ctx.ignore("blank line")
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as error:
            reason = "truncated JSON (line cut short)" if error.pos >= len(text.rstrip()) else f"not JSON: {error.msg}"
            ctx.reject(line_no, reason, text)
            continue
        if not isinstance(record, dict):
            ctx.reject(line_no, f"not a JSON object ({_json_kind(record)})", text)
            continue
        missing = [name for name in required if record.get(name) is None]
        if missing:
            ctx.reject(line_no, f"missing field {', '.join(missing)}", text)
            continue
        problem = type_problem(record, spec, "")
        if problem:
            ctx.reject(line_no, problem.replace("field .", "field "), text)
            continue
        good_lines.append(line_no)
        good_text.append(text)
    table = pa.table({"line_no": pa.array(good_lines, pa.int64()), "line": pa.array(good_text, pa.string())})
    con = ctx.con
    con.register("_good_lines", table)
    try:
        structure = json.dumps(spec)
        con.execute(
            "CREATE OR REPLACE TEMP TABLE records AS SELECT line_no, unnest(from_json(line, ?)) FROM _good_lines",
            [structure],
        )
    finally:
        con.unregister("_good_lines")
    text_by_line = dict(zip(good_lines, good_text))
    for check in checks:
        failing = con.execute(f"SELECT line_no FROM records WHERE {check.bad_when} ORDER BY line_no").fetchall()
        if failing:
            for (line_no,) in failing:
                ctx.reject(line_no, check.reason, text_by_line[line_no])
            con.execute(f"DELETE FROM records WHERE {check.bad_when}")


def load_records(
    ctx: FileContext,
    spec: Spec,
    required: Sequence[str] = (),
    checks: Sequence[Check] = (),
) -> int:
    """Fill temp table `records` with the file's valid records; return how many.

    Accounts on `ctx`: lines read, blank lines ignored, bad lines rejected with their reasons; the
    caller marks the returned records as stored once it has written their rows.
    """
    if _fast_path(ctx, spec, required, checks):
        ctx.lines = ctx.text_lines
        records = ctx.con.execute("SELECT count(*) FROM records").fetchall()[0][0]
        ctx.ignore("blank line", ctx.lines - records)
        return records
    ctx.lines = ctx.text_lines
    _slow_path(ctx, spec, required, checks)
    return ctx.con.execute("SELECT count(*) FROM records").fetchall()[0][0]
