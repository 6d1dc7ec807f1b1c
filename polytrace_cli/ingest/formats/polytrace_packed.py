"""PolyTrace `packed_lengths_step_N.jsonl`: one line per prompt per data-parallel rollout worker.

Fields: step, rank, dp_rank, tp_rank, local_index, input (prompt tokens), output (list of the
n_sampling response lengths), n_sampling, validate. Each response becomes one `samples` row.
"""

from __future__ import annotations

import re

from polytrace_cli.ingest.base import FileContext, JsonlTraceIngester
from polytrace_cli.ingest.jsonl import Check, load_records
from polytrace_cli.ingest.registry import register

FILE_NAME = re.compile(r"^packed_lengths_step_\d+\.jsonl$")

SPEC = {
    "step": "INTEGER",
    "rank": "INTEGER",
    "dp_rank": "INTEGER",
    "tp_rank": "INTEGER",
    "local_index": "INTEGER",
    "input": "INTEGER",
    "output": ["INTEGER"],
    "n_sampling": "INTEGER",
    "validate": "BOOLEAN",
}
REQUIRED = ("step", "input", "output")
CHECKS = (
    Check("len(output) = 0", "output holds no response lengths"),
    Check("list_min(output) < 0 OR input < 0", "negative length"),
)


@register
class PackedLengthsIngester(JsonlTraceIngester):
    name = "polytrace-packed"
    version = "1"
    framework = "polytrace"
    description = "PolyTrace packed_lengths_step_N.jsonl (prompt and response lengths per DP rank)"
    file_name = FILE_NAME
    content_markers = (b'"output": [', b'"local_index"')

    def load(self, ctx: FileContext) -> None:
        records = load_records(ctx, SPEC, REQUIRED, CHECKS)
        ctx.insert(
            """
            INSERT INTO samples (run_id, file_id, step, rank, dp_rank, tp_rank, prompt_idx, sample_idx,
                                 prompt_len, response_len, validate)
            SELECT ?, ?, step, rank, dp_rank, tp_rank, local_index,
                   unnest(range(len(output)))::INTEGER, input, unnest(output), validate
            FROM records
            """,
            [ctx.run_id, ctx.file_id],
        )
        ctx.stored = records
        n_sampling = ctx.con.execute("SELECT max(n_sampling) FROM records").fetchall()[0][0]
        dp_size = ctx.con.execute("SELECT count(DISTINCT dp_rank) FROM records").fetchall()[0][0]
        ctx.run_meta.update({"n_sampling": n_sampling})
        if dp_size:
            ctx.run_meta["dp_ranks_seen"] = dp_size
