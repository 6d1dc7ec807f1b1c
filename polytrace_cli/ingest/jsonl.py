"""Bulk loading of JSON-lines files into a typed temporary table.

The fast path hands the whole file to DuckDB's `read_json`, each field read as JSON. It is taken
only when the file is clean: every line parses, every required field is present, every value fits
its type (`fits_sql`: an integer field holds a whole number within its type, a flag a JSON
boolean, ...), and every record passes the ingester's checks. Otherwise the file is read again
line by line in Python, which names each bad line in `ingest_errors` by the same rule
(`value_problem`), and only the good lines are handed to DuckDB. Either way the ingester then
works on the table `records` with SQL, and a line is stored or rejected the same way whichever
path read it.
"""

from __future__ import annotations

import json
import math
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


# The integer types a spec may name, with the values each can hold.
INTEGER_RANGES = {
    "SMALLINT": (-(2**15), 2**15 - 1),
    "INTEGER": (-(2**31), 2**31 - 1),
    "BIGINT": (-(2**63), 2**63 - 1),
}


def value_problem(value, spec, where: str) -> tuple[str, str] | None:
    """(error code, reason) why `value` does not fit `spec`, or None when it fits. Nulls fit anything.

    An integer field takes a JSON integer, or a number with no fractional part, between the
    type's bounds (lo <= v < hi + 1, compared exactly); anything else is a type error, a value
    beyond the bounds is out of range. The bulk path's SQL rule (`fits_sql`) is the same rule.
    """
    if value is None:
        return None
    kind = _json_kind(value)
    if isinstance(spec, str):
        expected = _PY_TYPES[spec]
        if spec in INTEGER_RANGES:
            if kind not in ("integer", "number") or (
                kind == "number" and not (math.isfinite(value) and value.is_integer())
            ):
                return "type-error", f"field {where}: expected integer, got {kind}"
            low, high = INTEGER_RANGES[spec]
            if not low <= value < high + 1:
                return "out-of-range", f"field {where}: {value!r} is out of range for {spec}"
            return None
        if expected == "any" or kind == expected or (expected == "number" and kind == "integer"):
            return None
        return "type-error", f"field {where}: expected {expected}, got {kind}"
    if isinstance(spec, list):
        if kind != "list":
            return "type-error", f"field {where}: expected a list, got {kind}"
        for index, item in enumerate(value):
            problem = value_problem(item, spec[0], f"{where}[{index}]")
            if problem:
                return problem
        return None
    if kind != "object":
        return "type-error", f"field {where}: expected an object, got {kind}"
    for name, sub in spec.items():
        problem = value_problem(value.get(name), sub, f"{where}.{name}")
        if problem:
            return problem
    return None


_JSON_KIND_SQL = {"number": "('BIGINT', 'UBIGINT', 'DOUBLE')", "boolean": "('BOOLEAN')", "string": "('VARCHAR')"}


def fits_sql(expr: str, spec, depth: int = 0) -> str:
    """A SQL condition, true when the JSON value `expr` is missing, null or fits `spec`.

    The same rule as `value_problem`, evaluated by DuckDB over a whole file: an integer written
    as an integer literal is compared as a HUGEINT, any other number as a DOUBLE that must be
    finite and whole, both against lo <= v < hi + 1.
    """
    kind = f"json_type({expr})"
    if isinstance(spec, str):
        if spec == "JSON":
            return "true"
        if spec in INTEGER_RANGES:
            low, high = INTEGER_RANGES[spec]
            text = f"CAST({expr} AS VARCHAR)"
            as_double = f"TRY_CAST({text} AS DOUBLE)"
            fits = (
                f"(regexp_full_match({text}, '-?[0-9]+')"
                f" AND coalesce(TRY_CAST({text} AS HUGEINT) BETWEEN {low} AND {high}, false))"
                f" OR (NOT regexp_full_match({text}, '-?[0-9]+') AND {kind} = 'DOUBLE'"
                f" AND isfinite({as_double}) AND {as_double} = floor({as_double})"
                f" AND {as_double} >= {low}::DOUBLE AND {as_double} < {high + 1}::DOUBLE)"
            )
        else:
            fits = f"{kind} IN {_JSON_KIND_SQL[_PY_TYPES[spec]]}"
    elif isinstance(spec, list):
        item = f"item_{depth}"
        fits = (f"{kind} = 'ARRAY' AND coalesce(list_bool_and("
                f"[{fits_sql(item, spec[0], depth + 1)} FOR {item} IN json_extract({expr}, '$[*]')]), true)")
    else:
        fields = " AND ".join(
            f"({fits_sql(_json_field(expr, name), sub, depth + 1)})" for name, sub in spec.items()
        )
        fits = f"{kind} = 'OBJECT'" + (f" AND {fields}" if fields else "")
    return f"({expr} IS NULL OR {kind} = 'NULL' OR ({fits}))"


