"""Bulk loading of JSON-lines files into a typed temporary table.

The fast path hands the whole file to DuckDB's `read_json`, each field read as JSON. It is taken
only when the file is clean: every line parses, every required field is present, every value fits
its type (`fits_sql`: an integer field holds a whole number within its type, a flag a JSON
boolean, ...), and every record passes the ingester's checks. Otherwise the file is split into
lines inside DuckDB and the bad region is found there: lines that are not JSON objects, miss a
required field or hold a value that does not fit are the suspects, and only those are read again
in Python, which names each in `ingest_errors` by the same rule (`value_problem`); the other lines
are typed in bulk. A file that is not UTF-8 text, or where Python and DuckDB disagree about a
line, is read line by line in Python. Either way the ingester then works on the table `records`
with SQL, and a line is stored or rejected the same way whichever path read it.

Before either, a strict typed decoder (msgspec, `strict_records`) reads the file's bytes: when
it accepts every line, no value can be one DuckDB's typed reader would coerce (it rounds 5.7 into an
integer, reads "5" as 5 and true as 1), so DuckDB reads the file with the spec's own column types
(`_create_typed_from_json`), which costs about half the read of every field as JSON text and its
check. The decoder is stricter than `value_problem` (it refuses 5.0 for an integer): a file it
refuses takes the paths above, which decide by the project's rule.

`load_batch_records` reads many small files of one format in one `read_json` call, typed, while
the strict decoder reads the same files in another thread; a file the decoder refuses, and any
file with a bad line, is left to the per-file paths above (see `batch`). A format whose records
are each one row of one table (`BulkJsonlIngester.row_table`) is read so straight into that table
instead (`insert_typed_rows`) and checked there (`create_stored_keyed`, `stored_counts`).
"""

from __future__ import annotations

import codecs
import functools
import itertools
import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ClassVar

import duckdb
import msgspec

