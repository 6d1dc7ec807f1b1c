"""wandb tables (`files/media/table/**/*.table.json`): logged generations as samples.

A table file is `{"columns": [...], "data": [[...], ...]}`. Two layouts hold generations:

- wide, as verl's validation logger writes it: `step, input_1, output_1, score_1, input_2, ...`,
  one row per validation step, one (input_i, output_i) pair per logged sample;
- long: one row per sample with `input`/`prompt` and `output`/`response` (and optionally `step`).

Each generation becomes a `samples` row, with its score when the table has one, and lengths
estimated from the text (tokens ≈ ceil(characters / 4), `length_estimated = true`); `validate` is
true when the table's key (its path under `media/table`, e.g. `val/generations`) names validation. The step is the row's `step`
column, else the step in the file name (`{key}_{step}_{hash}.table.json`).

wandb writes a new snapshot file each time a table is logged, and verl's validation table is
cumulative: each snapshot repeats every earlier row. A snapshot therefore stores only the rows
past the previous snapshot of the same key (the sibling file with the largest lower step), when
that snapshot's rows are exactly its leading rows; repeated rows are ignored under a named rule.
Tables without generation columns are read and ignored.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from polytrace_cli.errors import ErrorCode, IngestError
from polytrace_cli.ingest.base import RAW_EXCERPT_CHARS, FileContext, Ingester, step_problem_sql, step_sql
from polytrace_cli.ingest.registry import register

SNAPSHOT_NAME = re.compile(r"^(?P<key>.+)_(?P<step>\d+)_(?P<hash>[0-9a-f]+)\.table\.json$")
WIDE_INPUT = re.compile(r"^input_(\d+)$")
CHARS_PER_TOKEN = 4
# About how many bytes of rows are read into DuckDB at a time.
BATCH_BYTES = 1 << 20


def _read_table(path: Path) -> tuple[list, list]:
    """(columns, data) of a table file. Bytes that are not UTF-8 are kept as lone surrogates
    (`surrogateescape`), for `load` to find the rows that hold them."""
    try:
        document = json.loads(path.read_bytes().decode("utf-8", errors="surrogateescape"))
    except json.JSONDecodeError as error:
        raise IngestError(f"wandb table is not valid JSON: {error.msg} at line {error.lineno}",
                          ErrorCode.INVALID_JSON) from None
    except RecursionError:
        raise IngestError("wandb table is nested too deep to read", ErrorCode.INVALID_JSON) from None
    if not isinstance(document, dict) or not isinstance(document.get("columns"), list) \
            or not isinstance(document.get("data"), list):
        raise IngestError('wandb table must be an object with "columns" and "data" lists', ErrorCode.MISSING_FIELD)
    return document["columns"], document["data"]


def previous_snapshot(path: Path) -> Path | None:
    """The sibling snapshot of the same table key with the largest step below this file's."""
    match = SNAPSHOT_NAME.match(path.name)
    if not match:
        return None
    step, best = int(match["step"]), None
    for sibling in path.parent.glob(f"{glob_escape(match['key'])}_*.table.json"):
        other = SNAPSHOT_NAME.match(sibling.name)
        if other and other["key"] == match["key"] and int(other["step"]) < step:
            if best is None or int(other["step"]) > best[0]:
                best = (int(other["step"]), sibling)
    return best[1] if best else None


def glob_escape(text: str) -> str:
    """`text` with glob metacharacters escaped."""
    return re.sub(r"([*?\[])", r"[\1]", text)


def generation_pairs(columns: list) -> list[tuple[int, int, int, int]]:
    """(prompt_idx, input, output, score column) per logged sample; 0-based columns, score -1 when
    absent, prompt_idx -1 for the long layout; empty when the table holds no generations."""
    names = [str(c) for c in columns]
    pairs = []
    for position, name in enumerate(names):
        match = WIDE_INPUT.match(name)
        if match and f"output_{match[1]}" in names:
            score = names.index(f"score_{match[1]}") if f"score_{match[1]}" in names else -1
            pairs.append((int(match[1]) - 1, position, names.index(f"output_{match[1]}"), score))
    if pairs:
        return pairs
    for prompt_name, response_name in (("input", "output"), ("prompt", "response")):
        if prompt_name in names and response_name in names:
            score = names.index("score") if "score" in names else -1
            return [(-1, names.index(prompt_name), names.index(response_name), score)]
    return []


