"""Load imbalance across data-parallel ranks, its balanced counterfactual, and reward-time spread.

Per step, over the DP ranks r that logged samples (tensor-parallel rank 0 only, validation samples
left out; a sample's rank is its dp_rank, else its rank):

    load_r         = Σ over the rank's samples of (prompt_len + response_len)      tokens
    max_response_r = max over the rank's samples of response_len   (rollout makespan proxy)
    λ              = max_r load_r / mean_r load_r
    idle share     = 1 − mean_r load_r / max_r load_r = 1 − 1/λ

Balanced counterfactual: the step's prompt groups (all responses of one prompt stay together;
a group is keyed by (step, dp_rank, prompt_idx), a sample without prompt_idx is its own group)
are dealt over the same number of ranks by Karmarkar–Karp and by LPT, giving λ_kk and λ_lpt.

Token-load saving: if a stage's time on a rank were proportional to the rank's token load, the
stage would end when the most loaded rank finishes; the total load being unchanged, balanced time /
actual time = λ_balanced / λ, and the stage would shrink by saving = 1 − λ_balanced / λ.

Which quantity sets the step's time (`saving_basis`, with the reason in `saving_basis_reason`):

- samples: the ranks decode their responses together (one batch per rank), so a rank's rollout ends
  with its longest response and the step waits for the rank holding the longest one. The measure of
  that wait is makespan λ = max_r max_response_r / mean_r max_response_r (idle share of rank time
  1 − 1/makespan λ). Moving prompt groups between ranks cannot shorten the step's longest response,
  so the rollout saving from rebalancing, `step_saving`, is 0; the token-load `saving` is reported
  but does not set the step's time.
- global_seqlen: verl balances the training batch's token sums across ranks; the update stages'
  compute grows with tokens, so the token-load saving applies (`step_saving` = `saving`).

Console-only verl runs log `global_seqlen/{max,mean,balanced_max}` (per-DP-rank token sums before
and after verl's own balancing): λ = max / mean and λ_balanced = balanced_max / mean
(basis 'global_seqlen'). Steps with fewer than two ranks carry no imbalance and are left out.
"""

from __future__ import annotations

import duckdb
import numpy as np
import polars as pl

from polytrace_cli.analyze.common import ALL_STEPS, StepRange, frame
from polytrace_cli.analyze.partition import kk_max_loads, lpt_max_loads
from polytrace_cli.analyze.registry import register
from polytrace_cli.analyze.shared_frames import shared

STRAGGLER_ALPHA = 0.05

_SAMPLES = """
    SELECT run_id, step, coalesce(dp_rank, rank) AS dp_rank, prompt_idx, prompt_len, response_len
    FROM samples
    WHERE run_id IN (SELECT unnest(?)) AND {steps}
      AND coalesce(validate, false) = false
      AND coalesce(tp_rank, 0) = 0
      AND coalesce(dp_rank, rank) IS NOT NULL
"""

_RANK_LOADS = f"""
    WITH s AS ({_SAMPLES}),
    r AS (
        SELECT run_id, step, dp_rank, count(*) AS samples,
               sum(coalesce(prompt_len, 0) + coalesce(response_len, 0))::DOUBLE AS load_tokens,
               max(response_len) AS max_response_len
        FROM s GROUP BY run_id, step, dp_rank
    )
    SELECT *, count(*) OVER (PARTITION BY run_id, step) AS ranks,
              avg(load_tokens) OVER (PARTITION BY run_id, step) AS mean_load
    FROM r
"""

PER_STEP_COLUMNS = {
    "run": pl.String, "segment": pl.Int64, "step": pl.Int64, "ranks": pl.Int64,
    "mean_load_tokens": pl.Float64, "max_load_tokens": pl.Float64, "max_rank": pl.Int64,
    "lambda": pl.Float64, "idle_share": pl.Float64, "makespan_lambda": pl.Float64,
    "lambda_kk": pl.Float64, "lambda_lpt": pl.Float64, "lambda_balanced": pl.Float64,
    "saving_kk": pl.Float64, "saving_lpt": pl.Float64, "saving": pl.Float64, "basis": pl.String,
    "saving_basis": pl.String, "saving_basis_reason": pl.String, "step_saving": pl.Float64,
}

