"""verl rollout dumps: `{step}.jsonl` under `trainer.rollout_data_dir` or `validation_data_dir`.

One object per generated sample: `input` (prompt text), `output` (response text), `score`, `step`,
optionally `gts` and extra reward fields (FORMATS.md, section 3). Each line becomes one `samples`
row. The dump holds no token counts, so lengths are estimates, marked `length_estimated = true`:

    prompt_len   = ceil(characters(input)  / 4)
    response_len = ceil(characters(output) / 4)

or, when a tokenizer is set for the ingest (`base.counting_tokens_with`, the `--tokenizer` option of
`polytrace ingest`), the number of tokens that tokenizer gives each text, still marked as estimated (the
run's own tokenizer and chat template may differ).

The step is the line's `step` field, else the file name's number. Samples are grouped into prompts
by identical `input` text in order of first appearance (`prompt_idx`, from 0) and numbered within
the prompt (`sample_idx`, from 0). A file under a folder whose name contains `val` holds
validation samples (`validate = true`).
"""

from __future__ import annotations

import re
from pathlib import Path

from polytrace_cli.ingest.base import FileContext, Ingester, current_tokenizer
from polytrace_cli.ingest.jsonl import Check, load_records
from polytrace_cli.ingest.registry import register

CHARS_PER_TOKEN = 4
_FILE_NAME = re.compile(r"^\d+\.jsonl$")
_SPEC = {"input": "VARCHAR", "output": "VARCHAR", "score": "DOUBLE", "step": "INTEGER"}

def _token_counts(tokenizer, texts: list[str]) -> list[int]:
    """Tokens per text under `tokenizer` (no special tokens added)."""
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [len(ids) for ids in encoded]


@register
class VerlRolloutIngester(Ingester):
    name = "verl-rollout"
    version = "2"
    framework = "verl"
    description = "verl rollout/validation dump `{step}.jsonl` (samples with estimated lengths)"

    def sniff(self, path: Path, head: bytes) -> bool:
        if not _FILE_NAME.match(path.name):
            return False
        # The first record may come after start-up noise (a warning printed into the dump).
        return any(line.lstrip().startswith(b"{") and b'"input"' in line and b'"output"' in line
                   for line in head.split(b"\n"))

    def read_options(self) -> str:
        tokenizer = current_tokenizer()
        if tokenizer is None:
            return f"characters/{CHARS_PER_TOKEN}"
        return f"tokenizer={getattr(tokenizer, 'name_or_path', None) or type(tokenizer).__name__}"

    def load(self, ctx: FileContext) -> None:
        con = ctx.con
        records = load_records(ctx, _SPEC, required=("input", "output"),
                               checks=(Check("step < 0", "field step: negative"),))
        file_step = int(ctx.path.stem)
        validate = any("val" in part.lower() for part in ctx.path.parent.parts[-1:])
        if "line_no" not in [c[0] for c in con.execute("DESCRIBE records").fetchall()]:
            con.execute("CREATE OR REPLACE TEMP TABLE records AS SELECT row_number() OVER () AS line_no, * FROM records")
        tokenizer = current_tokenizer()
        if tokenizer is not None and records:
            rows = con.execute("SELECT line_no, input, output FROM records ORDER BY line_no").fetchall()
            prompt_tokens = _token_counts(tokenizer, [r[1] for r in rows])
            response_tokens = _token_counts(tokenizer, [r[2] for r in rows])
            con.execute("CREATE OR REPLACE TEMP TABLE rollout_tokens (line_no BIGINT, p INTEGER, r INTEGER)")
            con.executemany("INSERT INTO rollout_tokens VALUES (?, ?, ?)",
                            [(r[0], p, t) for r, p, t in zip(rows, prompt_tokens, response_tokens)])
            lengths = "t.p, t.r"
            join = "JOIN rollout_tokens t USING (line_no)"
            how = "tokens of the given tokenizer"
        else:
            lengths = f"CAST(ceil(length(input) / {CHARS_PER_TOKEN}) AS INTEGER), " \
                      f"CAST(ceil(length(output) / {CHARS_PER_TOKEN}) AS INTEGER)"
            join = ""
            how = f"characters / {CHARS_PER_TOKEN}"
        ctx.insert(
            f"""
            INSERT INTO sample_rows (run_id, file_id, step, prompt_idx, sample_idx, prompt_len, response_len,
                                 validate, length_estimated, score)
            WITH numbered AS (
                SELECT *, min(line_no) OVER (PARTITION BY input) AS first_line FROM records
            )
            SELECT ?, ?, coalesce(step, ?), dense_rank() OVER (ORDER BY first_line) - 1,
                   row_number() OVER (PARTITION BY first_line ORDER BY line_no) - 1,
                   {lengths}, ?, true, score
            FROM numbered {join}
            ORDER BY line_no
            """,
            [ctx.run_id, ctx.file_id, file_step, validate],
        )
        ctx.stored = records
        if records:
            ctx.note(f"{records} samples; lengths estimated ({how})")
        ctx.run_meta.update({"framework": "verl"})
        ctx.format_version = "validation dump" if validate else "rollout dump"
