"""DAPO dynamic sampling: how many generated prompts survive the filter, and what the rest cost.

DAPO generates batches of prompts until enough prompts with mixed rewards are kept; each
generation batch is one `filter_batches` row (one rollout call, `workload_step`), and several
can feed one trainer step.

Token join: the samples of a generation batch are the `samples` rows with step = workload_step
(training samples, tensor-parallel rank 0). The batch was split over DP ranks in contiguous
chunks, so a prompt's position in the batch (the numbering of kept_indices) is its rank in the
order (dp_rank, prompt_idx), counting from 0. The join is trusted only when the number of
distinct prompts found equals prompt_count; otherwise the batch falls back to prompt counts
(basis 'prompts').
"""

from __future__ import annotations

import duckdb
import polars as pl

from polytrace_cli.analyze.common import ALL_STEPS, StepRange, frame
from polytrace_cli.analyze.registry import register


PER_BATCH_COLUMNS = {
    "run": pl.String, "workload_step": pl.Int64, "trainer_step": pl.Int64, "gen_batch_index": pl.Int64,
    "prompt_count": pl.Int64, "kept": pl.Int64, "used": pl.Int64, "kept_share": pl.Float64,
    "used_share": pl.Float64, "response_tokens": pl.Int64, "discarded_token_share": pl.Float64,
    "unused_token_share": pl.Float64, "basis": pl.String,
}


