"""One level below a step, for runs with per-sample traces: which DP rank and which samples.

Per step (validation samples left out; tensor-parallel rank 0; a sample's rank is its dp_rank,
else its rank):
    busiest rank     the rank with the largest Σ (prompt_len + response_len), its tokens, and the
                     mean over ranks
    tail samples     the TAIL_SAMPLES longest responses: rank, prompt_idx, sample_idx, length
"""

from __future__ import annotations

import duckdb

TAIL_SAMPLES = 3

_SQL = """
WITH s AS (
    SELECT step, coalesce(dp_rank, rank) AS dp_rank, prompt_idx, sample_idx, response_len,
           coalesce(prompt_len, 0) + response_len AS tokens
    FROM samples
    WHERE run_id = ? AND step IN (SELECT unnest(?)) AND NOT coalesce(validate, false)
      AND response_len IS NOT NULL AND coalesce(tp_rank, 0) = 0
), ranks AS (
    SELECT step, dp_rank, sum(tokens) AS tokens FROM s WHERE dp_rank IS NOT NULL GROUP BY ALL
), busiest AS (
    SELECT step, arg_max(dp_rank, tokens) AS rank, max(tokens) AS tokens, avg(tokens) AS mean_tokens,
           count(*) AS ranks
    FROM ranks GROUP BY step
), tail AS (
    SELECT step, list({'rank': dp_rank, 'prompt_idx': prompt_idx, 'sample_idx': sample_idx, 'length': response_len}
                      ORDER BY response_len DESC, dp_rank, prompt_idx, sample_idx)[1:$n] AS samples
    FROM s GROUP BY step
)
SELECT tail.step, busiest.rank, busiest.tokens::BIGINT AS tokens, busiest.mean_tokens, busiest.ranks, tail.samples
FROM tail LEFT JOIN busiest USING (step)
"""


def sample_detail(con: duckdb.DuckDBPyConnection, run_id: int, steps: list[int]) -> dict[int, dict]:
    """step -> {"busiest_rank": {"rank", "tokens", "mean_tokens", "ranks"} or None,
    "tail_samples": [{"rank", "prompt_idx", "sample_idx", "length"}, ...]} for the steps with samples."""
    if not steps:
        return {}
    rows = con.execute(_SQL.replace("$n", str(TAIL_SAMPLES)), [run_id, steps]).fetchall()
    out = {}
    for step, rank, tokens, mean_tokens, ranks, samples in rows:
        busiest = ({"rank": rank, "tokens": tokens, "mean_tokens": mean_tokens, "ranks": ranks}
                   if rank is not None and ranks and ranks > 1 else None)
        out[int(step)] = {"busiest_rank": busiest, "tail_samples": samples}
    return out
