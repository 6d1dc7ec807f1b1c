"""The PolyTrace dataset JSON: the published workloads, one document keyed by step.

Single-turn tasks: `{"<step>": {"input": [prompt lengths], "output": [response lengths]}}`.
Multi-turn tasks: `{"<step>": [{"input": [...], "output": [...]}, ...]}`, one object per turn,
position i of each list belonging to trajectory i.

This format is one JSON document, not lines: its accounting unit is the step entry, so
`lines` counts step entries and a malformed entry is rejected with its 1-based position.

Pairing: when input and output have equal length, input[i] pairs with output[i]; when len(output) is
a multiple k of len(input) (n responses per prompt), output[j] pairs with input[j // k]; otherwise
both lists are kept as they are, rows past the shorter list carrying NULL for its length.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from polytrace_cli.errors import ErrorCode, IngestError
from polytrace_cli.ingest import json_documents
from polytrace_cli.ingest.base import FileContext, Ingester
from polytrace_cli.ingest.jsonl import fits_sql, value_problem
from polytrace_cli.ingest.registry import register

# About how many bytes of step entries are read into DuckDB at a time.
BATCH_BYTES = 1 << 20
_HEAD = re.compile(rb'^\s*\{\s*"\d+"\s*:\s*[\{\[]')


def _lengths_fit_sql(side: str) -> str:
    value = f"json_extract(t.obj, '$.{side}')"
    return f"json_type(t.obj, '$.{side}') = 'ARRAY' AND {fits_sql(value, ['INTEGER'])}"


def _list_problem(key: str, turns: list[str]) -> tuple[str, str]:
    """(reason, code) for a step entry whose input/output lists are not lists of INTEGER lengths."""
    for text in turns:
        try:
            turn = json.loads(text) if text else None
        except RecursionError:
            return f"step {key}: nested too deep to read", ErrorCode.INVALID_JSON
        if not isinstance(turn, dict):
            return f"step {key}: expected an object with input and output lists", ErrorCode.TYPE_ERROR
        for side in ("input", "output"):
            if not isinstance(turn.get(side), list):
                return f"step {key}: {side} must be a list of integers", ErrorCode.TYPE_ERROR
        problem = value_problem(turn, {"input": ["INTEGER"], "output": ["INTEGER"]}, "")
        if problem:
            code, reason = problem
            return f"step {key}: {reason.replace('field .', '')}", code
    return f"step {key}: input and output must be lists of integers", ErrorCode.TYPE_ERROR


@register
class DatasetJsonIngester(Ingester):
    name = "polytrace-dataset"
    version = "2"
    framework = "polytrace"
    description = 'PolyTrace dataset JSON ({"step": {"input": [...], "output": [...]}}, single- or multi-turn)'

    def sniff(self, path: Path, head: bytes) -> bool:
        return path.suffix == ".json" and bool(_HEAD.match(head)) and b'"input"' in head

    def load(self, ctx: FileContext) -> None:
        con = ctx.con
        keys, values = self._members(ctx)
        ctx.lines = len(keys)
        batches = []  # (first, last) member indexes of each batch, about BATCH_BYTES of entry text
        first, held = 0, 0
        for index, value in enumerate(values):
            held += len(value or "")
            if held >= BATCH_BYTES or index == len(values) - 1:
                batches.append((first, index + 1))
                first, held = index + 1, 0
        # A step entry that is a list of more than one turn makes the document multi-turn.
        multiturn = False
        for first, last in batches:
            self._entries(ctx, keys, values, first, last)
            multiturn = multiturn or con.execute(
                "SELECT coalesce(max(json_array_length(entry)) FILTER (WHERE json_type(entry) = 'ARRAY'), 0) > 1"
                " FROM entries").fetchall()[0][0]
        unpaired = 0
        for first, last in batches:
            self._entries(ctx, keys, values, first, last)
            unpaired += self._load_batch(ctx, multiturn)
        con.execute("DROP TABLE IF EXISTS entries")
        con.execute("DROP TABLE IF EXISTS turn_lists")
        ctx.stored = ctx.lines - ctx.rejected
        if unpaired:
            ctx.note(f"{unpaired} step(s) have input and output lists that do not pair; both kept as they are")
        ctx.run_meta["multiturn"] = bool(multiturn)

    def _load_batch(self, ctx: FileContext, multiturn: bool) -> int:
        """Store the step entries in `entries`, rejecting the bad ones; the number of steps whose
        input and output lists do not pair."""
        con = ctx.con
        for position, key, code in con.execute(
                "SELECT position, key, problem FROM entries WHERE problem IS NOT NULL ORDER BY position").fetchall():
            reason = "is not UTF-8 text" if code == ErrorCode.ENCODING_ERROR else "is not valid JSON"
            ctx.reject(position, f"step {key}: the entry {reason}", key, code=code)
        con.execute("DELETE FROM entries WHERE problem IS NOT NULL")
        # Lengths must be whole numbers an INTEGER holds (the rule of every JSON trace), else the entry is rejected.
        fits = " AND ".join(_lengths_fit_sql(side) for side in ("input", "output"))
        con.execute(
            """
            CREATE OR REPLACE TEMP TABLE turn_lists AS
            SELECT position, step, key, t.turn, t.obj,
                   CASE WHEN FITS THEN json_transform(json_extract(t.obj, '$.input'), '["BIGINT"]') END AS input,
                   CASE WHEN FITS THEN json_transform(json_extract(t.obj, '$.output'), '["BIGINT"]') END AS output
            FROM (
                SELECT position, step, key,
                       CASE WHEN json_type(entry) = 'ARRAY'
                            THEN [{'turn': i - 1, 'obj': json_extract(entry, '$[' || (i - 1) || ']')}
                                  FOR i IN range(1, json_array_length(entry)::BIGINT + 1)]
                            ELSE [{'turn': 0, 'obj': entry}] END AS per_turn,
                       json_type(entry) = 'ARRAY' AS multiturn
                FROM entries
            ), unnest(per_turn) AS u(t)
            """.replace("FITS", fits)
        )
        bad = con.execute(
            """
            SELECT position, any_value(key), count(*) FILTER (WHERE input IS NULL OR output IS NULL) AS broken,
                   bool_or(step IS NULL) AS bad_key,
                   list(obj::VARCHAR ORDER BY turn) FILTER (WHERE input IS NULL OR output IS NULL) AS broken_turns
            FROM turn_lists GROUP BY position HAVING broken > 0 OR bad_key
            UNION ALL
            SELECT position, key, 1, step IS NULL, [] FROM entries
            WHERE position NOT IN (SELECT position FROM turn_lists)
            ORDER BY 1
            """
        ).fetchall()
        for position, key, _broken, bad_key, broken_turns in bad:
            if bad_key:
                reason, code = f"step key {key!r} is not an integer", ErrorCode.TYPE_ERROR
            else:
                reason, code = _list_problem(key, broken_turns)
            ctx.reject(position, reason, key, code=code)
        if bad:
            con.execute("DELETE FROM turn_lists WHERE position IN (SELECT unnest(?))", [[b[0] for b in bad]])
        if multiturn:
            self._load_multiturn(ctx)
        else:
            self._load_single_turn(ctx)
        return con.execute(
            "SELECT count(*) FROM turn_lists WHERE len(input) != len(output) AND"
            " (len(input) = 0 OR len(output) % len(input) != 0)"
        ).fetchall()[0][0]

    @staticmethod
    def _members(ctx: FileContext) -> tuple[list[str], list[str | None]]:
        """(keys, entry texts) of the document's step entries, in order, cut apart by scanning
        (`object_members`): DuckDB is handed a batch of entries at a time, never the whole document
        (whose every copy per key took 13 GB for 50 MB). An entry holding bytes that are not UTF-8
        is None."""
        text = ctx.path.read_bytes().decode("utf-8", errors="surrogateescape")
        members = json_documents.object_members(text)
        if members is None:
            try:
                json.loads(text)
            except RecursionError:
                raise IngestError("not a valid JSON document: nested too deep to read", ErrorCode.INVALID_JSON) from None
            except ValueError as error:
                raise IngestError(f"not a valid JSON document: {error}", ErrorCode.INVALID_JSON) from None
            raise IngestError("the document is not a JSON object keyed by step", ErrorCode.NOT_AN_OBJECT)
        keys = [key.encode("utf-8", "surrogateescape").decode("utf-8", "replace") for key, _, _ in members]
        values = []
        for _, start, end in members:
            value = text[start:end]
            values.append(None if any("\udc80" <= char <= "\udcff" for char in value) else value)
        return keys, values

    @staticmethod
    def _entries(ctx: FileContext, keys: list[str], values: list[str | None], first: int, last: int) -> None:
        """Temp table `entries` (position, key, step, entry JSON, problem) of members first..last: an
        entry that is not JSON, or holds bytes that are not UTF-8, has its problem's code."""
        import pyarrow as pa

        table = pa.table({"position": pa.array(range(first + 1, last + 1), pa.int64()),
                          "key": pa.array(keys[first:last], pa.string()),
                          "value": pa.array(values[first:last], pa.string())})
        ctx.con.register("dataset_members", table)
        try:
            ctx.con.execute(
                f"""
                CREATE OR REPLACE TEMP TABLE entries AS
                SELECT position, key,
                       CASE WHEN regexp_full_match(trim(key), '-?[0-9]+') THEN try_cast(key AS INTEGER) END AS step,
                       CASE WHEN json_valid(value) THEN value::JSON END AS entry,
                       CASE WHEN value IS NULL THEN '{ErrorCode.ENCODING_ERROR}' WHEN NOT json_valid(value)
                            THEN '{ErrorCode.INVALID_JSON}'
                       END AS problem
                FROM dataset_members
                """)
        finally:
            ctx.con.unregister("dataset_members")

    @staticmethod
    def _load_single_turn(ctx: FileContext) -> None:
        ctx.insert(
            """
            INSERT INTO sample_rows (run_id, file_id, step, prompt_idx, sample_idx, prompt_len, response_len)
            SELECT ?, ?, step,
                   CASE WHEN per_prompt > 0 THEN i // per_prompt ELSE i END,
                   CASE WHEN per_prompt > 0 THEN i % per_prompt ELSE 0 END,
                   CASE WHEN per_prompt > 0 THEN input[i // per_prompt + 1] ELSE input[i + 1] END,
                   output[i + 1]
            FROM (
                SELECT step, input, output,
                       CASE WHEN len(input) > 0 AND len(output) % len(input) = 0
                            THEN len(output) // len(input) ELSE 0 END AS per_prompt,
                       unnest(range(greatest(len(input), len(output)))) AS i
                FROM turn_lists
            )
            """,
            [ctx.run_id, ctx.file_id],
        )

    @staticmethod
    def _load_multiturn(ctx: FileContext) -> None:
        ctx.con.execute(
            """
            CREATE OR REPLACE TEMP TABLE dataset_turns AS
            SELECT step, turn, unnest(range(greatest(len(input), len(output)))) AS i, input, output
            FROM turn_lists
            """
        )
        ctx.insert(
            """
            INSERT INTO turns (run_id, file_id, step, prompt_idx, sample_idx, turn, prompt_tokens, completion_tokens)
            SELECT ?, ?, step, i, 0, turn, input[i + 1], output[i + 1] FROM dataset_turns
            """,
            [ctx.run_id, ctx.file_id],
        )
        ctx.insert(
            """
            INSERT INTO sample_rows (run_id, file_id, step, prompt_idx, sample_idx, prompt_len, response_len, turns)
            SELECT ?, ?, step, i, 0,
                   any_value(input[i + 1]) FILTER (WHERE turn = 0),
                   sum(output[i + 1])::INTEGER, count(output[i + 1])::INTEGER
            FROM dataset_turns GROUP BY step, i
            """,
            [ctx.run_id, ctx.file_id],
        )
