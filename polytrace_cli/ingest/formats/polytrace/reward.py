"""PolyTrace `reward_timings_step_N.jsonl`: one line per data-parallel rank and reward call.

Fields: step, rank, tp_rank, dp_rank, batch_size, reward_time_s, response_sum, response_mean,
response_max, validate. Each line becomes one `rank_timings` row with stage 'reward'.
"""

from __future__ import annotations

import re

from polytrace_cli.ingest.base import FileContext, JsonlTraceIngester
from polytrace_cli.ingest.jsonl import Check, load_records
from polytrace_cli.ingest.registry import register

FILE_NAME = re.compile(r"^reward_timings_step_\d+\.jsonl$")

SPEC = {
    "step": "INTEGER",
    "rank": "INTEGER",
    "tp_rank": "INTEGER",
    "dp_rank": "INTEGER",
    "batch_size": "INTEGER",
    "reward_time_s": "DOUBLE",
    "response_sum": "BIGINT",
    "response_mean": "DOUBLE",
    "response_max": "INTEGER",
    "validate": "BOOLEAN",
}
REQUIRED = ("step", "reward_time_s")
CHECKS = (Check("reward_time_s < 0", "negative reward time"),)


@register
class RewardTimingsIngester(JsonlTraceIngester):
    name = "polytrace-reward"
    version = "2"
    framework = "polytrace"
    description = "PolyTrace reward_timings_step_N.jsonl (reward seconds per DP rank)"
    file_name = FILE_NAME
    content_markers = (b'"reward_time_s"',)

    def load(self, ctx: FileContext) -> None:
        records = load_records(ctx, SPEC, REQUIRED, CHECKS)
        ctx.insert(
            """
            INSERT INTO rank_timings (run_id, file_id, step, rank, dp_rank, tp_rank, stage, seconds,
                                      batch_size, tokens, response_max, validate)
            SELECT ?, ?, step, rank, dp_rank, tp_rank, 'reward', reward_time_s, batch_size,
                   response_sum, response_max, validate
            FROM records
            """,
            [ctx.run_id, ctx.file_id],
        )
        ctx.stored = records
