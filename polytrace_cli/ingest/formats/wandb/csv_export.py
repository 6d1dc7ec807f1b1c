"""A CSV exported from the wandb UI: a `Step` column and one column per logged key.

Panel exports name their columns `<run name> - <key>`, with `<run name> - <key>__MIN` and
`__MAX` companions (the smoothing band); the plain column is the value, the companions are
dropped. One file is one run: an export holding several run names is rejected as a whole, naming
them. Empty cells are missing values, not zeros, and produce no row. Keys map as in TensorBoard:
OpenRLHF's `train/` prefix is dropped.

Read in bulk: DuckDB `read_csv` (every column as text) and UNPIVOT into one (step, key, cell) row
per present value; numeric cells become `value`, others `text_value`. The accounting unit is the
CSV line: the header is ignored under its own rule (lines above it, a note a tool wrote, under
another: the header is the first of the first 20 lines naming a Step column), a row with no values
under a third; a row whose Step is not an integer is rejected, and so is a row holding a number no
double holds (`1e400` reads as infinity; a written `inf` stays). A header column whose name holds
NUL bytes (damage) is left out with a note, its name never stored. A file the bulk reader refuses (a NUL byte, a
byte that is not UTF-8, a stray quote, a cut last line) is read line by line: each bad line is
rejected with its reason and every other row is read as above.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import duckdb

from polytrace_cli.errors import ErrorCode, IngestError
from polytrace_cli.ingest.base import FileContext, Ingester, step_problem_sql, step_sql
from polytrace_cli.ingest.formats.tensorboard.events import claim_framework, framework_of_keys
from polytrace_cli.ingest.registry import register

STEP_COLUMNS = ("Step", "_step")
COMPANION_SUFFIXES = ("__MIN", "__MAX")
RUN_SEPARATOR = " - "


# How many lines before the header sniffing and reading look at (a note or blank lines a tool wrote
# above the export).
HEADER_LINES = 20


def _header(head: bytes) -> tuple[int, list[str]]:
    """(index of the header line, its columns): the first of the first HEADER_LINES lines that names
    a Step column; (0, []) when none does."""
    for index, line in enumerate(head.split(b"\n")[:HEADER_LINES]):
        text = line.decode("utf-8", errors="replace").lstrip("\ufeff").rstrip("\r")
        try:
            columns = next(csv.reader(io.StringIO(text)), [])
        except csv.Error:
            continue
        if any(c in STEP_COLUMNS for c in columns):
            return index, columns
    return 0, []


def split_columns(columns: list[str]) -> tuple[str, dict[str, str], list[str]]:
    """(step column, {column: key} of the value columns, run names found in the prefixes)."""
    step_column = next(c for c in columns if c in STEP_COLUMNS)
    values = [c for c in columns if c != step_column and not c.endswith(COMPANION_SUFFIXES)]
    prefixed = all(RUN_SEPARATOR in c for c in values) and values
    runs = sorted({c.split(RUN_SEPARATOR, 1)[0] for c in values}) if prefixed else []
    keys = {c: (c.split(RUN_SEPARATOR, 1)[1] if prefixed else c) for c in values}
    return step_column, keys, runs


@register
class WandbCsvIngester(Ingester):
    name = "wandb-csv"
    version = "3"
    framework = None
    description = "CSV exported from the wandb UI (Step column, one column per key, __MIN/__MAX dropped)"

    def sniff(self, path: Path, head: bytes) -> bool:
        return path.suffix.lower() == ".csv" and bool(_header(head)[1])

    def load(self, ctx: FileContext) -> None:
        con = ctx.con
        skip = _header(ctx.head.removeprefix(b"\xef\xbb\xbf"))[0]
        try:
            con.execute(
                "CREATE OR REPLACE TEMP TABLE wandb_csv AS SELECT row_number() OVER () AS row_no, *"
                " FROM read_csv(?, header = true, all_varchar = true, delim = ',', quote = '\"', skip = ?)",
                [str(ctx.path), skip],
            )
            rows = con.execute("SELECT count(*) FROM wandb_csv").fetchall()[0][0]
            damaged = 0
        except duckdb.Error:
            rows, damaged = _read_line_by_line(ctx, skip)
        columns = [row[0] for row in con.execute("DESCRIBE wandb_csv").fetchall()][1:]
        if not any(c in STEP_COLUMNS for c in columns):
            raise IngestError("the CSV header names no Step column", ErrorCode.MISSING_FIELD)
        step_column, keys, runs = split_columns(columns)
        damaged += sum("\0" in c for c in keys)
        keys = {c: k for c, k in keys.items() if "\0" not in c}
        if damaged:
            ctx.note(f"{damaged} column name(s) of the header hold NUL bytes (a damaged header): their values"
                     " are not stored")
        if len(runs) > 1:
            raise IngestError(f"the export holds {len(runs)} runs ({', '.join(runs)}); export one run per file",
                              ErrorCode.CONSTRAINT_ERROR)
        ctx.lines = rows + 1 + skip
        ctx.ignore("CSV header")
        ctx.ignore("line before the CSV header", skip)
        line_of_row = 1 + skip  # a row's line number is its row_no plus this
        _reject_rows_with_nul(ctx, columns, line_of_row)
        if not keys:
            ctx.ignore("row with no values", rows)
            return
        mapping = ", ".join(f"({_sql(c)}, {_sql(k)})" for c, k in keys.items())
        value_columns = ", ".join(_ident(c) for c in keys)
        con.execute(
            f"""
            CREATE OR REPLACE TEMP TABLE wandb_csv_cells AS
            WITH cells AS (
                UNPIVOT (SELECT row_no, {_ident(step_column)} AS step_text, {value_columns} FROM wandb_csv)
                ON {value_columns} INTO NAME col VALUE cell
            )
            SELECT row_no, {step_sql("step_text")} AS step, m.key,
                   TRY_CAST(cell AS DOUBLE) AS value,
                   CASE WHEN TRY_CAST(cell AS DOUBLE) IS NULL THEN cell END AS text_value,
                   isinf(TRY_CAST(cell AS DOUBLE)) AND NOT regexp_matches(lower(trim(cell)), '^[-+]?inf(inity)?$')
                       AS beyond_double
            FROM cells JOIN (VALUES {mapping}) AS m(col, key) USING (col)
            WHERE trim(cell) != ''
            """
        )
        # A number no double holds (1e400) reads as ±inf: its row is out of range, never stored as infinity.
        for row_no, cell in con.execute(
                "SELECT row_no, min(key) FROM wandb_csv_cells WHERE beyond_double AND step IS NOT NULL"
                " GROUP BY row_no ORDER BY row_no").fetchall():
            ctx.reject(row_no + line_of_row, f"the value of {cell} is a number beyond a double", None,
                       code=ErrorCode.OUT_OF_RANGE)
        con.execute("DELETE FROM wandb_csv_cells WHERE row_no IN"
                    " (SELECT row_no FROM wandb_csv_cells WHERE beyond_double AND step IS NOT NULL)")
        for row_no, step_text, code in con.execute(
            f"SELECT row_no, {_ident(step_column)}, {step_problem_sql(_ident(step_column))} FROM wandb_csv"
            f" WHERE {step_sql(_ident(step_column))} IS NULL ORDER BY row_no"
        ).fetchall():
            what = "is outside the step range" if code == ErrorCode.OUT_OF_RANGE else "is not an integer"
            ctx.reject(row_no + line_of_row, f"{step_column} {what}: {step_text!r}", step_text, code=code)
        with_values = con.execute(
            "SELECT count(DISTINCT row_no) FROM wandb_csv_cells WHERE step IS NOT NULL").fetchall()[0][0]
        ctx.stored = with_values
        ctx.ignore("row with no values", rows - with_values - ctx.rejected)
        raw_keys = [row[0] for row in con.execute("SELECT DISTINCT key FROM wandb_csv_cells").fetchall()]
        claim_framework(ctx, framework_of_keys(raw_keys))
        ctx.insert(
            f"""
            INSERT INTO step_metrics (run_id, segment, step, key, value, text_value, file_id, line_no)
            WITH steps AS (
                SELECT row_no, {step_sql(_ident(step_column))} AS step
                FROM wandb_csv
            ), went_back AS (
                SELECT row_no, coalesce(step < lag(step) OVER (ORDER BY row_no), false)::INTEGER AS back
                FROM steps WHERE step IS NOT NULL
            ), segments AS (
                SELECT row_no, (sum(back) OVER (ORDER BY row_no))::INTEGER AS segment FROM went_back
            )
            SELECT ?, segment, step, CASE WHEN starts_with(key, 'train/') THEN key[7:] ELSE key END,
                   value, text_value, ?, row_no + ?
            FROM wandb_csv_cells JOIN segments USING (row_no)
            WHERE step IS NOT NULL
            """,
            [ctx.run_id, ctx.file_id, line_of_row],
        )
        if runs:
            ctx.run_meta["wandb_run_name"] = runs[0]


def _reject_rows_with_nul(ctx: FileContext, columns: list[str], line_of_row: int) -> None:
    """Reject (and drop from `wandb_csv`) each row with a NUL byte in a cell: a damaged line."""
    holds_nul = " OR ".join(f"coalesce(contains({_ident(c)}, chr(0)), false)" for c in columns)
    for row_no, *cells in ctx.con.execute(
            f"SELECT row_no, * EXCLUDE (row_no) FROM wandb_csv WHERE {holds_nul} ORDER BY row_no").fetchall():
        ctx.reject(row_no + line_of_row, "holds a NUL byte", ",".join("" if c is None else c for c in cells),
                   code=ErrorCode.UNPARSABLE_LINE)
    ctx.con.execute(f"DELETE FROM wandb_csv WHERE {holds_nul}")


def _read_line_by_line(ctx: FileContext, skip: int) -> tuple[int, int]:
    """Temp table `wandb_csv` (row_no, then every column as text) from the lines of a CSV that the
    bulk reader refused; each line that is not UTF-8 text, holds a NUL byte, is not one strict CSV
    row (a stray quote, a line cut short) or has another number of fields than the header is
    rejected. Returns (the number of data lines, good or not; the header columns named with a NUL byte,
    left out); a row's line is row_no + 1 + skip (the lines before the header)."""
    import pyarrow as pa

    with open(ctx.path, "rb") as handle:
        lines = handle.read().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    lines = lines[skip:]
    header = _parse_row(lines[0].removeprefix(b"\xef\xbb\xbf"), nul_allowed=True) if lines else None
    if not isinstance(header, list) or not header:
        raise IngestError("the CSV header is not one readable CSV row", ErrorCode.UNPARSABLE_LINE)
    good: list[tuple[int, list[str]]] = []
    for index, raw in enumerate(lines[1:], start=2):
        line_no = index + skip
        row = _parse_row(raw)
        if isinstance(row, str):
            ctx.reject(line_no, row, raw, code=ErrorCode.ENCODING_ERROR if row.startswith("not UTF-8") else ErrorCode.UNPARSABLE_LINE)
        elif len(row) != len(header):
            ctx.reject(line_no, f"row has {len(row)} fields, the header {len(header)}", raw, code=ErrorCode.UNPARSABLE_LINE)
        else:
            good.append((index - 1, row))
    table = pa.table({"row_no": pa.array([n for n, _ in good], pa.int64()),
                      **{name: pa.array([row[i] for _, row in good], pa.string()) for i, name in enumerate(header)
                         if "\0" not in name}})
    ctx.con.register("wandb_csv_lines", table)
    try:
        ctx.con.execute("CREATE OR REPLACE TEMP TABLE wandb_csv AS SELECT * FROM wandb_csv_lines")
    finally:
        ctx.con.unregister("wandb_csv_lines")
    return len(lines) - 1, sum("\0" in name for name in header)


def _parse_row(raw: bytes, nul_allowed: bool = False) -> list[str] | str:
    """The fields of one CSV line, or why it is not one strict CSV row (a NUL byte makes a damaged
    row, unless `nul_allowed`: a header's columns named with one are left out by the caller)."""
    try:
        text = raw.decode("utf-8").removesuffix("\r")
    except UnicodeDecodeError:
        return "not UTF-8 text"
    if "\0" in text and not nul_allowed:
        return "holds a NUL byte"
    try:
        rows = list(csv.reader([text], strict=True))
    except csv.Error as error:
        return f"not a CSV row: {error}"
    return rows[0] if len(rows) == 1 else "not a CSV row"


def _sql(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _ident(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'
