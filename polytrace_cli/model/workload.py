"""The per-step workload frame of a run: what each step had to do and how long its stages took.

One row per (segment, step). Workload features, from the step-aggregate log when it logs them and
from per-sample traces otherwise (validation samples left out; a sample's rank is its dp_rank,
else its rank):

    r_max                longest response (tokens): response_length/max, else max response_len
    n_responses          responses in the batch: perf/total_num_tokens / (prompt_length/mean +
                         response_length/mean) rounded to a count, else the count of samples, else
                         the run's responses per step (`analyze.semantics`: train_batch_size × rollout.n)
    response_tokens      Σ response lengths = response_length/mean · n_responses, else Σ response_len;
                         response_length/mean alone when n_responses cannot be told (a fixed
                         batch: the seconds per token then absorb the batch size)
    total_tokens         Σ (prompt + response) lengths: perf/total_num_tokens, else from samples
    mean_rank_tokens     per-DP-rank token sums, their mean, from the canonical step frame
                         (`analyze.step_frame`: global_seqlen/mean or the per-rank samples), else
                         total_tokens / ranks (ranks = run meta n_gpus, else 1)
    busiest_rank_tokens  the busiest rank that sets the training stages' time, from the canonical
                         frame (after verl's balancing when the run balances its batch), else
                         mean_rank_tokens
    balanced_busiest_tokens  the busiest rank after verl's balancing (global_seqlen/balanced_max),
                         only when the run balances its batch; null otherwise
    per_rank_data        the step's busiest and mean rank come from per-rank data, not total / ranks
    busiest_after_balancing  busiest_rank_tokens is the busiest rank after verl's balancing

Stage seconds are the `steps` view's columns plus update_weights_s (verl `timing_s/update_weights`,
`timing_s/param_sync`, `timing_s/sync_rollout_weights`, OpenRLHF `timing/broadcast`) and switch_s (the
V1 trainer's `timing_s/switch_to_rollout` + `timing_s/switch_to_trainer`); trainer_wait_s is the
trainer waiting for a trainable batch: in the modes where verl's `timing_s/gen` is that wait
(`execution_mode.WAIT_MODES`) gen_s moves into it and generate_sequences_s into rollout_s, the rollout
side's busy seconds, so no generation line is ever fitted to a wait. The rollout side's columns
(`ASYNC_COLUMNS`: rollout_s, the logged idle ratios, staleness, stale and dropped samples, the partial
rollouts' share) and the run's execution_mode ride along; generate_sequences_s is verl's `timing_s/generate_sequences`, the
decoding inside gen_s (the rest of gen_s is the colocated engine's switch: waking, resharding and
offloading). wall_s is the canonical frame's step_s (the run's semantics record decides it: the
logged total, with testing and checkpoint added back when the total leaves them out, or Σ logged
timers, 'derived from stage timers', when no total is logged) and step_time_basis says which.
n_responses falls back on the record's responses per step. steps_covered is how many optimizer steps
the row stands for (TRL logs every `logging_steps`-th step, its values the means over the steps
since the last log: `trl/steps_covered`), 1 elsewhere; a run's seconds are Σ wall_s · steps_covered. segment_start marks each segment's first
timed, not validation-only step (its first step when none is timed); restart marks the first step of
a later segment and steps flagged restart or resumed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import duckdb
import polars as pl

from polytrace_cli.analyze.shared_frames import shared
from polytrace_cli.errors import PolytraceError
from polytrace_cli.semantics.execution_mode import WAIT_MODES
from polytrace_cli.store.catalog import steps_of_runs_sql
from polytrace_cli.store.sql import fetch_first

# Stages with a workload model, in pipeline order, and the logged overheads besides them.
MODELLED_STAGES = ("gen", "trainer_wait", "reward", "old_log_prob", "ref", "values", "adv", "update_actor",
                   "update_critic", "update_weights", "switch")
# The rollout side of an asynchronous run, read beside the trainer's stages (never a stage of its step).
ASYNC_COLUMNS = ("rollout_s", "trainer_idle_ratio", "rollout_idle_ratio", "staleness_mean", "staleness_max",
                 "stale_samples", "dropped_samples", "partial_ratio")
OVERHEADS = ("testing", "save_checkpoint")
FEATURES = ("r_max", "response_tokens", "total_tokens", "busiest_rank_tokens", "mean_rank_tokens", "n_responses",
            "balanced_busiest_tokens")

WORKLOAD_COLUMNS = {
    "segment": pl.Int64, "step": pl.Int64,
    **{name: pl.Float64 for name in FEATURES},
    "ranks": pl.Int64, "workload_basis": pl.String, "per_rank_data": pl.Boolean, "busiest_after_balancing": pl.Boolean,
    **{f"{stage}_s": pl.Float64 for stage in (*MODELLED_STAGES, *OVERHEADS)},
    "step_s": pl.Float64, "wall_s": pl.Float64, "step_time_basis": pl.String, "generate_sequences_s": pl.Float64,
    "steps_covered": pl.Float64,
    "validation_only": pl.Boolean, "has_testing": pl.Boolean, "has_checkpoint": pl.Boolean,
    "segment_start": pl.Boolean, "restart": pl.Boolean, "truncated_line": pl.Boolean,
    **{name: pl.Float64 for name in ASYNC_COLUMNS}, "execution_mode": pl.String,
}

# The `steps` columns the workload frame reads (`catalog.steps_of_runs_sql`).
_STEP_COLUMNS = ["response_length_max", "response_length_mean", "prompt_length_mean", "total_tokens", "gen_s",
                 "trainer_wait_s", "rollout_s", "trainer_idle_ratio", "rollout_idle_ratio", "staleness_mean",
                 "staleness_max", "stale_samples", "dropped_samples", "partial_ratio", "reward_s", "old_log_prob_s",
                 "ref_s", "values_s", "adv_s", "update_actor_s", "update_critic_s", "testing_s", "save_checkpoint_s",
                 "step_s"]
_WORKLOAD_SQL = """
WITH st AS ({steps}
), extra AS (
    SELECT sm.segment, sm.step,
           max(sm.value) FILTER (WHERE sm.canonical IN ('update_weights_s', 'weight_sync_s')) AS update_weights_s,
           max(sm.value) FILTER (WHERE sm.canonical = 'rank_tokens_mean') AS seqlen_mean,
           max(sm.value) FILTER (WHERE sm.canonical = 'generate_sequences_s') AS generate_sequences_s,
           sum(sm.value) FILTER (WHERE sm.canonical IN ('switch_to_rollout_s', 'switch_to_trainer_s')) AS switch_s,
           max(sm.value) FILTER (WHERE sm.canonical = 'steps_covered') AS steps_covered
    FROM named_step_metrics sm
    WHERE sm.run_id = $run AND sm.canonical IN ('update_weights_s', 'weight_sync_s', 'rank_tokens_mean',
                                               'generate_sequences_s', 'switch_to_rollout_s', 'switch_to_trainer_s',
                                               'steps_covered')
    GROUP BY sm.segment, sm.step
), per_rank AS (
    SELECT step, coalesce(dp_rank, rank) AS dp_rank, max(response_len) AS r_max,
           sum(response_len) AS response_tokens, sum(coalesce(prompt_len, 0) + response_len) AS tokens,
           count(*) AS n
    FROM samples
    WHERE run_id = $run AND NOT coalesce(validate, false) AND response_len IS NOT NULL
      AND coalesce(tp_rank, 0) = 0
    GROUP BY ALL
), sampled AS (
    SELECT step, max(r_max) AS r_max, sum(response_tokens) AS response_tokens, sum(tokens) AS total_tokens,
           sum(n) AS n_responses, count(DISTINCT dp_rank) AS sample_ranks
    FROM per_rank GROUP BY step
), keys AS (
    SELECT segment, step FROM st
    UNION
    SELECT 0 AS segment, step FROM sampled WHERE step NOT IN (SELECT step FROM st)
)
SELECT k.segment::BIGINT AS segment, k.step::BIGINT AS step,
       st.response_length_max, st.response_length_mean, st.prompt_length_mean, st.total_tokens AS logged_total,
       extra.seqlen_mean,
       sampled.r_max AS sample_r_max, sampled.response_tokens AS sample_response_tokens,
       sampled.total_tokens AS sample_total_tokens, sampled.n_responses::DOUBLE AS sample_n,
       sampled.sample_ranks,
       st.gen_s, st.trainer_wait_s, extra.switch_s, st.rollout_s, st.trainer_idle_ratio, st.rollout_idle_ratio,
       st.staleness_mean, st.staleness_max, st.stale_samples, st.dropped_samples, st.partial_ratio, st.reward_s, st.old_log_prob_s, st.ref_s, st.values_s, st.adv_s, st.update_actor_s,
       st.update_critic_s, extra.update_weights_s, extra.generate_sequences_s, st.testing_s, st.save_checkpoint_s,
       coalesce(extra.steps_covered, 1)::DOUBLE AS steps_covered,
       st.step_s,
       coalesce(st.is_validation_only, false) AS validation_only,
       coalesce(st.has_testing, false) AS has_testing, coalesce(st.has_checkpoint, false) AS has_checkpoint,
       k.step = min(k.step) OVER (PARTITION BY k.segment) AS segment_start,
       (k.segment > 0 AND k.step = min(k.step) OVER (PARTITION BY k.segment))
           OR coalesce(list_has_any(st.flags, ['restart', 'resumed']), false) AS restart,
       coalesce(st.truncated_line, false) AS truncated_line