MAKESPAN_REASON = ("a rank's rollout ends with its longest response, so the step waits for the rank holding the "
                   "longest one; moving prompts between ranks cannot shorten it")
TOKENS_REASON = ("verl balances the training batch's token sums across ranks, and the update stages' compute "
                 "grows with tokens")


PER_RANK_COLUMNS = {
    "run": pl.String, "step": pl.Int64, "dp_rank": pl.Int64, "samples": pl.Int64, "load_tokens": pl.Float64,
    "max_response_len": pl.Int64, "load_over_mean": pl.Float64, "is_max": pl.Boolean,
}


def per_rank(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """Per step × DP rank (F6 heat map): samples, load_tokens = Σ (prompt_len + response_len),
    max_response_len, load_over_mean = load_r / mean_r' load_r', and is_max (the step's most
    loaded rank; ties go to the lowest rank). Steps with fewer than two ranks are left out."""
    return frame(
        con,
        f"""
        WITH r AS ({_RANK_LOADS.format(steps=steps.sql())})
        SELECT runs.name AS run, r.step::BIGINT AS step, r.dp_rank::BIGINT AS dp_rank,
               r.samples::BIGINT AS samples, r.load_tokens, r.max_response_len::BIGINT AS max_response_len,
               r.load_tokens / nullif(r.mean_load, 0) AS load_over_mean,
               row_number() OVER (PARTITION BY r.run_id, r.step ORDER BY r.load_tokens DESC, r.dp_rank) = 1 AS is_max
        FROM r JOIN runs USING (run_id)
        WHERE r.ranks >= 2
        ORDER BY run, step, dp_rank
        """,
        [run_ids],
    )


def _balanced(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange) -> pl.DataFrame:
    """λ_kk and λ_lpt per step from repartitioning the step's prompt groups over its ranks."""
    groups = con.execute(
        f"""
        WITH s AS ({_SAMPLES.format(steps=steps.sql())}),
        g AS (
            SELECT run_id, step, dp_rank, sum(coalesce(prompt_len, 0) + coalesce(response_len, 0))::DOUBLE AS w
            FROM s WHERE prompt_idx IS NOT NULL GROUP BY run_id, step, dp_rank, prompt_idx
            UNION ALL
            SELECT run_id, step, dp_rank, (coalesce(prompt_len, 0) + coalesce(response_len, 0))::DOUBLE
            FROM s WHERE prompt_idx IS NULL
        )
        SELECT run_id, step, count(DISTINCT dp_rank) AS ranks, list(w) AS weights
        FROM g GROUP BY run_id, step HAVING count(DISTINCT dp_rank) >= 2 AND sum(w) > 0
        """,
        [run_ids],
    ).fetchall()
    rows = []
    for k in sorted({ranks for _, _, ranks, _ in groups}):
        same_k = [group for group in groups if group[2] == k]
        instances = [weights for _, _, _, weights in same_k]
        means = np.array([sum(weights) / k for weights in instances])
        lambda_kk = kk_max_loads(instances, k) / means
        lambda_lpt = lpt_max_loads(instances, k) / means
        rows += [(run_id, step, float(kk), float(lp)) for (run_id, step, _, _), kk, lp in zip(same_k, lambda_kk, lambda_lpt)]
    return pl.DataFrame(
        rows, schema={"run_id": pl.Int32, "step": pl.Int64, "lambda_kk": pl.Float64, "lambda_lpt": pl.Float64},
        orient="row",
    )


def _global_seqlen_steps(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange) -> pl.DataFrame:
    return frame(
        con,
        f"""
        WITH m AS (
            SELECT sm.run_id, sm.segment, sm.step,
                   max(sm.value) FILTER (WHERE a.canonical = 'rank_tokens_max') AS max_load,
                   max(sm.value) FILTER (WHERE a.canonical = 'rank_tokens_mean') AS mean_load,
                   max(sm.value) FILTER (WHERE a.canonical = 'rank_tokens_balanced_max') AS balanced_max
            FROM step_metrics sm JOIN metric_aliases a ON a.key = sm.key
            WHERE sm.run_id IN (SELECT unnest(?)) AND {steps.sql('sm.step')}
              AND a.canonical IN ('rank_tokens_max', 'rank_tokens_mean', 'rank_tokens_balanced_max')
            GROUP BY sm.run_id, sm.segment, sm.step
        )
        SELECT runs.name AS run, m.segment::BIGINT AS segment, m.step::BIGINT AS step, NULL::BIGINT AS ranks,
               m.mean_load AS mean_load_tokens, m.max_load AS max_load_tokens, NULL::BIGINT AS max_rank,
               m.max_load / m.mean_load AS lambda, 1 - m.mean_load / m.max_load AS idle_share,
               NULL::DOUBLE AS makespan_lambda, NULL::DOUBLE AS lambda_kk, NULL::DOUBLE AS lambda_lpt,
               m.balanced_max / m.mean_load AS lambda_balanced,
               NULL::DOUBLE AS saving_kk, NULL::DOUBLE AS saving_lpt,
               1 - m.balanced_max / m.max_load AS saving, 'global_seqlen' AS basis
        FROM m JOIN runs USING (run_id)
        WHERE m.max_load > 0 AND m.mean_load > 0
        ORDER BY run, segment, step
        """,
        [run_ids],
    ).with_columns(saving_basis=pl.lit("tokens"), saving_basis_reason=pl.lit(TOKENS_REASON), step_saving=pl.col("saving"))


def per_step(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """Per step: λ = max_r load_r / mean_r load_r, idle_share = 1 − mean/max, max_rank, and
    makespan_lambda = max_r max_response_r / mean_r max_response_r; the balanced counterfactual
    λ_kk, λ_lpt (prompt groups repartitioned over the same ranks), lambda_balanced = min of the two,
    and saving_* = 1 − λ_balanced / λ (share of rollout time saved under the stage model in the
    module docstring). Runs without per-rank samples fall back to verl's global_seqlen keys
    (basis 'global_seqlen': λ = max/mean, lambda_balanced = balanced_max/mean,
    saving = 1 − balanced_max/max). saving_basis says which quantity sets the step's time and
    step_saving is the saving on it (see the module docstring): makespan for samples (step_saving
    = 0: rebalancing cannot shorten the longest response), tokens for global_seqlen."""
    sampled = frame(
        con,
        f"""
        WITH r AS ({_RANK_LOADS.format(steps=steps.sql())}),
        top AS (
            SELECT run_id, step, arg_max(dp_rank, (load_tokens, -dp_rank)) AS max_rank,
                   any_value(ranks) AS ranks, any_value(mean_load) AS mean_load, max(load_tokens) AS max_load,
                   max(max_response_len)::DOUBLE / nullif(avg(max_response_len), 0) AS makespan_lambda
            FROM r WHERE ranks >= 2 GROUP BY run_id, step
        )
        SELECT run_id, runs.name AS run, NULL::BIGINT AS segment, step::BIGINT AS step, ranks::BIGINT AS ranks,
               mean_load AS mean_load_tokens, max_load AS max_load_tokens, max_rank::BIGINT AS max_rank,
               max_load / nullif(mean_load, 0) AS lambda, 1 - mean_load / nullif(max_load, 0) AS idle_share,
               makespan_lambda
        FROM top JOIN runs USING (run_id)
        """,
        [run_ids],
    )
    if sampled.height:
        sampled = (
            sampled.join(_balanced(con, run_ids, steps), on=["run_id", "step"], how="left")
            .with_columns(lambda_balanced=pl.min_horizontal("lambda_kk", "lambda_lpt"))
            .with_columns(
                saving_kk=1 - pl.col("lambda_kk") / pl.col("lambda"),
                saving_lpt=1 - pl.col("lambda_lpt") / pl.col("lambda"),
                saving=1 - pl.col("lambda_balanced") / pl.col("lambda"),
                basis=pl.lit("samples"),
                saving_basis=pl.when(pl.col("makespan_lambda").is_not_null()).then(pl.lit("makespan"))
                .otherwise(pl.lit("tokens")),
            )
            .with_columns(
                saving_basis_reason=pl.when(pl.col("saving_basis") == "makespan").then(pl.lit(MAKESPAN_REASON))
                .otherwise(pl.lit("no response lengths: only the token load is known")),
                step_saving=pl.when(pl.col("saving_basis") == "makespan").then(pl.lit(0.0)).otherwise(pl.col("saving")),
            )
            .drop("run_id")
        )
    sampled_runs = set(sampled["run"].to_list()) if sampled.height else set()
    seqlen = _global_seqlen_steps(con, run_ids, steps).filter(~pl.col("run").is_in(list(sampled_runs)))
    parts = [part.select(list(PER_STEP_COLUMNS)).cast(PER_STEP_COLUMNS) for part in (sampled, seqlen) if part.height]
    if not parts:
        return pl.DataFrame(schema=PER_STEP_COLUMNS)
    return pl.concat(parts).sort("run", "segment", "step", nulls_last=False)


STRAGGLER_COLUMNS = {
    "run": pl.String, "dp_rank": pl.Int64, "steps": pl.Int64, "max_steps": pl.Int64, "expected": pl.Float64,
    "p_value": pl.Float64, "straggler": pl.Boolean,
}


def stragglers(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """Per run × DP rank: steps, max_steps (steps where the rank carried the largest load),
    expected = steps / ranks, and the one-sided binomial p-value of max_steps under
    P(max) = 1/ranks; straggler = p < 0.05 / ranks (Bonferroni over the run's ranks)."""
    ranks = per_rank(con, run_ids, steps)
    columns = {"run": pl.String, "dp_rank": pl.Int64, "steps": pl.Int64, "max_steps": pl.Int64,
               "expected": pl.Float64, "p_value": pl.Float64, "straggler": pl.Boolean}
    if not ranks.height:
        return pl.DataFrame(schema=columns)
    counts = (
        ranks.group_by("run", "dp_rank")
        .agg(steps=pl.len(), max_steps=pl.col("is_max").sum())
        .with_columns(ranks=pl.len().over("run"))
        .sort("run", "dp_rank")
    )
    from polytrace_cli.analyze.significance import binomial_upper_tail

    rows = []
    for run, dp_rank, n_steps, max_steps, n_ranks in counts.iter_rows():
        p_value = binomial_upper_tail(int(max_steps), int(n_steps), 1 / n_ranks)
        rows.append((run, dp_rank, n_steps, max_steps, n_steps / n_ranks, p_value, p_value < STRAGGLER_ALPHA / n_ranks))
    return pl.DataFrame(rows, schema=columns, orient="row")


REWARD_PER_RANK_COLUMNS = {
    "run": pl.String, "step": pl.Int64, "dp_rank": pl.Int64, "seconds": pl.Float64, "batch_size": pl.Int64,
    "tokens": pl.Int64, "seconds_over_mean": pl.Float64,
}


def reward_per_rank(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """Reward seconds per step × DP rank (F9), from `rank_timings` stage 'reward' (validation
    calls left out), with the rank's batch_size and response tokens and seconds / step mean."""
    return frame(
        con,
        f"""
        SELECT runs.name AS run, t.step::BIGINT AS step, coalesce(t.dp_rank, t.rank)::BIGINT AS dp_rank,
               t.seconds, t.batch_size::BIGINT AS batch_size, t.tokens::BIGINT AS tokens,
               t.seconds / nullif(avg(t.seconds) OVER (PARTITION BY t.run_id, t.step), 0) AS seconds_over_mean
        FROM rank_timings t JOIN runs USING (run_id)
        WHERE t.run_id IN (SELECT unnest(?)) AND t.stage = 'reward' AND {steps.sql('t.step')}
          AND coalesce(t.validate, false) = false AND t.seconds IS NOT NULL
        ORDER BY run, step, dp_rank
        """,
        [run_ids],
    )


REWARD_PER_STEP_COLUMNS = {
    "run": pl.String, "step": pl.Int64, "ranks": pl.Int64, "mean_s": pl.Float64, "max_s": pl.Float64,
    "min_s": pl.Float64, "max_over_mean": pl.Float64, "spread_s": pl.Float64,
}


def reward_per_step(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """Per step across DP ranks: mean_s, max_s, min_s, max_over_mean = max_s / mean_s and
    spread_s = max_s − min_s of the reward stage's seconds (`rank_timings`, stage 'reward')."""
    return frame(
        con,
        f"""
        SELECT runs.name AS run, t.step::BIGINT AS step, count(*)::BIGINT AS ranks,
               avg(t.seconds) AS mean_s, max(t.seconds) AS max_s, min(t.seconds) AS min_s,
               max(t.seconds) / nullif(avg(t.seconds), 0) AS max_over_mean,
               max(t.seconds) - min(t.seconds) AS spread_s
        FROM rank_timings t JOIN runs USING (run_id)
        WHERE t.run_id IN (SELECT unnest(?)) AND t.stage = 'reward' AND {steps.sql('t.step')}
          AND coalesce(t.validate, false) = false AND t.seconds IS NOT NULL
        GROUP BY runs.name, t.run_id, t.step
        ORDER BY run, step
        """,
        [run_ids],
    )


MEAN_LAMBDA = "mean_lambda"  # read by `polytrace check`
SUMMARY_COLUMNS = {
    "run": pl.String, "basis": pl.String, "steps": pl.Int64, "ranks": pl.Int64,
    MEAN_LAMBDA: pl.Float64, "max_lambda": pl.Float64, "mean_idle_share": pl.Float64,
    "mean_makespan_lambda": pl.Float64, "mean_lambda_kk": pl.Float64, "mean_lambda_lpt": pl.Float64,
    "mean_lambda_balanced": pl.Float64, "mean_saving": pl.Float64, "saving_basis": pl.String,
    "saving_basis_reason": pl.String, "mean_step_saving": pl.Float64, "straggler_ranks": pl.String,
    "reward_steps": pl.Int64, "mean_reward_max_over_mean": pl.Float64, "mean_reward_spread_s": pl.Float64,
    "max_reward_spread_s": pl.Float64,
}


@register("imbalance", "DP-rank load imbalance λ, balanced (KK/LPT) counterfactual, stragglers, reward-time spread")
def summary(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """One row per run: means over steps of λ, idle share, makespan λ, λ_kk, λ_lpt, λ_balanced and
    the token-load saving 1 − λ_balanced/λ; the quantity that sets the step's time (saving_basis,
    saving_basis_reason: the most common over the steps) and the mean saving on it (mean_step_saving); max λ; straggler ranks (comma-separated dp ranks with a
    significant binomial excess of max-load steps); reward-stage max/mean and max − min seconds
    across ranks, averaged over steps. basis: samples, global_seqlen, or rank_timings (reward only)."""
    loads = (
        shared(per_step, con, run_ids, steps)
        .group_by("run")
        .agg(
            basis=pl.col("basis").first(), steps=pl.len(), ranks=pl.col("ranks").max(),
            mean_lambda=pl.col("lambda").mean(), max_lambda=pl.col("lambda").max(),
            mean_idle_share=pl.col("idle_share").mean(), mean_makespan_lambda=pl.col("makespan_lambda").mean(),
            mean_lambda_kk=pl.col("lambda_kk").mean(), mean_lambda_lpt=pl.col("lambda_lpt").mean(),
            mean_lambda_balanced=pl.col("lambda_balanced").mean(), mean_saving=pl.col("saving").mean(),
            saving_basis=pl.col("saving_basis").mode().sort().first(),
            saving_basis_reason=pl.col("saving_basis_reason").mode().sort().first(),
            mean_step_saving=pl.col("step_saving").mean(),
        )
    )
    flagged = (
        stragglers(con, run_ids, steps)
        .filter(pl.col("straggler"))
        .group_by("run")
        .agg(straggler_ranks=pl.col("dp_rank").sort().cast(pl.String).str.join(","))
    )
    reward = (
        reward_per_step(con, run_ids, steps)
        .group_by("run")
        .agg(
            reward_steps=pl.len(), mean_reward_max_over_mean=pl.col("max_over_mean").mean(),
            mean_reward_spread_s=pl.col("spread_s").mean(), max_reward_spread_s=pl.col("spread_s").max(),
        )
    )
    out = (
        loads.join(flagged, on="run", how="left")
        .join(reward, on="run", how="full", coalesce=True)
        .with_columns(
            basis=pl.col("basis").fill_null("rank_timings"),
            straggler_ranks=pl.when(pl.col("basis") == "samples").then(pl.col("straggler_ranks").fill_null("")),
        )
    )
    return out.select(list(SUMMARY_COLUMNS)).cast(SUMMARY_COLUMNS).sort("run")