def per_batch(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """Per generation batch (F10), steps selected by workload_step: kept_share = kept / prompt_count,
    used_share = used / prompt_count; with basis 'samples' (token join in the module docstring)
    discarded_token_share = Σ response tokens of prompts not in kept_indices / Σ response tokens
    of the batch and unused_token_share likewise for prompts not in used_indices (kept prompts
    beyond the train batch are generated and thrown away too); with basis 'prompts' (no matching
    samples) the same shares counted in prompts: 1 − kept/prompt_count and 1 − used/prompt_count."""
    return frame(
        con,
        f"""
        WITH fb AS (
            SELECT * FROM filter_batches WHERE run_id IN (SELECT unnest(?)) AND {steps.sql('workload_step')}
        ),
        wanted AS (SELECT DISTINCT run_id, workload_step AS step FROM fb),
        p AS MATERIALIZED (
            SELECT s.run_id, s.step, sum(s.response_len) AS tokens,
                   dense_rank() OVER (PARTITION BY s.run_id, s.step
                                      ORDER BY coalesce(s.dp_rank, s.rank) NULLS FIRST, s.prompt_idx) - 1 AS position
            FROM samples s SEMI JOIN wanted w ON w.run_id = s.run_id AND w.step = s.step
            WHERE coalesce(s.validate, false) = false AND coalesce(s.tp_rank, 0) = 0 AND s.prompt_idx IS NOT NULL
            GROUP BY s.run_id, s.step, coalesce(s.dp_rank, s.rank), s.prompt_idx
        ),
        steps_found AS (
            SELECT run_id, step, count(*) AS prompts_found, sum(tokens) AS tokens FROM p GROUP BY run_id, step
        ),
        kept AS (SELECT DISTINCT run_id, workload_step, gen_batch_index, unnest(kept_indices) AS position FROM fb),
        used AS (SELECT DISTINCT run_id, workload_step, gen_batch_index, unnest(used_indices) AS position FROM fb),
        kept_tokens AS (
            SELECT k.run_id, k.workload_step, k.gen_batch_index, sum(p.tokens) AS tokens
            FROM kept k JOIN p ON p.run_id = k.run_id AND p.step = k.workload_step AND p.position = k.position
            GROUP BY ALL
        ),
        used_tokens AS (
            SELECT u.run_id, u.workload_step, u.gen_batch_index, sum(p.tokens) AS tokens
            FROM used u JOIN p ON p.run_id = u.run_id AND p.step = u.workload_step AND p.position = u.position
            GROUP BY ALL
        ),
        j AS (
            SELECT fb.run_id, fb.workload_step, fb.trainer_step, fb.gen_batch_index, fb.prompt_count, fb.kept, fb.used,
                   fb.kept_indices IS NOT NULL AND fb.used_indices IS NOT NULL AS has_indices,
                   coalesce(f.prompts_found, 0) AS prompts_found, f.tokens,
                   f.tokens - coalesce(kt.tokens, 0) AS discarded, f.tokens - coalesce(ut.tokens, 0) AS unused
            FROM fb
            LEFT JOIN steps_found f ON f.run_id = fb.run_id AND f.step = fb.workload_step
            LEFT JOIN kept_tokens kt ON kt.run_id = fb.run_id AND kt.workload_step = fb.workload_step
                 AND kt.gen_batch_index IS NOT DISTINCT FROM fb.gen_batch_index
            LEFT JOIN used_tokens ut ON ut.run_id = fb.run_id AND ut.workload_step = fb.workload_step
                 AND ut.gen_batch_index IS NOT DISTINCT FROM fb.gen_batch_index
        )
        SELECT runs.name AS run, workload_step::BIGINT AS workload_step, trainer_step::BIGINT AS trainer_step,
               gen_batch_index::BIGINT AS gen_batch_index, prompt_count::BIGINT AS prompt_count,
               kept::BIGINT AS kept, used::BIGINT AS used,
               kept / nullif(prompt_count, 0) AS kept_share, used / nullif(prompt_count, 0) AS used_share,
               CASE WHEN joined THEN tokens END::BIGINT AS response_tokens,
               CASE WHEN joined THEN coalesce(discarded, 0) / tokens ELSE 1 - kept / nullif(prompt_count, 0) END
                   AS discarded_token_share,
               CASE WHEN joined THEN coalesce(unused, 0) / tokens ELSE 1 - used / nullif(prompt_count, 0) END
                   AS unused_token_share,
               CASE WHEN joined THEN 'samples' ELSE 'prompts' END AS basis
        FROM (SELECT *, has_indices AND prompts_found = prompt_count AND tokens > 0 AS joined FROM j)
        JOIN runs USING (run_id)
        ORDER BY run, workload_step, gen_batch_index
        """,
        [run_ids],
    )


PER_TRAINER_STEP_COLUMNS = {
    "run": pl.String, "trainer_step": pl.Int64, "batches": pl.Int64, "prompts": pl.Int64, "kept": pl.Int64,
    "used": pl.Int64, "kept_share": pl.Float64,
}


def per_trainer_step(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """Per trainer step (F10): batches = generation batches that fed it, prompts = Σ prompt_count,
    kept = Σ kept, used = Σ used, kept_share = kept / prompts."""
    return _trainer_steps(per_batch(con, run_ids, steps))


def _trainer_steps(batches: pl.DataFrame) -> pl.DataFrame:
    return (
        batches
        .group_by("run", "trainer_step")
        .agg(batches=pl.len(), prompts=pl.col("prompt_count").sum(), kept=pl.col("kept").sum(),
             used=pl.col("used").sum())
        .with_columns(kept_share=pl.col("kept") / pl.col("prompts"))
        .sort("run", "trainer_step")
    )


KEPT_SHARE = "kept_share"  # read by `polytrace check`
SUMMARY_COLUMNS = {
    "run": pl.String, "basis": pl.String, "batches": pl.Int64, "trainer_steps": pl.Int64,
    "mean_batches_per_trainer_step": pl.Float64, "max_batches_per_trainer_step": pl.Int64,
    KEPT_SHARE: pl.Float64, "mean_batch_kept_share": pl.Float64, "used_share": pl.Float64,
    "discarded_token_share": pl.Float64, "unused_token_share": pl.Float64,
}


@register("filtering", "DAPO dynamic sampling: kept share per generation batch, batches per trainer step, discarded tokens")
def summary(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """One row per run with generation batches: kept_share = Σ kept / Σ prompt_count, used_share
    likewise, mean_batch_kept_share (mean of per-batch kept/prompt_count), batches per trainer
    step (mean, max), and discarded_token_share = Σ discarded tokens / Σ tokens over all batches
    (unused_token_share likewise) when every batch joined its samples (basis 'samples'); else the
    prompt shares 1 − Σ kept / Σ prompt_count and 1 − Σ used / Σ prompt_count (basis 'prompts')."""
    batches = per_batch(con, run_ids, steps)
    per_step = _trainer_steps(batches).group_by("run").agg(
        trainer_steps=pl.len(), mean_batches_per_trainer_step=pl.col("batches").mean(),
        max_batches_per_trainer_step=pl.col("batches").max(),
    )
    by_tokens = pl.col("basis").eq("samples").all()
    tokens = pl.col("response_tokens")
    out = batches.group_by("run").agg(
        basis=pl.when(by_tokens).then(pl.lit("samples")).otherwise(pl.lit("prompts")),
        batches=pl.len(),
        kept_share=pl.col("kept").sum() / pl.col("prompt_count").sum(),
        mean_batch_kept_share=pl.col("kept_share").mean(),
        used_share=pl.col("used").sum() / pl.col("prompt_count").sum(),
        discarded_token_share=pl.when(by_tokens)
        .then((pl.col("discarded_token_share") * tokens).sum() / tokens.sum())
        .otherwise(1 - pl.col("kept").sum() / pl.col("prompt_count").sum()),
        unused_token_share=pl.when(by_tokens)
        .then((pl.col("unused_token_share") * tokens).sum() / tokens.sum())
        .otherwise(1 - pl.col("used").sum() / pl.col("prompt_count").sum()),
    )
    return out.join(per_step, on="run", how="left").select(list(SUMMARY_COLUMNS)).cast(SUMMARY_COLUMNS).sort("run")
