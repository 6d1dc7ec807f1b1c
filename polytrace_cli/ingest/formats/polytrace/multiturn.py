"""PolyTrace `multiturn_workload_step_N.jsonl` (and `..._step_N_rank_R.jsonl`): one line per trajectory.

Each trajectory becomes one `samples` row, one `turns` row per generation turn and one
`tool_calls` row per tool invocation. The merged files identify a trajectory by
(prompt_group_id, sample_id); the per-rank files by (batch_data_id, rollout_offset) with the rank
taken from the file name.
"""

from __future__ import annotations

import re

from pathlib import Path

import duckdb

from polytrace_cli.ingest.jsonl import BulkJsonlIngester, Check
from polytrace_cli.ingest.registry import register

FILE_NAME = re.compile(r"^multiturn_workload_step_\d+(?:_rank_(?P<rank>\d+))?\.jsonl$")

TURN_SPEC = {
    "turn": "INTEGER",
    "prompt_tokens": "INTEGER",
    "cached_tokens": "INTEGER",
    "completion_tokens": "INTEGER",
    "finish_reason": "VARCHAR",
    "tool_call_count": "INTEGER",
    "engine_latency_s": "DOUBLE",
}
TOOL_SPEC = {
    "turn": "INTEGER",
    "tool_name": "VARCHAR",
    "query_count": "INTEGER",
    "latency_s": "DOUBLE",
    "response_token_len": "INTEGER",
    "status": "VARCHAR",
}
SPEC = {
    "step": "INTEGER",
    "prompt_len": "INTEGER",
    "max_response_len": "INTEGER",
    "turns": [TURN_SPEC],
    "tool_calls": [TOOL_SPEC],
    "finish_reason": "VARCHAR",
    "final_response_len": "INTEGER",
    "turn_count": "INTEGER",
    "tool_call_count": "INTEGER",
    "validate": "BOOLEAN",
    "prompt_group_id": "INTEGER",
    "sample_id": "INTEGER",
    "batch_data_id": "INTEGER",
    "rollout_offset": "INTEGER",
}
REQUIRED = ("step", "prompt_len", "final_response_len")
CHECKS = (Check("prompt_len < 0 OR final_response_len < 0", "negative length"),)


@register
class MultiTurnIngester(BulkJsonlIngester):
    name = "polytrace-multiturn"
    version = "2"
    framework = "polytrace"
    description = "PolyTrace multiturn_workload_step_N[_rank_R].jsonl (trajectories, turns, tool calls)"
    file_name = FILE_NAME
    content_markers = (b'"turns": [', b'"final_response_len"')
    spec, required, checks = SPEC, REQUIRED, CHECKS
    meta_without_records = {"multiturn": True}

    def file_rank(self, path: Path) -> int | None:
        match = FILE_NAME.match(path.name)
        return int(match.group("rank")) if match and match.group("rank") else None

    def write(self, con: duckdb.DuckDBPyConnection) -> None:
        con.execute(
            """
            CREATE OR REPLACE TEMP VIEW trajectories AS
            SELECT *, coalesce(prompt_group_id, batch_data_id) AS prompt_idx,
                      coalesce(sample_id, rollout_offset) AS sample_idx
            FROM keyed
            """
        )
        con.execute(
            """
            INSERT INTO sample_rows (run_id, file_id, step, rank, prompt_idx, sample_idx, prompt_len, response_len,
                                 truncated, validate, turns, tool_calls, finish_reason)
            SELECT run_id, file_id, step, file_rank, prompt_idx, sample_idx, prompt_len, final_response_len,
                   finish_reason = 'length' OR final_response_len >= max_response_len,
                   validate, coalesce(turn_count, len(turns)), coalesce(tool_call_count, len(tool_calls)),
                   finish_reason
            FROM trajectories
            """
        )
        con.execute(
            """
            INSERT INTO turns (run_id, file_id, step, rank, prompt_idx, sample_idx, turn, prompt_tokens,
                               cached_tokens, completion_tokens, engine_latency_s, finish_reason, tool_call_count)
            SELECT run_id, file_id, step, file_rank, prompt_idx, sample_idx, t.turn, t.prompt_tokens, t.cached_tokens,
                   t.completion_tokens, t.engine_latency_s, t.finish_reason, t.tool_call_count
            FROM (SELECT run_id, file_id, step, file_rank, prompt_idx, sample_idx, unnest(turns) AS t
                  FROM trajectories)
            """
        )
        con.execute(
            """
            INSERT INTO tool_calls (run_id, file_id, step, rank, prompt_idx, sample_idx, turn, tool_name,
                                    latency_s, status, query_count, response_tokens)
            SELECT run_id, file_id, step, file_rank, prompt_idx, sample_idx, c.turn, c.tool_name, c.latency_s,
                   c.status, c.query_count, c.response_token_len
            FROM (SELECT run_id, file_id, step, file_rank, prompt_idx, sample_idx, unnest(tool_calls) AS c
                  FROM trajectories)
            """
        )

    def summaries(self, con: duckdb.DuckDBPyConnection) -> dict[int, tuple[int, dict]]:
        # One row per trajectory, per turn and per tool call, as the three inserts above write them.
        result = {}
        for file_id, rows, max_len in con.execute(
            "SELECT file_id, count(*) + coalesce(sum(len(turns)), 0) + coalesce(sum(len(tool_calls)), 0),"
            " max(max_response_len) FROM keyed GROUP BY file_id"
        ).fetchall():
            meta = dict(self.meta_without_records)
            if max_len is not None:
                meta["max_response_len"] = max_len
            result[file_id] = (rows, meta)
        return result
