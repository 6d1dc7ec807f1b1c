"""PolyTrace `dapo_filter_indices.jsonl`: one line per DAPO generation batch.

DAPO's dynamic sampling generates batches of prompts until enough prompts with mixed rewards are
kept; several workload steps (rollout calls) then map to one trainer step. Each line becomes one
`filter_batches` row with the kept and used prompt indices as lists.
"""

from __future__ import annotations

import re

from polytrace_cli.ingest.base import FileContext, JsonlTraceIngester
from polytrace_cli.ingest.jsonl import Check, load_records
from polytrace_cli.ingest.registry import register

FILE_NAME = re.compile(r"^dapo_filter_indices.*\.jsonl$")

SPEC = {
    "workload_step": "INTEGER",
    "trainer_step": "INTEGER",
    "gen_batch_index": "INTEGER",
    "prompt_count": "INTEGER",
    "n_sampling": "INTEGER",
    "train_batch_size": "INTEGER",
    "num_prompt_in_batch_before": "INTEGER",
    "kept_prompt_count": "INTEGER",
    "used_prompt_count": "INTEGER",
    "kept_prompt_indices": ["INTEGER"],
    "used_prompt_indices": ["INTEGER"],
}
REQUIRED = ("workload_step", "prompt_count", "kept_prompt_count")
CHECKS = (
    Check("kept_prompt_count > prompt_count", "more prompts kept than generated"),
    Check("kept_prompt_indices IS NOT NULL AND len(kept_prompt_indices) != kept_prompt_count",
          "kept_prompt_count differs from the number of kept indices"),
)


@register
class DapoFilterIngester(JsonlTraceIngester):
    name = "polytrace-dapo-filter"
    version = "2"
    framework = "polytrace"
    description = "PolyTrace dapo_filter_indices.jsonl (DAPO dynamic-sampling generation batches)"
    file_name = FILE_NAME
    content_markers = (b'"kept_prompt_count"',)

    def load(self, ctx: FileContext) -> None:
        records = load_records(ctx, SPEC, REQUIRED, CHECKS)
        ctx.insert(
            """
            INSERT INTO filter_batches (run_id, file_id, workload_step, trainer_step, gen_batch_index,
                prompt_count, n_sampling, train_batch_size, num_prompt_in_batch_before, kept, used,
                kept_indices, used_indices)
            SELECT ?, ?, workload_step, trainer_step, gen_batch_index, prompt_count, n_sampling,
                   train_batch_size, num_prompt_in_batch_before, kept_prompt_count, used_prompt_count,
                   kept_prompt_indices, used_prompt_indices
            FROM records
            """,
            [ctx.run_id, ctx.file_id],
        )
        ctx.stored = records
        ctx.run_meta["algorithm"] = "dapo"