FROM keys k
LEFT JOIN st ON st.segment = k.segment AND st.step = k.step
LEFT JOIN extra ON extra.segment = k.segment AND extra.step = k.step
LEFT JOIN sampled ON sampled.step = k.step
ORDER BY k.segment, k.step
"""


@dataclass(frozen=True)
class RunInfo:
    """What the workload frame needs from `runs`: id, name, meta."""

    run_id: int
    name: str
    meta: dict


def run_info(con: duckdb.DuckDBPyConnection, run: str | int) -> RunInfo:
    """The run by name (or id); an unknown run is a PolytraceError naming the known ones."""
    from polytrace_cli.store.queries import run_ids

    run_id = run if isinstance(run, int) else run_ids(con, [run])[0]
    from polytrace_cli.store.sql import fetch_first

    row = fetch_first(con, "SELECT name, meta FROM runs WHERE run_id = ?", [run_id])
    if row is None:
        raise PolytraceError(f"no run with id {run_id}")
    name, meta = row
    return RunInfo(run_id, name, json.loads(meta) if meta else {})


def _ranks_from_meta(meta: dict) -> int | None:
    for key in ("n_gpus", "dp_size", "world_size"):
        value = meta.get(key)
        if isinstance(value, (int, float)) and value >= 1:
            return int(value)
    nodes, per_node = meta.get("nnodes"), meta.get("n_gpus_per_node")
    if isinstance(nodes, (int, float)) and isinstance(per_node, (int, float)) and nodes * per_node >= 1:
        return int(nodes * per_node)
    return None


def read_workload(con: duckdb.DuckDBPyConnection, run: str | int) -> pl.DataFrame:
    """The run's per-step workload frame (columns `WORKLOAD_COLUMNS`, see the module docstring); read
    once per run inside `analyze.shared_frames.once_per_report()`, where a report asks explain, whatif
    and the backtest about the same runs."""
    return shared(_run_frame, con, run_info(con, run).run_id)


def _run_frame(con: duckdb.DuckDBPyConnection, run_id: int) -> pl.DataFrame:
    return _workload_frame(con, run_info(con, run_id))


def _workload_frame(con: duckdb.DuckDBPyConnection, info: RunInfo) -> pl.DataFrame:
    from polytrace_cli.analyze.semantics import BALANCED_MAX, record_of
    from polytrace_cli.analyze.step_frame import shared_step_frame

    steps = steps_of_runs_sql("($run)", _STEP_COLUMNS)
    raw = con.sql(_WORKLOAD_SQL.format(steps=steps), params={"run": info.run_id}).pl()
    record = record_of(con, info.run_id)
    canonical = (shared_step_frame(con, [info.run_id])
                 .select("segment", "step", "step_s", "step_time_basis", "mean_rank_tokens", "busiest_rank_tokens",
                         "busiest_rank_tokens_balanced")
                 .rename({"step_s": "canonical_step_s", "mean_rank_tokens": "frame_mean",
                          "busiest_rank_tokens": "frame_busiest"})
                 .with_columns(pl.col("segment").fill_null(0)))
    raw = raw.join(canonical, on=["segment", "step"], how="left", maintain_order="left")
    meta_ranks = _ranks_from_meta(info.meta)
    ranks = meta_ranks or 1
    c = pl.col
    per_token = c("prompt_length_mean") + c("response_length_mean")
    logged_n = pl.when(per_token > 0).then((c("logged_total") / per_token).round(0))
    balanced = record["lambda_basis"] == BALANCED_MAX
    df = raw.with_columns(
        r_max=pl.coalesce(c("response_length_max"), c("sample_r_max")),
        n_responses=pl.coalesce(logged_n, c("sample_n"), pl.lit(record["responses_per_step"], dtype=pl.Float64)),
        total_tokens=pl.coalesce(c("logged_total"), c("sample_total_tokens")),
        logged_n=logged_n,
    ).with_columns(
        response_tokens=pl.coalesce(c("response_length_mean") * c("n_responses"), c("sample_response_tokens"),
                                    c("response_length_mean")),
        mean_rank_tokens=pl.coalesce(c("frame_mean"), c("total_tokens") / ranks),
        per_rank_data=c("frame_busiest").is_not_null() & c("frame_mean").is_not_null(),
        busiest_after_balancing=pl.lit(balanced) & c("busiest_rank_tokens_balanced").is_not_null(),
        balanced_busiest_tokens=c("busiest_rank_tokens_balanced") if balanced else pl.lit(None, dtype=pl.Float64),
    ).with_columns(
        busiest_rank_tokens=pl.coalesce(c("frame_busiest"), c("mean_rank_tokens")),
        ranks=pl.coalesce(
            pl.when(c("seqlen_mean") > 0).then((c("logged_total") / c("seqlen_mean")).round(0).cast(pl.Int64)),
            pl.when(c("sample_ranks") > 0).then(c("sample_ranks").cast(pl.Int64)),
            pl.lit(meta_ranks, dtype=pl.Int64),
        ),
        workload_basis=pl.when(c("response_length_max").is_not_null() | c("logged_total").is_not_null())
        .then(pl.lit("step_aggregates"))
        .when(c("sample_r_max").is_not_null()).then(pl.lit("samples")),
        wall_s=c("canonical_step_s"),
        execution_mode=pl.lit(record.get("execution_mode"), dtype=pl.String),
    )
    if record.get("execution_mode") in WAIT_MODES:
        # verl's `timing_s/gen` is the trainer waiting for a trainable batch in these modes, and
        # `timing_s/generate_sequences` the rollout's own generation of the batch.
        df = df.with_columns(trainer_wait_s=pl.coalesce(c("trainer_wait_s"), c("gen_s")),
                             rollout_s=pl.coalesce(c("rollout_s"), c("generate_sequences_s")),
                             gen_s=pl.lit(None, dtype=pl.Float64), generate_sequences_s=pl.lit(None, dtype=pl.Float64))
    # A segment's first step is its first timed training step (a validation-only step 0 is not it).
    trained = c("wall_s").is_not_null() & ~c("validation_only")
    first = c("step").filter(trained).min().over("segment")
    df = df.with_columns(segment_start=pl.when(first.is_not_null()).then(c("step") == first)
                         .otherwise(c("segment_start")))
    return df.select(list(WORKLOAD_COLUMNS)).cast(WORKLOAD_COLUMNS)


def overheads_included(con: duckdb.DuckDBPyConnection, run_id: int) -> tuple[bool | None, bool | None]:
    """Whether the run's step_s includes testing_s and save_checkpoint_s: true / false / None = cannot
    tell, from run meta or the run's numbers (`analyze.stages.step_time_inclusion`). The workload
    frame takes None as true, verl's layout up to 0.7 (`explain` says so in a note)."""
    from polytrace_cli.analyze.stages import step_time_inclusion

    row = step_time_inclusion(con, [run_id]).row(0, named=True)
    return row["includes_testing"], row["includes_checkpoint"]