def _json_field(expr: str, name: str) -> str:
    return f"json_extract({expr}, {_sql_string('$.' + json.dumps(name))})"


def _iter_lines(path) -> Iterator[tuple[int, bytes]]:
    with open(path, "rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            yield line_no, raw


def _fast_path(ctx: FileContext, spec: Spec, required: Sequence[str], checks: Sequence[Check]) -> bool:
    """Read the whole file with DuckDB; False (leaving the slow path to name the bad lines) unless every
    line parses, every field fits its type (`fits_sql`), every required field is present and every check passes.

    Fields are read as JSON first: DuckDB's own conversion would round 5.7 into an integer, read "yes"
    as true and turn an out-of-range list item into NULL without a word.
    """
    con = ctx.con
    raw_columns = "{" + ", ".join(f"{_sql_string(name)}: 'JSON'" for name in spec) + "}"
    try:
        con.execute(
            "CREATE OR REPLACE TEMP TABLE raw_records AS SELECT * FROM read_json(?, format='newline_delimited',"
            f" columns={raw_columns})",
            [str(ctx.path)],
        )
    except duckdb.Error:
        return False
    conditions = [f'"{name}" IS NULL' for name in required]
    conditions += [f"NOT {fits_sql(_quoted(name), sub)}" for name, sub in spec.items()]
    if con.execute(f"SELECT count(*) FROM raw_records WHERE {' OR '.join(conditions)}").fetchall()[0][0]:
        return False
    typed = ", ".join(
        f"json_transform({_quoted(name)}, {_sql_string(json.dumps(sub))}) AS {_quoted(name)}"
        for name, sub in spec.items()
    )
    con.execute(f"CREATE OR REPLACE TEMP TABLE records AS SELECT {typed} FROM raw_records")
    con.execute("DROP TABLE raw_records")
    if checks:
        bad = con.execute(
            f"SELECT count(*) FROM records WHERE {' OR '.join(f'({c.bad_when})' for c in checks)}"
        ).fetchall()[0][0]
        if bad:
            return False
    return True


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _slow_path(ctx: FileContext, spec: Spec, required: Sequence[str], checks: Sequence[Check]) -> None:
    import pyarrow as pa  # only dirty files come this way; clean ones never pay for the import

    good_lines: list[int] = []
    good_text: list[str] = []
    for line_no, raw in _iter_lines(ctx.path):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            ctx.reject(line_no, "not UTF-8 text", raw, code="encoding-error")
            continue
        if not text.strip():
            ctx.ignore("blank line")
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as error:
            reason = "truncated JSON (line cut short)" if error.pos >= len(text.rstrip()) else f"not JSON: {error.msg}"
            ctx.reject(line_no, reason, text, code="invalid-json")
            continue
        if not isinstance(record, dict):
            ctx.reject(line_no, f"not a JSON object ({_json_kind(record)})", text, code="not-an-object")
            continue
        missing = [name for name in required if record.get(name) is None]
        if missing:
            ctx.reject(line_no, f"missing field {', '.join(missing)}", text, code="missing-field")
            continue
        problem = value_problem(record, spec, "")
        if problem:
            code, reason = problem
            ctx.reject(line_no, reason.replace("field .", "field "), text, code=code)
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
                ctx.reject(line_no, check.reason, text_by_line[line_no], code="constraint-error")
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
