"""PolyTrace `packed_lengths_step_N.jsonl`: one line per prompt per data-parallel rollout worker.

Fields: step, rank, dp_rank, tp_rank, local_index, input (prompt tokens), output (list of the
n_sampling response lengths), n_sampling, validate. Each line becomes one `sample_groups` row, which the `samples` view
unnests into one row per response.
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
    version = "2"
    framework = "polytrace"
    description = "PolyTrace packed_lengths_step_N.jsonl (prompt and response lengths per DP rank)"
    file_name = FILE_NAME
    content_markers = (b'"output": [', b'"local_index"')

    def load(self, ctx: FileContext) -> None:
        records = load_records(ctx, SPEC, REQUIRED, CHECKS)
        groups = ctx.insert(
            """
            INSERT INTO sample_groups (run_id, file_id, step, rank, dp_rank, tp_rank, prompt_idx, prompt_len,
                                       validate, response_lens)
            SELECT ?, ?, step, rank, dp_rank, tp_rank, local_index, input, validate, output
            FROM records
            """,
            [ctx.run_id, ctx.file_id],
        )
        responses, n_sampling, dp_size = ctx.con.execute(
            "SELECT sum(len(output)), max(n_sampling), count(DISTINCT dp_rank) FROM records"
        ).fetchall()[0]
        # Rows are counted as the `samples` view shows them: one per response.
        ctx.rows += (responses or 0) - groups
        ctx.stored = records
        ctx.run_meta.update({"n_sampling": n_sampling})
        if dp_size:
            ctx.run_meta["dp_ranks_seen"] = dp_size