@register
class WandbTableIngester(Ingester):
    name = "wandb-table"
    version = "3"
    framework = None
    description = "wandb media table (*.table.json): logged generations as samples with estimated lengths"

    def sniff(self, path: Path, head: bytes) -> bool:
        return path.name.endswith(".table.json")

    def load(self, ctx: FileContext) -> None:
        columns, data = _read_table(ctx.path)
        ctx.lines = len(data)
        pairs = generation_pairs(columns)
        if not pairs:
            ctx.ignore("table without generation columns", len(data))
            return
        repeated = self._repeated_rows(ctx.location, columns, data)
        ctx.ignore("row repeated from an earlier snapshot", repeated)
        names = [str(c) for c in columns]
        match = SNAPSHOT_NAME.match(ctx.location.name)
        file_step = int(match["step"]) if match else None
        if "step" in names:
            step_text = f"json_extract_string(row, '$[{names.index('step')}]')"
        else:  # the file name's step: digits only (SNAPSHOT_NAME), safe to write into the SQL
            step_text = "NULL::VARCHAR" if file_step is None else f"'{file_step}'"
        table_key = ctx.location.name.split("_")[0] if not match else match["key"]
        media_parts = ctx.location.parent.parts
        if "table" in media_parts:
            media_parts = media_parts[len(media_parts) - media_parts[::-1].index("table"):]
        validate = any(part.lower().startswith("val") for part in (*media_parts, table_key))
        con = ctx.con
        # Each row goes to DuckDB as its own JSON text, a batch of about BATCH_BYTES at a time (never
        # the whole document: every row's extraction from a 50 MB document failed for memory); a row
        # holding a byte that is not UTF-8 is rejected.
        import pyarrow as pa

        pair_values = ", ".join(f"({p}, {i}, {o}, {s})" for p, i, o, s in pairs)
        # The rows keep an excerpt of their text (for a rejection), their samples only the lengths.
        con.execute("CREATE OR REPLACE TEMP TABLE wandb_table_rows (row_no BIGINT, row VARCHAR, step INTEGER,"
                    " step_text VARCHAR, step_code VARCHAR, complete BOOLEAN)")
        con.execute("CREATE OR REPLACE TEMP TABLE wandb_table_samples (row_no BIGINT, prompt_idx INTEGER,"
                    " prompt_len DOUBLE, response_len DOUBLE, score DOUBLE)")
        row_numbers, texts, held = [], [], 0
        for row_no in range(repeated + 1, len(data) + 1):
            text = json.dumps(data[row_no - 1], ensure_ascii=False)
            if any("\udc80" <= char <= "\udcff" for char in text):
                ctx.reject(row_no, "row is not UTF-8 text", json.dumps(data[row_no - 1]), code=ErrorCode.ENCODING_ERROR)
            else:
                row_numbers.append(row_no)
                texts.append(text)
                held += len(text)
            data[row_no - 1] = None  # each row's objects go once its text is made
            if held >= BATCH_BYTES or row_no == len(data):
                con.register("wandb_table_texts", pa.table({"row_no": pa.array(row_numbers, pa.int64()),
                                                            "row_text": pa.array(texts, pa.string())}))
                try:
                    con.execute(
                        f"""
                        CREATE OR REPLACE TEMP TABLE wandb_table_batch AS
                        SELECT row_no, row_text::JSON AS row FROM wandb_table_texts
                        """)
                    con.execute(
                        f"""
                        INSERT INTO wandb_table_rows
                        SELECT row_no, left(row::VARCHAR, {RAW_EXCERPT_CHARS}), {step_sql(step_text)}, {step_text},
                               {step_problem_sql(step_text)}, json_array_length(row) = {len(columns)}
                        FROM wandb_table_batch
                        """
                    )
                    con.execute(
                        f"""
                        INSERT INTO wandb_table_samples
                        SELECT row_no, p.prompt_idx,
                               ceil(length(json_extract_string(row, '$[' || p.input_col || ']')) / {CHARS_PER_TOKEN}),
                               ceil(length(json_extract_string(row, '$[' || p.output_col || ']')) / {CHARS_PER_TOKEN}),
                               CASE WHEN p.score_col >= 0
                                    THEN TRY_CAST(json_extract_string(row, '$[' || p.score_col || ']') AS DOUBLE) END
                        FROM wandb_table_batch, (VALUES {pair_values}) AS p(prompt_idx, input_col, output_col, score_col)
                        WHERE json_extract_string(row, '$[' || p.output_col || ']') IS NOT NULL
                        """
                    )
                finally:
                    con.unregister("wandb_table_texts")
                row_numbers, texts, held = [], [], 0
        del data
        for row_no, row, complete, text, code in con.execute(
            "SELECT row_no, row::VARCHAR, complete, step_text, step_code FROM wandb_table_rows"
            " WHERE step IS NULL OR NOT complete ORDER BY row_no"
        ).fetchall():
            if complete and text is not None:
                what = "is outside the step range" if code == ErrorCode.OUT_OF_RANGE else "is not an integer"
                ctx.reject(row_no, f"step {what}: {text!r}", row, code=code)
            elif complete:
                ctx.reject(row_no, "row has no step (no step column and none in the file name)", row,
                           code=ErrorCode.MISSING_FIELD)
            else:
                ctx.reject(row_no, f"row does not have the table's {len(columns)} columns", row,
                           code=ErrorCode.CONSTRAINT_ERROR)
        con.execute("DROP TABLE IF EXISTS wandb_table_batch")
        ctx.insert(
            """
            INSERT INTO sample_rows (run_id, file_id, step, prompt_idx, sample_idx, prompt_len, response_len,
                                 validate, length_estimated, score)
            SELECT ?, ?, r.step,
                   CASE WHEN s.prompt_idx >= 0 THEN s.prompt_idx
                        ELSE row_number() OVER (PARTITION BY r.step ORDER BY r.row_no) - 1 END,
                   0, s.prompt_len, s.response_len, ?, true, s.score
            FROM wandb_table_rows r JOIN wandb_table_samples s USING (row_no)
            WHERE r.step IS NOT NULL AND r.complete
            """,
            [ctx.run_id, ctx.file_id, validate],
        )
        ctx.stored = ctx.lines - repeated - ctx.rejected
        ctx.format_version = "wide" if pairs[0][0] >= 0 else "long"

    @staticmethod
    def _repeated_rows(path: Path, columns: list, data: list) -> int:
        """How many leading rows repeat the previous snapshot of a cumulative table (0 if none)."""
        previous = previous_snapshot(path)
        if previous is None:
            return 0
        try:
            previous_columns, previous_data = _read_table(previous)
        except IngestError:
            return 0
        if previous_columns != columns or data[:len(previous_data)] != previous_data:
            return 0
        return len(previous_data)
