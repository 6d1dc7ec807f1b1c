"""PolyTrace `packed_lengths_step_N.jsonl`: one line per prompt per data-parallel rollout worker.

Fields: step, rank, dp_rank, tp_rank, local_index, input (prompt tokens), output (list of the
n_sampling response lengths), n_sampling, validate. Each line becomes one `sample_groups` row (n_sampling
kept with it), which the `samples` view unnests into one row per response.
"""

from __future__ import annotations

import re

import duckdb

from polytrace_cli.ingest.jsonl import BulkJsonlIngester, Check
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
class PackedLengthsIngester(BulkJsonlIngester):
    name = "polytrace-packed"
    version = "2"
    framework = "polytrace"
    description = "PolyTrace packed_lengths_step_N.jsonl (prompt and response lengths per DP rank)"
    file_name = FILE_NAME
    content_markers = (b'"output": [', b'"local_index"')
    spec, required, checks = SPEC, REQUIRED, CHECKS
    row_table = "sample_groups"
    row_columns = {"step": "step", "rank": "rank", "dp_rank": "dp_rank", "tp_rank": "tp_rank",
                   "local_index": "prompt_idx", "input": "prompt_len", "validate": "validate",
                   "output": "response_lens", "n_sampling": "n_sampling"}

    def summaries(self, con: duckdb.DuckDBPyConnection) -> dict[int, tuple[int, dict]]:
        # Rows are counted as the `samples` view shows them: one per response.
        result = {}
        for file_id, responses, n_sampling, dp_size in con.execute(
            "SELECT file_id, sum(len(output)), max(n_sampling), count(DISTINCT dp_rank) FROM keyed GROUP BY file_id"
        ).fetchall():
            meta = {"n_sampling": n_sampling}
            if dp_size:
                meta["dp_ranks_seen"] = dp_size
            result[file_id] = (responses or 0, meta)
        return result