from polytrace_cli.errors import ErrorCode
from polytrace_cli.ingest.base import FileContext, JsonlTraceIngester

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
    beyond the bounds is out of range, and so is a number too large for a double (`1e400`, read as
    ±inf) in any numeric field. The bulk path's SQL rule (`fits_sql`) is the same rule.
    """
    if value is None:
        return None
    kind = _json_kind(value)
    if isinstance(spec, str):
        expected = _PY_TYPES[spec]
        if kind == "number" and not math.isfinite(value) and expected in ("integer", "number"):
            # JSON has no infinity: a number read as ±inf or NaN was too large to hold (1e400).
            return ErrorCode.OUT_OF_RANGE, f"field {where}: {value!r} is out of range for {spec}"
        if spec in INTEGER_RANGES:
            if kind not in ("integer", "number") or (
                kind == "number" and not (math.isfinite(value) and value.is_integer())
            ):
                return ErrorCode.TYPE_ERROR, f"field {where}: expected integer, got {kind}"
            low, high = INTEGER_RANGES[spec]
            if not low <= value < high + 1:
                return ErrorCode.OUT_OF_RANGE, f"field {where}: {value!r} is out of range for {spec}"
            return None
        if expected == "any" or kind == expected or (expected == "number" and kind == "integer"):
            return None
        return ErrorCode.TYPE_ERROR, f"field {where}: expected {expected}, got {kind}"
    if isinstance(spec, list):
        if kind != "list":
            return ErrorCode.TYPE_ERROR, f"field {where}: expected a list, got {kind}"
        for index, item in enumerate(value):
            problem = value_problem(item, spec[0], f"{where}[{index}]")
            if problem:
                return problem
        return None
    if kind != "object":
        return ErrorCode.TYPE_ERROR, f"field {where}: expected an object, got {kind}"
    for name, sub in spec.items():
        problem = value_problem(value.get(name), sub, f"{where}.{name}")
        if problem:
            return problem
    return None


# The largest finite magnitude of each floating-point type (a number beyond it is out of range).
_FLOAT_LIMITS = {"DOUBLE": 1.7976931348623157e308, "FLOAT": 3.4028234663852886e38}


def _strict_type(spec, names: Iterator[str]):
    """The msgspec type a value of `spec` must decode as: every value may be null; an integer is a
    JSON integer within its type's bounds, a number any finite JSON number within its type's, a flag
    a JSON boolean, a text a JSON string; lists and objects hold such values (other keys skipped)."""
    if isinstance(spec, str):
        if spec == "JSON":
            return msgspec.Raw
        if spec in INTEGER_RANGES:
            low, high = INTEGER_RANGES[spec]
            return Annotated[int, msgspec.Meta(ge=low, le=high)] | None
        if spec in _FLOAT_LIMITS:
            limit = _FLOAT_LIMITS[spec]
            return Annotated[float, msgspec.Meta(ge=-limit, le=limit)] | None
        return {"BOOLEAN": bool, "VARCHAR": str}[spec] | None
    if isinstance(spec, list):
        return list[_strict_type(spec[0], names)] | None
    fields = [(name, _strict_type(sub, names), msgspec.Raw(b"null") if sub == "JSON" else None)
              for name, sub in spec.items()]
    return msgspec.defstruct(next(names), fields, gc=False)


@dataclass(frozen=True)
class _IntegerListField:
    """A top-level field holding a list of integers, decoded as its raw JSON text and checked by
    `_integer_lists_fit` (creating a Python int per item was most of the strict decoder's time)."""

    name: str
    max_digits: int  # a run of at most this many digits is within the type's bounds


@dataclass(frozen=True)
class _StrictDecoders:
    """The strict decoder of a spec, and the fast one that reads its integer lists as raw text."""

    exact: msgspec.json.Decoder
    fast: msgspec.json.Decoder | None
    integer_lists: tuple[_IntegerListField, ...]


def _integer_list_field(name: str, sub) -> _IntegerListField | None:
    if not (isinstance(sub, list) and isinstance(sub[0], str) and sub[0] in INTEGER_RANGES):
        return None
    low, high = INTEGER_RANGES[sub[0]]
    return _IntegerListField(name, len(str(min(high, -low))) - 1)


@functools.lru_cache(maxsize=64)
def _strict_decoders_of(spec_text: str) -> _StrictDecoders:
    spec = json.loads(spec_text)
    names = (f"Record{index}" for index in itertools.count())
    exact = msgspec.json.Decoder(_strict_type(spec, names))
    lists = tuple(field for name, sub in spec.items() if (field := _integer_list_field(name, sub)))
    if not lists:
        return _StrictDecoders(exact, None, ())
    raw = {field.name for field in lists}
    fields = [(name, msgspec.Raw, msgspec.Raw(b"null")) if name in raw
              else (name, _strict_type(sub, names), msgspec.Raw(b"null") if sub == "JSON" else None)
              for name, sub in spec.items()]
    fast = msgspec.json.Decoder(msgspec.defstruct(next(names), fields, gc=False))
    return _StrictDecoders(exact, fast, lists)


# Decoders by the identity of the spec they were built for (ingesters pass the same dict each time).
_DECODERS: dict[int, tuple[Spec, _StrictDecoders]] = {}


def _strict_decoders(spec: Spec) -> _StrictDecoders:
    known = _DECODERS.get(id(spec))
    if known is None or known[0] is not spec:
        known = _DECODERS[id(spec)] = (spec, _strict_decoders_of(json.dumps(spec)))
    return known[1]


_DIGITS_AS_NINES = bytes.maketrans(b"0123456789", b"9999999999")


def _integer_lists_fit(records: list, field: _IntegerListField) -> bool:
    """Whether every record's raw `field` is a list of integers within the type's bounds, judged on
    the joined text of all of them at once: deleting digits, minus signs, separators and white
    space must leave exactly '[]' per record, and no run of digits may be longer than
    `max_digits`. The text is valid JSON already (the decoder checked it), so this leaves out
    exactly nested lists, strings, booleans, nulls and numbers with a fraction or an exponent; a
    false answer only means the exact decoder must judge."""
    joined = b"".join([getattr(record, field.name) for record in records])
    if joined.translate(None, b"0123456789-, \t\r") != b"[]" * len(records):
        return False
    return joined.translate(_DIGITS_AS_NINES).find(b"9" * (field.max_digits + 1)) < 0


# A file smaller than this is decoded strictly whatever its spec (see `_small`).
SMALL_FILE_BYTES = 1 << 20
# A file is decoded in blocks of about this size, cut at line ends, so memory does not grow with it.
STRICT_BLOCK_BYTES = 4 << 20
# What `strict_records` says of data that is not JSON lines at all (a line that does not parse).
NOT_JSON_LINES = -1


def strict_records(data: bytes | memoryview, spec: Spec) -> int | None:
    """How many records the JSON lines in `data` hold when every line is blank or a JSON object whose
    fields each decode strictly as `spec` says (`_strict_type`); None when some value does not
    (it may still fit by `value_problem`), NOT_JSON_LINES when some line is not JSON.

    Strictly decoded, a value fits by `value_problem` too, and DuckDB's typed read gives it the
    same value `json_transform` gives its JSON text: such lines need no check of their text.
    """
    decoders = _strict_decoders(spec)
    try:
        if decoders.fast is not None:
            records = decoders.fast.decode_lines(data)
            if all(_integer_lists_fit(records, field) for field in decoders.integer_lists):
                return len(records)
        return len(decoders.exact.decode_lines(data))
    except msgspec.ValidationError:
        return None
    except (msgspec.DecodeError, RecursionError):  # nested past the decoder's depth: no record either way
        return NOT_JSON_LINES


def strict_pass_pays(spec: Spec) -> bool:
    """Whether one large file of `spec` is decoded strictly before it is read (and then read with
    its types): when some field is an object or a list of objects, or a list of integers.

    Read as JSON text, an object field is held as text and typed copies at once and its items are
    put to the exact rule one by one (a 20 MB multi-turn trace took 1 GB). A list of integers is
    checked on its raw text (`_integer_lists_fit`), so the strict pass costs less than the JSON-text
    read and check it replaces: 1.5 against 2.1 s of CPU for a 90 MB packed trace. For scalars alone
    the JSON-text read and its cheap text rule (`plain_fit_sql`) are left as they are."""
    return (any(isinstance(sub, dict) or (isinstance(sub, list) and not isinstance(sub[0], str))
                for sub in spec.values())
            or _strict_decoders(spec).fast is not None)


def strict_file_records(path, spec: Spec, block_bytes: int = STRICT_BLOCK_BYTES) -> int | None:
    """`strict_records` of a whole file, decoded block by block (each ending at a line end); None
    when the file cannot be read or is not UTF-8 JSON lines as a whole."""
    records = 0
    try:
        with open(path, "rb") as handle:
            rest = b""
            while True:
                block = handle.read(block_bytes)
                data = rest + block
                cut = data.rfind(b"\n") + 1 if block else len(data)
                found = strict_records(memoryview(data)[:cut], spec) if cut else 0
                if found is None or found < 0:
                    return found
                records += found
                rest = data[cut:]
                if not block:
                    return records
    except OSError:
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
        elif _PY_TYPES[spec] == "number":
            fits = f"{kind} IN {_JSON_KIND_SQL['number']} AND isfinite(TRY_CAST(CAST({expr} AS VARCHAR) AS DOUBLE))"
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


# Digits a plain integer literal may have and still surely fit its type (2^31 has ten digits).
_SAFE_DIGITS = {"SMALLINT": 4, "INTEGER": 9, "BIGINT": 18}


def plain_fit_sql(text: str, spec) -> str | None:
    """A cheap SQL condition on a JSON value's text, true only when the value surely fits `spec`, or
    None when the spec has no such rule.

    An integer written as a plain literal short enough to be within its type, `true`/`false`, a
    number with at most a two-digit exponent, or a list of such integers fits; most values are
    written so. A value this rule does not vouch for is put to the exact rule (`fits_sql`).
    """
    if isinstance(spec, str):
        if spec in _SAFE_DIGITS:
            return f"regexp_full_match({text}, '-?[0-9]{{1,{_SAFE_DIGITS[spec]}}}')"
        if spec == "BOOLEAN":
            return f"{text} IN ('true', 'false')"
        if spec == "DOUBLE":
            return f"regexp_full_match({text}, '-?[0-9]+(\\.[0-9]+)?([eE][+-]?[0-9]{{1,2}})?')"
        return None
    if isinstance(spec, list) and isinstance(spec[0], str) and spec[0] in _SAFE_DIGITS:
        item = f"-?[0-9]{{1,{_SAFE_DIGITS[spec[0]]}}}"
        return f"regexp_full_match({text}, '\\[\\s*({item}(\\s*,\\s*{item})*)?\\s*\\]')"
    return None


def _json_field(expr: str, name: str) -> str:
    return f"json_extract({expr}, {_sql_string('$.' + json.dumps(name))})"


# A UTF-8 byte order mark before a file's first line (written by some editors) is not part of the line.
_DROP_BOM_SQL = "UPDATE raw_lines SET line = substr(line, 2) WHERE line_no = 1 AND starts_with(line, chr(65279))"


def _iter_lines(path) -> Iterator[tuple[int, bytes]]:
    with open(path, "rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            yield line_no, raw.removeprefix(codecs.BOM_UTF8) if line_no == 1 else raw


def _fast_path(ctx: FileContext, spec: Spec, required: Sequence[str], checks: Sequence[Check]) -> bool:
    """Read the whole file with DuckDB; False (leaving the slow path to name the bad lines) unless every
    line parses, every field fits its type (`fits_sql`), every required field is present and every check passes.

    When `strict_pass_pays` or the file is `_small`, and the strict decoder accepts every line (`strict_file_records`),
    DuckDB reads the fields with their own types. Otherwise they are read as JSON first: DuckDB's own conversion would round 5.7
    into an integer, read "yes" as true and turn an out-of-range list item into NULL without a word.
    A line the decoder cannot parse at all sends the file straight to the region path.
    """
    con = ctx.con
    records = strict_file_records(ctx.path, spec) if strict_pass_pays(spec) or _small(ctx.path) else None
    if records == NOT_JSON_LINES:
        return False  # DuckDB's read would fail on the same line: the region path finds it
    if records is None or _create_typed_from_json(con, [str(ctx.path)], spec, required,
                                                  with_filename=False) != {"": records}:
        if not _create_checked_from_json(con, [str(ctx.path)], spec, required, with_filename=False):
            return False
    if fetch_count(con, "SELECT count(*) FROM checked WHERE bad"):
        con.execute("DROP TABLE checked")
        return False
    _checked_become_records(con)
    if checks:
        bad = con.execute(
            f"SELECT count(*) FROM records WHERE {' OR '.join(f'({c.bad_when})' for c in checks)}"
        ).fetchall()[0][0]
        if bad:
            return False
    return True


def _small(path) -> bool:
    """Whether the file is small enough that DuckDB's planning of the JSON-text check costs more than
    decoding it strictly (about 15 ms a file)."""
    try:
        return os.path.getsize(path) < SMALL_FILE_BYTES
    except OSError:
        return False


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _line_problem(raw: bytes, spec: Spec, required: Sequence[str]) -> tuple[str, str, str | bytes] | None:
    """(code, reason, text) why one line cannot be stored, ("", "blank line", text) for a blank line,
    or None when the line holds a storable record. The per-line rule both fallbacks apply."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return ErrorCode.ENCODING_ERROR, "not UTF-8 text", raw
    if not text.strip():
        return "", "blank line", text
    try:
        record = json.loads(text)
    except json.JSONDecodeError as error:
        reason = "truncated JSON (line cut short)" if error.pos >= len(text.rstrip()) else f"not JSON: {error.msg}"
        return ErrorCode.INVALID_JSON, reason, text
    except RecursionError:
        return ErrorCode.INVALID_JSON, "JSON nested too deep to read", text
    if not isinstance(record, dict):
        return ErrorCode.NOT_AN_OBJECT, f"not a JSON object ({_json_kind(record)})", text
    missing = [name for name in required if record.get(name) is None]
    if missing:
        return ErrorCode.MISSING_FIELD, f"missing field {', '.join(missing)}", text
    problem = value_problem(record, spec, "")
    if problem:
        code, reason = problem
        return code, reason.replace("field .", "field "), text
    return None


def _account_for(ctx: FileContext, line_no: int, verdict: tuple[str, str, str | bytes]) -> None:
    code, reason, text = verdict
    if code:
        ctx.reject(line_no, reason, text, code=code)
    else:
        ctx.ignore(reason)


def _slow_path(ctx: FileContext, spec: Spec, required: Sequence[str], checks: Sequence[Check]) -> None:
    import pyarrow as pa  # only dirty files come this way; clean ones never pay for the import

    good_lines: list[int] = []
    good_text: list[str] = []
    for line_no, raw in _iter_lines(ctx.path):
        verdict = _line_problem(raw, spec, required)
        if verdict:
            _account_for(ctx, line_no, verdict)
            continue
        good_lines.append(line_no)
        good_text.append(raw.decode("utf-8"))
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
    _apply_checks(ctx, checks, text_by_line.__getitem__)


def _apply_checks(ctx: FileContext, checks: Sequence[Check], text_of) -> None:
    """Reject (and delete from `records`) the records a check fails, in line order per check."""
    con = ctx.con
    for check in checks:
        failing = con.execute(f"SELECT line_no FROM records WHERE {check.bad_when} ORDER BY line_no").fetchall()
        if failing:
            for (line_no,) in failing:
                ctx.reject(line_no, check.reason, text_of(line_no), code=ErrorCode.CONSTRAINT_ERROR)
            con.execute(f"DELETE FROM records WHERE {check.bad_when}")


def _create_raw_records(con: duckdb.DuckDBPyConnection, spec: Spec, keys: str) -> None:
    """Temp table `raw_records`: `keys` and each spec field, as JSON, of every `raw_lines` line that is a
    JSON object, extracted in one pass (a field that is absent is NULL; JSON null stays JSON).

    Most lines are valid JSON, so the extraction is first tried without validating each line
    (DuckDB refuses the whole statement if one is not); only then is each line validated first.
    """
    paths = ", ".join(_sql_string("$." + json.dumps(name)) for name in spec)
    fields = ", ".join(f"fields[{index}] AS {_quoted(name)}" for index, name in enumerate(spec, start=1))
    select = (f"CREATE OR REPLACE TEMP TABLE raw_records AS SELECT {keys}, {fields}"
              f" FROM (SELECT {keys}, json_extract(line, [{paths}]) AS fields FROM raw_lines WHERE {{valid}})")
    # An object's text starts with '{' (leading white space aside, which is left to the per-line rule).
    try:
        con.execute(select.format(valid="starts_with(line, '{')"))
    except duckdb.Error:
        con.execute(select.format(valid="starts_with(line, '{') AND json_valid(line)"))


def _create_checked_from_json(con: duckdb.DuckDBPyConnection, paths: Sequence[str], spec: Spec,
                              required: Sequence[str], with_filename: bool) -> bool:
    """`_create_checked` straight from DuckDB's `read_json` of the files (each field read as JSON,
    with each record's `filename` when asked), in one statement; False when some line is not a
    JSON object DuckDB can read. `read_json` reads a line `null` as a record with every field NULL:
    such a record is counted bad, for the per-line rule to decide."""
    raw_columns = "{" + ", ".join(f"{_sql_string(name)}: 'JSON'" for name in spec) + "}"
    source = (f"read_json(?, format='newline_delimited', records=true, columns={raw_columns}"
              f"{', filename=true' if with_filename else ''})")
    try:
        _create_checked(con, spec, required, "filename" if with_filename else "", source=source,
                        parameters=[list(paths)], all_null_is_bad=True)
    except duckdb.Error:
        return False
    return True


def _create_typed_from_json(con: duckdb.DuckDBPyConnection, paths: Sequence[str], spec: Spec,
                            required: Sequence[str], with_filename: bool) -> dict[str, int] | None:
    """Temp table `checked` as `_create_checked_from_json` makes it, read by DuckDB with the spec's
    own column types: only the records of files whose values `strict_records` accepts (before or
    alongside this read) may be kept, since no value of theirs was coerced; `bad` is only a missing
    required field. Returns {'': records}, or None when DuckDB cannot read the file so.

    With `with_filename` the files are read straight into `records` instead, keyed by `file_index`
    (`record_files` names each file), without a `bad` column; returns {filename: records}."""
    source = (f"read_json(?, format='newline_delimited', records=true, columns={_columns_literal(spec)})")
    missing = " OR ".join(f"{_quoted(name)} IS NULL" for name in required) or "false"
    try:
        if with_filename:
            # A file's index costs less than its name on every record (the name is text, often long).
            con.execute(f"CREATE OR REPLACE TEMP TABLE records AS SELECT *, file_index FROM {source}", [list(paths)])
        else:
            con.execute(f"CREATE OR REPLACE TEMP TABLE checked AS SELECT *, {missing} AS bad FROM {source}",
                        [list(paths)])
    except duckdb.Error:
        return None
    if with_filename:
        _create_record_files(con, paths)
        return dict(con.execute("SELECT filename, count(*) FROM records JOIN record_files USING (file_index)"
                                " GROUP BY filename").fetchall())
    return {"": fetch_count(con, "SELECT count(*) FROM checked")}


def _create_record_files(con: duckdb.DuckDBPyConnection, paths: Sequence[str]) -> None:
    """Temp table `record_files`: each of `paths` with its `file_index`, its position in `paths`."""
    con.execute("CREATE OR REPLACE TEMP TABLE record_files AS SELECT unnest(?::VARCHAR[]) AS filename,"
                " (unnest(range(?)))::UBIGINT AS file_index", [list(paths), len(paths)])


def _records_keyed_by_index(con: duckdb.DuckDBPyConnection, paths: Sequence[str]) -> None:
    """`records`, keyed by `filename`, keyed by `file_index` instead (see `_create_typed_from_json`)."""
    _create_record_files(con, paths)
    con.execute("CREATE OR REPLACE TEMP TABLE records AS SELECT r.* EXCLUDE (filename), f.file_index"
                " FROM records r JOIN record_files f USING (filename)")


def delete_records_of(con: duckdb.DuckDBPyConnection, names) -> None:
    """Remove the records of the named files from a batch's `records` (keyed by `file_index`)."""
    con.execute("DELETE FROM records WHERE file_index IN"
                " (SELECT file_index FROM record_files WHERE filename IN (SELECT unnest(?::VARCHAR[])))",
                [sorted(names)])


def insert_typed_rows(con: duckdb.DuckDBPyConnection, paths: Sequence[str], ingester: BulkJsonlIngester) -> None:
    """Read `paths` with the spec's own column types (as `_create_typed_from_json`) straight into the
    ingester's `row_table`, one row per record, keyed by the temp table `batch_files` (file_index: the
    file's position in `paths`, file_id, run_id, file_rank). A record missing a required field is left
    out, so a file holding one stores fewer rows than the strict decoder counted records. Only files
    whose values the strict decoder accepts may keep their rows (see `_create_typed_from_json`).
    Raises duckdb.Error when DuckDB cannot read the files so (a line that is not JSON)."""
    spec = ingester.spec
    columns = ", ".join(_quoted(column) for column in ingester.row_columns.values())
    fields = ", ".join(f"r.{_quoted(name)}" for name in ingester.row_columns)
    present = " AND ".join(f"r.{_quoted(name)} IS NOT NULL" for name in ingester.required) or "true"
    con.execute(
        f"INSERT INTO {ingester.row_table} (run_id, file_id, {columns}) SELECT k.run_id, k.file_id, {fields}"
        f" FROM read_json(?, format='newline_delimited', records=true, columns={_columns_literal(spec)}) r"
        f" JOIN batch_files k USING (file_index) WHERE {present}", [list(paths)])


def create_stored_keyed(con: duckdb.DuckDBPyConnection, ingester: BulkJsonlIngester) -> None:
    """Temp view `keyed` over the rows of the files of `batch_files` in the ingester's `row_table`,
    each column named by its spec field, as `BulkJsonlIngester` describes `keyed`."""
    low, high = con.execute("SELECT min(file_id), max(file_id) FROM batch_files").fetchall()[0]
    fields = ", ".join(f"t.{_quoted(column)} AS {_quoted(name)}" for name, column in ingester.row_columns.items())
    # The range lets DuckDB skip the table's older row groups before the join.
    con.execute(f"CREATE OR REPLACE TEMP VIEW keyed AS SELECT k.file_id, k.run_id, k.file_rank, {fields}"
                f" FROM {ingester.row_table} t JOIN batch_files k USING (file_id)"
                f" WHERE t.file_id BETWEEN {int(low)} AND {int(high)}")


def stored_counts(con: duckdb.DuckDBPyConnection, checks: Sequence[Check]) -> dict[int, tuple[int, int]]:
    """Per file_id in `keyed`: (records, records failing one of `checks`)."""
    failing = " OR ".join(f"({c.bad_when})" for c in checks) or "false"
    return {file_id: (records, bad) for file_id, records, bad in con.execute(
        f"SELECT file_id, count(*), count(*) FILTER (WHERE coalesce({failing}, false)) FROM keyed GROUP BY file_id"
    ).fetchall()}


def _checked_become_records(con: duckdb.DuckDBPyConnection) -> None:
    """Rename `checked`, every record of it good, to `records` (without its `bad` column)."""
    con.execute("DROP TABLE IF EXISTS records")
    con.execute("ALTER TABLE checked RENAME TO records")
    con.execute("ALTER TABLE records DROP COLUMN bad")


def _create_checked(con: duckdb.DuckDBPyConnection, spec: Spec, required: Sequence[str], keys: str,
                    source: str = "raw_records", parameters: list | None = None,
                    all_null_is_bad: bool = False) -> None:
    """Temp table `checked`: `keys`, each field of `source` (by default the table `raw_records`,
    dropped afterwards) typed by the spec, and `bad`: whether the record misses a required field or
    holds a value that does not fit its type (or, with `all_null_is_bad`, has every field NULL).

    A value whose text passes `plain_fit_sql` fits its type, and so does one whose typed form
    (`json_transform`) writes back (`to_json`) to the very same JSON text; most values are one or
    the other. Only the rest are put to the exact rule `fits_sql`, which costs far more (a whole
    number written 5.0, a struct with absent keys, a string with escapes are such values, and may
    still fit).
    """
    typed, outputs, conditions = [], [], []
    for name in required:
        conditions.append(f"raw.{_quoted(name)} IS NULL OR raw.{_quoted(name)}::VARCHAR = 'null'")
    for index, (name, sub) in enumerate(spec.items()):
        field, typed_field = f"raw.{_quoted(name)}", f"raw._typed_{index}"
        typed.append(f"json_transform({field}, {_sql_string(json.dumps(sub))}) AS _typed_{index}")
        outputs.append(f"{typed_field} AS {_quoted(name)}")
        if sub == "JSON":
            continue
        written_back = f"to_json({typed_field})::VARCHAR = {field}::VARCHAR"
        plain = plain_fit_sql(f"{field}::VARCHAR", sub)
        conditions.append(f"CASE {f'WHEN {plain} THEN false ' if plain else ''}WHEN {written_back} THEN false"
                          f" ELSE NOT {fits_sql(field, sub)} END")
    if all_null_is_bad:
        conditions.append(" AND ".join(f"raw.{_quoted(name)} IS NULL" for name in spec))
    key_list = ", ".join(f"raw.{key.strip()}" for key in keys.split(",") if key.strip())
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE checked AS SELECT {key_list + ', ' if key_list else ''}{', '.join(outputs)},"
        f" coalesce({' OR '.join(f'({c})' for c in conditions) or 'false'}, false) AS bad"
        f" FROM (SELECT *, {', '.join(typed)} FROM {source} raw) raw",
        parameters or [],
    )
    if source == "raw_records":
        con.execute("DROP TABLE raw_records")


def _region_path(ctx: FileContext, spec: Spec, required: Sequence[str], checks: Sequence[Check]) -> bool:
    """Find the bad lines of a file inside DuckDB and reject only those; False (nothing accounted)
    when the file is not UTF-8 text or Python's rule accepts a line DuckDB doubts.

    Each line is a suspect when DuckDB does not read it as a JSON object, or it misses a required
    field, or a value does not fit (`fits_sql`); suspects go through the per-line rule
    (`_line_problem`), every other line is typed in bulk, then the checks run as on the other paths.
    """
    con = ctx.con
    try:
        con.execute(
            "CREATE OR REPLACE TEMP TABLE raw_lines AS SELECT unnest(range(1, len(parts) + 1)) AS line_no,"
            " unnest(parts) AS line FROM (SELECT string_split(content, chr(10)) AS parts FROM read_text(?))",
            [str(ctx.path)],
        )
    except duckdb.Error:
        return False
    try:
        # A file ending in a newline splits into one empty piece after it, which is not a line.
        con.execute("DELETE FROM raw_lines WHERE line_no > ? AND line = ''", [ctx.text_lines])
        con.execute(_DROP_BOM_SQL)
        if fetch_count(con, "SELECT count(*) FROM raw_lines") != ctx.text_lines:
            return False
        try:
            _create_raw_records(con, spec, "line_no")
            _create_checked(con, spec, required, "line_no")
            con.execute("DELETE FROM checked WHERE bad")
            suspects = con.execute(
                "SELECT line_no, line FROM raw_lines ANTI JOIN checked USING (line_no) ORDER BY line_no"
            ).fetchall()
        except duckdb.Error:
            return False  # nothing accounted yet: the Python path reads the file
        verdicts = []
        last_has_newline = _ends_with_newline(ctx.path)
        for line_no, line in suspects:
            # The line as the Python path reads it: with its newline, unless it is a last line without one.
            if line_no < ctx.text_lines or last_has_newline:
                line += "\n"
            verdict = _line_problem(line.encode("utf-8"), spec, required)
            if verdict is None:
                return False
            verdicts.append((line_no, verdict))
        for line_no, verdict in verdicts:
            _account_for(ctx, line_no, verdict)
        _checked_become_records(con)

        def text_of(line_no: int) -> str:
            line = con.execute("SELECT line FROM raw_lines WHERE line_no = ?", [line_no]).fetchall()[0][0]
            return line + "\n" if line_no < ctx.text_lines or last_has_newline else line

        _apply_checks(ctx, checks, text_of)
    finally:
        con.execute("DROP TABLE IF EXISTS raw_lines")
    return True


def _ends_with_newline(path) -> bool:
    with open(path, "rb") as handle:
        handle.seek(0, 2)
        if handle.tell() == 0:
            return False
        handle.seek(-1, 2)
        return handle.read(1) == b"\n"


def fetch_count(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None) -> int:
    return con.execute(sql, params or []).fetchall()[0][0]


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
    if not _region_path(ctx, spec, required, checks):
        _slow_path(ctx, spec, required, checks)
    return ctx.con.execute("SELECT count(*) FROM records").fetchall()[0][0]


class BulkJsonlIngester(JsonlTraceIngester):
    """A JSON-lines trace whose records become rows by SQL alone, so many files can share one read.

    Subclasses give `spec`, `required` and `checks` (see `load_records`) and write their rows from
    the view `keyed`: the table `records` with each record's `file_id`, `run_id` and `file_rank`
    (the rank a file's name gives, else NULL). The same SQL serves one file (`load`) and a batch
    of files (`batch`), so both store the same rows.
    """

    spec: ClassVar[Spec]
    required: ClassVar[tuple[str, ...]] = ()
    checks: ClassVar[tuple[Check, ...]] = ()
    # Run metadata a file contributes even when it holds no record.
    meta_without_records: ClassVar[dict] = {}
    # When each record becomes one row of one table holding every spec field: that table, and the
    # column each field is stored in. A batch is then read straight into the table and checked there
    # (`insert_typed_rows`, `create_stored_keyed`) instead of through `records`.
    row_table: ClassVar[str | None] = None
    row_columns: ClassVar[dict[str, str]] = {}

    def file_rank(self, path: Path) -> int | None:
        """The rank a file's name gives its records, or None."""
        return None

    def write(self, con: duckdb.DuckDBPyConnection) -> None:
        """Insert the rows of every record in `keyed` into the store's tables (by default one row of
        `row_table` per record)."""
        if self.row_table is None:
            raise NotImplementedError
        columns = ", ".join(_quoted(column) for column in self.row_columns.values())
        fields = ", ".join(_quoted(name) for name in self.row_columns)
        con.execute(f"INSERT INTO {self.row_table} (run_id, file_id, {columns}) SELECT run_id, file_id, {fields}"
                    " FROM keyed")

    def summaries(self, con: duckdb.DuckDBPyConnection) -> dict[int, tuple[int, dict]]:
        """Per file_id in `keyed`: (rows as the store's views count them, run metadata)."""
        raise NotImplementedError

    def load(self, ctx: FileContext) -> None:
        records = load_records(ctx, self.spec, self.required, self.checks)
        con = ctx.con
        rank = self.file_rank(ctx.path)
        con.execute(
            f"CREATE OR REPLACE TEMP VIEW keyed AS SELECT {int(ctx.file_id)}::BIGINT AS file_id,"
            f" {int(ctx.run_id)}::BIGINT AS run_id, {'NULL' if rank is None else int(rank)}::INTEGER AS file_rank,"
            " * FROM records"
        )
        ctx.begin_writes()
        self.write(con)
        rows, meta = self.summaries(con).get(ctx.file_id, (0, dict(self.meta_without_records)))
        ctx.rows += rows
        ctx.stored = records
        ctx.run_meta.update(meta)


def load_batch_records(con: duckdb.DuckDBPyConnection, paths: Sequence[str], spec: Spec,
                       required: Sequence[str] = (), checks: Sequence[Check] = (),
                       whole_json: bool = False, texts: dict[str, str] | None = None,
                       strict_counts: Callable[[], dict[str, int | None]] | dict[str, int | None] | None = None,
                       ) -> tuple[set[str], dict] | None:
    """Read many files in one pass into temp table `records`, each record with its file's `file_index`
    (temp table `record_files` names the files).

    With `whole_json`, the files are first read as JSON records (`read_json`, the cheaper read for
    files of many lines); a file's count of lines is then its count of records, blank lines not
    counted. Otherwise, or when that read fails (some line is not JSON), the files are read as text
    (`read_text`, far cheaper per file than `read_json` for tiny files; `texts` holds the text of
    files already read, which DuckDB then need not open) and split into lines; a line is blank
    (skipped, as `read_json` skips it), or a JSON object whose fields fit (`_create_raw_records`,
    `_create_checked`), or bad. Returns None when some file is not UTF-8 text (which one is
    unknown), else (the files holding a bad line or a record that fails a check, whose records are
    removed for the caller to read those files alone; {filename: (lines, blank lines)} of every
    file read).

    `strict_counts` gives `strict_records` of each file, as a dict when they are known, or as a call
    that waits for them while DuckDB reads (they are computed in another thread): with it and
    `whole_json`, the files are read with the spec's column types
    (`_create_typed_from_json`) and a file whose count is not DuckDB's (the strict decoder refused a
    value or a line) is bad, unless more than a quarter of the files are refused (a writer whose
    values the decoder refuses, e.g. 5.0 for an integer, everywhere): then the batch is read as
    JSON text and checked. A file with a line that is not JSON is bad, and the rest read without it.
    """
    con.execute("DROP TABLE IF EXISTS record_files")
    if whole_json and strict_counts is not None:
        known = strict_counts if isinstance(strict_counts, dict) else None
        typed = _create_typed_from_json(con, paths, spec, required, with_filename=True) \
            if known is None or typed_read_pays(paths, known) else None
        strict = known if known is not None else strict_counts()
        not_json = {path for path in paths if strict.get(path) == NOT_JSON_LINES}
        if typed is not None and few_refused(paths, strict):
            bad = {name for name in typed if strict.get(name) != typed[name]} | set(refused(paths, strict))
            missing = " OR ".join(f"{_quoted(name)} IS NULL" for name in required)
            if missing:
                bad |= {name for (name,) in con.execute(
                    f"SELECT DISTINCT filename FROM records JOIN record_files USING (file_index) WHERE {missing}"
                ).fetchall()}
            if bad:
                delete_records_of(con, bad)
            return _with_checks(con, checks, bad, {name: (records, 0) for name, records in typed.items()})
        con.execute("DROP TABLE IF EXISTS records")
        if not_json:
            rest = [path for path in paths if path not in not_json]
            if not rest:
                return not_json, {}  # no records: every file is read alone
            read = load_batch_records(con, rest, spec, required, checks, whole_json, texts,
                                      strict if len(rest) > 1 else None)
            return None if read is None else (read[0] | not_json, read[1])
    if whole_json and _create_checked_from_json(con, paths, spec, required, with_filename=True):
        counts, bad = {}, set()
        for name, records, bad_records in con.execute(
                "SELECT filename, count(*), count(*) FILTER (WHERE bad) FROM checked GROUP BY filename").fetchall():
            counts[name] = (records, 0)
            if bad_records:
                bad.add(name)
        if bad:
            con.execute("DELETE FROM checked WHERE filename IN (SELECT unnest(?::VARCHAR[]))", [sorted(bad)])
        _checked_become_records(con)
    else:
        read = _read_batch_as_lines(con, paths, spec, required, texts or {})
        if read is None:
            return None
        bad, counts = read
        con.execute("DROP TABLE checked")
    _records_keyed_by_index(con, paths)
    return _with_checks(con, checks, bad, counts)


def refused(paths: Sequence[str], strict: dict[str, int | None]) -> list[str]:
    """The files the strict decoder refused: a value it would not take, a line that is not JSON, or
    a file it could not read."""
    return [path for path in paths if strict.get(path) is None or strict[path] < 0]


def few_refused(paths: Sequence[str], strict: dict[str, int | None]) -> bool:
    """At most a quarter of the files refused: a typed read of the batch is kept, those read alone."""
    return 4 * len(refused(paths, strict)) <= len(paths)


def typed_read_pays(paths: Sequence[str], strict: dict[str, int | None]) -> bool:
    """Whether a typed read of `paths` can be kept, by what the strict decoder said of them: no line
    that is not JSON (the read would fail), and `few_refused`."""
    return NOT_JSON_LINES not in (strict.get(path) for path in paths) and few_refused(paths, strict)


def _with_checks(con: duckdb.DuckDBPyConnection, checks: Sequence[Check], bad: set[str],
                 counts: dict) -> tuple[set[str], dict]:
    """(bad, counts) with the files holding a record that fails one of `checks` added to `bad` and
    their records removed from `records`."""
    if checks:
        failing = {name for (name,) in con.execute(
            "SELECT DISTINCT filename FROM records JOIN record_files USING (file_index)"
            f" WHERE {' OR '.join(f'({c.bad_when})' for c in checks)}"
        ).fetchall()}
        if failing:
            delete_records_of(con, failing)
            bad |= failing
    return bad, counts


def _read_batch_as_lines(con: duckdb.DuckDBPyConnection, paths: Sequence[str], spec: Spec,
                         required: Sequence[str], texts: dict[str, str]) -> tuple[set[str], dict] | None:
    """Temp table `checked` of the files read as text and split into lines; (files with a bad line,
    {filename: (lines, blank lines)}), or None when some file is not UTF-8 text."""
    unread = [path for path in paths if path not in texts]
    known = [path for path in paths if path in texts]
    sources = []
    if known:
        sources.append("SELECT unnest(?::VARCHAR[]) AS filename, unnest(?::VARCHAR[]) AS content")
    if unread:
        sources.append("SELECT filename, content FROM read_text(?)")
    parameters = ([known, [texts[path] for path in known]] if known else []) + ([unread] if unread else [])
    try:
        con.execute(
            "CREATE OR REPLACE TEMP TABLE raw_lines AS SELECT filename, unnest(range(1, len(parts) + 1)) AS line_no,"
            " unnest(parts) AS line FROM (SELECT filename, CASE WHEN ends_with(content, chr(10))"
            " THEN list_slice(pieces, 1, len(pieces) - 1) ELSE pieces END AS parts"
            f" FROM (SELECT filename, content, string_split(content, chr(10)) AS pieces FROM ({' UNION ALL '.join(sources)})))",
            parameters,
        )
    except duckdb.Error:
        return None
    try:
        con.execute(_DROP_BOM_SQL)
        counts = {name: (lines, blank) for name, lines, blank in con.execute(
            "SELECT filename, count(*), count(*) FILTER (WHERE regexp_full_match(line, '\\s*')) FROM raw_lines"
            " GROUP BY filename").fetchall()}
        _create_raw_records(con, spec, "filename, line_no")
        _create_checked(con, spec, required, "filename, line_no")
        bad = {name for (name,) in con.execute(
            "SELECT DISTINCT filename FROM checked WHERE bad"
            " UNION SELECT DISTINCT filename FROM raw_lines l WHERE NOT regexp_full_match(line, '\\s*')"
            " AND NOT EXISTS (SELECT 1 FROM checked r WHERE r.filename = l.filename AND r.line_no = l.line_no)"
        ).fetchall()}
    finally:
        con.execute("DROP TABLE IF EXISTS raw_lines")
    con.execute("CREATE OR REPLACE TEMP TABLE records AS SELECT * EXCLUDE (bad, line_no) FROM checked"
                " WHERE filename NOT IN (SELECT unnest(?::VARCHAR[]))", [sorted(bad)])
    return bad, counts