def logs_step_metrics(con: duckdb.DuckDBPyConnection, run_id: int) -> bool:
    """Whether the run logged any step metric. When it logged none (a per-sample trace), its workload
    frame has no timed step, since every step or stage time comes from the `steps` view, which only
    step metrics feed: no step-time model can be fitted, and this says so without reading the frame."""
    return bool(fetch_first(con, "SELECT EXISTS (SELECT 1 FROM step_metrics WHERE run_id = ?)", [run_id])[0])


def training_mask(df: pl.DataFrame) -> pl.Series:
    """Steps a model is fitted on: logged a step or stage time, not validation-only, without
    testing or checkpoint overheads, not the first step of a segment (warm-up) nor a restart. In a
    run where every timed step logs one of the overheads (a validation every step), steps with that
    overhead are kept: it is a logged overhead the model keeps apart from the stages, and leaving
    them out would leave nothing to fit."""
    timed = df["wall_s"].is_not_null() & ~df["validation_only"]
    testing, checkpoint = df["has_testing"], df["has_checkpoint"]
    if timed.any() and not (timed & ~testing).any():
        testing = pl.Series([False] * df.height)
    if timed.any() and not (timed & ~checkpoint).any():
        checkpoint = pl.Series([False] * df.height)
    return (timed & ~testing & ~checkpoint & ~df["segment_start"] & ~df["restart"]).alias("training")
