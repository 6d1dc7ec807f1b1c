"""The time axis: what each rank and role did when, from the `spans` table, with its analyses.

**Spans** (`run_spans`, `SPAN_COLUMNS`). A run's spans are the ones its trace files gave. A span
without a step, on wall clock, takes the step whose window (first start to last end of the run's
wall-clock spans of that step) holds its start; on a file's own clock, only a `step` span of the same
file gives it one (the readers do that). A run with no span at all gets spans **synthesized** from its
stage timers: each step's stages laid end to end in verl's order (gen, reward, old_log_prob, ref,
values, adv, update_critic, update_actor, update_weights, testing, save_checkpoint), the steps one
after another at their step time (the canonical `step_s`, else the stages' sum); where
`rank_timings` give a stage per rank, one span per rank, each as long as that rank's seconds, the
stage lasting as long as its slowest rank. Such spans carry `synthesized = true`, and every number
computed from them says so (`basis = synthesized`): they show the order the framework runs its
stages in, not when a rank really was busy.

A **worker** is a role and a rank (`actor rank 3`), or a role and a lane where the source gives no
rank (a NeMo-RL sample lane). Spans are compared in time only inside one **clock domain**: all
wall-clock spans of a run, or one file's spans on its own clock.

**Per step** (`per_step`, `STEP_COLUMNS`), over the stage spans (a stage other than `step`):

    window_s        = max t1 − min t0 over the step's spans (of its largest clock domain; the
                      overlap and the critical path are read there too, while the bubbles and
                      the straggler compare durations and so take every domain's spans)
    busy(w, k)      = length of the union of worker w's spans of stage k in the step, less the part
                      of it inside w's collective-communication ranges (`gloo:all_reduce`,
                      `nccl:*`, barriers): a rank waiting in a collective is waiting, not working
    bubble_s        = Σ over (role, stage) with ≥ 2 workers of Σ_w (max_w' busy(w', k) − busy(w, k)):
                      the time ranks of one role spend waiting for the slowest of them in a stage
    bubble_share    = bubble_s / Σ over those (role, stage) of n_workers · max_w busy(w, k)
    straggler       = in the (role, stage) with the largest bubble, the worker with the largest busy;
                      straggler_lead = its busy / the mean busy of that (role, stage)
    overlap_s       = length of (union of the domain's gen spans, any step) ∩ (union of this step's
                      training spans: old_log_prob, ref, values, update_actor, update_critic)
    overlap_share   = overlap_s / length of the union of this step's training spans
    critical path   = walking back from the span that ends last: each time the span that ends
                      latest at or before the current span's start (within 0.5 % of the window,
                      for launch delays and clock jitter; the longest of ties); critical_path_s is
                      the union length of the spans on it, critical_stage the stage with most of it

**Per rank** (`per_rank`, `RANK_COLUMNS`): over the steps, Σ window_s of the worker's domain,
busy_s = Σ the union of all its stage spans per step, idle_s = Σ window − busy, idle_share = idle / window,
straggler_steps the steps it was the straggler in; from the profiler's `gpu kernels` spans
(first to last kernel of a GPU, `busy_us` the union of its kernels), gpu_window_s and gpu_idle_s =
window − kernel union, the idle time HTA's temporal breakdown reports.

**Per rank and stage** (`per_rank_stage`, `RANK_STAGE_COLUMNS`): spans, busy_s (Σ per-step union),
gpu_s = Σ `busy_us` of its outermost spans (a range nested in another of the same stage counts once),
mean_s = busy_s / steps.

**Summary** (registered `timeline`, `SUMMARY_COLUMNS`): per run, the basis (`spans`, `synthesized`,
or `no_spans` when the run has neither spans nor stage timers), steps, workers, roles, the means of
window_s, idle_share over workers, bubble_share and overlap_share over steps, the rank that was the
straggler most often and in what share of the steps with a straggler, the stage with the most
critical-path seconds, and gpu_idle_share = Σ gpu_idle / Σ gpu_window.
"""

from __future__ import annotations

import duckdb
import numpy as np
import polars as pl

from polytrace_cli.analyze.common import ALL_STEPS, StepRange, frame, ids_sql
from polytrace_cli.analyze.registry import register
from polytrace_cli.analyze.shared_frames import shared
from polytrace_cli.store.catalog import steps_of_runs_sql

# verl's stage order in a step (`verl/trainer/ppo/ray_trainer.py`, `fit`).
STAGE_ORDER = ("gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor",
               "update_weights", "testing", "save_checkpoint")
TRAINING_STAGES = ("old_log_prob", "ref", "values", "update_actor", "update_critic")
ROLE_OF_STAGE = {"gen": "rollout", "reward": "reward", "old_log_prob": "actor", "ref": "ref", "values": "critic",
                 "adv": "driver", "update_critic": "critic", "update_actor": "actor", "update_weights": "actor",
                 "testing": "driver", "save_checkpoint": "driver", "tool": "rollout"}
# Collective-communication ranges (`gloo:all_reduce`, `nccl:all_gather`, `c10d::barrier`): time a rank
# spends in them inside a stage is waiting for the others, not the stage's own work.
COMMUNICATION = r"(^|[:_. ])(gloo|nccl|hccl|c10d)[:_]|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast|barrier"
# How far before a span's start the span before it on the critical path may end, as a share of the step's window.
CRITICAL_SLACK = 0.005

SPAN_COLUMNS: dict[str, pl.DataType] = {
    "run": pl.String, "run_id": pl.Int64, "step": pl.Int64, "role": pl.String, "rank": pl.Int64,
    "lane": pl.String, "worker": pl.String, "name": pl.String, "stage": pl.String,
    "t0_us": pl.Float64, "t1_us": pl.Float64, "domain": pl.String, "busy_us": pl.Float64,
    "status": pl.String, "synthesized": pl.Boolean,
}
STEP_COLUMNS: dict[str, pl.DataType] = {
    "run": pl.String, "step": pl.Int64, "synthesized": pl.Boolean, "workers": pl.Int64,
    "window_s": pl.Float64, "bubble_s": pl.Float64, "bubble_share": pl.Float64,
    "straggler": pl.String, "straggler_rank": pl.Int64, "straggler_role": pl.String,
    "straggler_stage": pl.String, "straggler_lead": pl.Float64,
    "overlap_s": pl.Float64, "overlap_share": pl.Float64,
    "critical_path": pl.String, "critical_path_s": pl.Float64, "critical_stage": pl.String,
}
RANK_COLUMNS: dict[str, pl.DataType] = {
    "run": pl.String, "role": pl.String, "worker": pl.String, "rank": pl.Int64, "synthesized": pl.Boolean,
    "steps": pl.Int64, "window_s": pl.Float64, "busy_s": pl.Float64, "idle_s": pl.Float64,
    "idle_share": pl.Float64, "straggler_steps": pl.Int64, "gpu_window_s": pl.Float64, "gpu_idle_s": pl.Float64,
}
RANK_STAGE_COLUMNS: dict[str, pl.DataType] = {
    "run": pl.String, "role": pl.String, "worker": pl.String, "rank": pl.Int64, "stage": pl.String,
    "synthesized": pl.Boolean, "steps": pl.Int64, "spans": pl.Int64, "busy_s": pl.Float64,
    "gpu_s": pl.Float64, "mean_s": pl.Float64,
}
SUMMARY_COLUMNS: dict[str, pl.DataType] = {
    "run": pl.String, "basis": pl.String, "steps": pl.Int64, "workers": pl.Int64, "roles": pl.String,
    "mean_window_s": pl.Float64, "mean_idle_share": pl.Float64, "mean_bubble_share": pl.Float64,
    "mean_overlap_share": pl.Float64, "top_straggler": pl.String, "top_straggler_share": pl.Float64,
    "critical_stage": pl.String, "gpu_idle_share": pl.Float64, "note": pl.String,
}

LANE_COLUMNS: dict[str, pl.DataType] = {**SPAN_COLUMNS, "which": pl.String, "offset_s": pl.Float64,
                                        "end_s": pl.Float64}

SYNTHESIZED_DOMAIN = "synthesized"


def _empty(schema: dict[str, pl.DataType]) -> pl.DataFrame:
    return pl.DataFrame(schema=schema)


def run_spans(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """Every span of the runs (`SPAN_COLUMNS`): the read ones, with steps given by containment on wall
    clock, and for a run without any, spans synthesized from its stage timers (module docstring)."""
    if not run_ids:
        return _empty(SPAN_COLUMNS)
    ids = ids_sql(run_ids)
    read = frame(con,
        f"""
        WITH s AS (
            SELECT row_number() OVER () AS id, * FROM spans WHERE run_id IN {ids}),
        windows AS (
            SELECT run_id, step, min(t0_us) AS w0, max(t1_us) AS w1 FROM s
            WHERE clock = 'wall' AND step IS NOT NULL GROUP BY ALL),
        placed AS (
            SELECT s.id, arg_max(w.step, w.w0) AS step FROM s JOIN windows w
              ON w.run_id = s.run_id AND s.clock = 'wall' AND s.step IS NULL AND s.t0_us >= w.w0 AND s.t0_us <= w.w1
            GROUP BY s.id)
        SELECT r.name AS run, s.run_id::BIGINT AS run_id, coalesce(s.step, p.step)::BIGINT AS step, s.role,
               s.rank::BIGINT AS rank, s.lane,
               s.role || ' ' || coalesce('rank ' || s.rank, s.lane, '?') AS worker, s.name, s.stage, s.t0_us, s.t1_us,
               CASE WHEN s.clock = 'wall' THEN 'wall' ELSE 'file ' || s.file_id END AS domain, s.busy_us, s.status,
               s.synthesized
        FROM s JOIN runs r ON r.run_id = s.run_id LEFT JOIN placed p ON p.id = s.id
        """)
    read = read.filter(_in_steps(steps))
    without = [run_id for run_id in run_ids
               if run_id not in set(frame(con, f"SELECT DISTINCT run_id FROM spans WHERE run_id IN {ids}")
                                    .get_column("run_id").to_list())]
    made = synthesized_spans(con, without, steps) if without else _empty(SPAN_COLUMNS)
    return pl.concat([read.cast(SPAN_COLUMNS), made.cast(SPAN_COLUMNS)], how="vertical").select(list(SPAN_COLUMNS))


def _in_steps(steps: StepRange) -> pl.Expr:
    expr = pl.lit(True)
    if steps.first is not None:
        expr = expr & (pl.col("step").is_null() | (pl.col("step") >= steps.first))
    if steps.last is not None:
        expr = expr & (pl.col("step").is_null() | (pl.col("step") <= steps.last))
    return expr


def synthesized_spans(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """Spans laid end to end from the runs' stage timers (module docstring), `synthesized = true`."""
    from polytrace_cli.analyze.step_frame import shared_step_frame
    from polytrace_cli.semantics import step_timers

    if not run_ids:
        return _empty(SPAN_COLUMNS)
    stages = [c.removesuffix("_s") for c in step_timers.stage_columns(con)] + ["testing", "save_checkpoint"]
    ordered = [s for s in STAGE_ORDER if s in stages] + [s for s in stages if s not in STAGE_ORDER]
    ids = ids_sql(run_ids)
    timers = frame(con,
        f"""SELECT r.name AS run, st.run_id::BIGINT AS run_id, st.segment::BIGINT AS segment, st.step::BIGINT AS step,
                   {', '.join(f'st.{s}_s AS "{s}"' for s in ordered)}
            FROM ({steps_of_runs_sql(ids, [f"{s}_s" for s in ordered], steps.sql())}) st
            JOIN runs r USING (run_id)""")
    if timers.is_empty():
        return _empty(SPAN_COLUMNS)
    canonical = shared_step_frame(con, run_ids, steps).select("run", "segment", "step", "step_s")
    timers = timers.join(canonical, on=["run", "segment", "step"], how="left")
    long = (timers.unpivot(index=["run", "run_id", "segment", "step", "step_s"], on=ordered,
                           variable_name="stage", value_name="seconds")
            .filter(pl.col("seconds").is_not_null() & (pl.col("seconds") > 0))
            .with_columns(order=pl.col("stage").replace_strict({s: i for i, s in enumerate(ordered)},
                                                                return_dtype=pl.Int64)))
    if long.is_empty():
        return _empty(SPAN_COLUMNS)
    per_rank = frame(con,
        f"""SELECT r.name AS run, t.step::BIGINT AS step, t.stage, t.rank::BIGINT AS rank, max(t.seconds) AS rank_seconds
            FROM rank_timings t JOIN runs r USING (run_id)
            WHERE t.run_id IN {ids} AND {steps.sql('t.step')} AND NOT coalesce(t.validate, false)
              AND t.seconds IS NOT NULL AND t.rank IS NOT NULL
            GROUP BY ALL""")
    slowest = per_rank.group_by("run", "step", "stage").agg(pl.col("rank_seconds").max().alias("slowest"))
    long = (long.join(slowest, on=["run", "step", "stage"], how="left")
            .with_columns(length=pl.max_horizontal("seconds", pl.col("slowest").fill_null(0)))
            .sort("run", "segment", "step", "order", nulls_last=False))
    step_lengths = (long.group_by("run", "segment", "step", maintain_order=True)
                    .agg(pl.col("length").sum().alias("stages"), pl.col("step_s").first())
                    .with_columns(length=pl.max_horizontal(pl.col("step_s").fill_null(0), "stages"))
                    .with_columns(start=(pl.col("length").cum_sum() - pl.col("length")).over("run")))
    long = (long.join(step_lengths.select("run", "segment", "step", "start"), on=["run", "segment", "step"])
            .with_columns(t0=pl.col("start") + (pl.col("length").cum_sum() - pl.col("length"))
                          .over("run", "segment", "step")))
    whole = long.join(per_rank.select("run", "step", "stage").unique(), on=["run", "step", "stage"], how="anti")
    ranked = long.join(per_rank, on=["run", "step", "stage"], how="inner")
    role = pl.col("stage").replace_strict(ROLE_OF_STAGE, default="driver", return_dtype=pl.String)
    common = dict(name=pl.col("stage"), domain=pl.lit(SYNTHESIZED_DOMAIN), busy_us=pl.lit(None, pl.Float64),
                  status=pl.lit(None, pl.String), synthesized=pl.lit(True), lane=pl.lit(None, pl.String))
    whole = whole.with_columns(role=role, rank=pl.lit(None, pl.Int64), t0_us=pl.col("t0") * 1e6,
                               t1_us=(pl.col("t0") + pl.col("length")) * 1e6, **common)
    ranked = ranked.with_columns(role=role, t0_us=pl.col("t0") * 1e6,
                                 t1_us=(pl.col("t0") + pl.col("rank_seconds")) * 1e6, **common)
    spans = pl.concat([whole.select(list(SPAN_COLUMNS.keys() - {"worker"})),
                       ranked.select(list(SPAN_COLUMNS.keys() - {"worker"}))], how="diagonal_relaxed")
    spans = spans.with_columns(
        worker=pl.col("role") + pl.lit(" ") + pl.when(pl.col("rank").is_not_null())
        .then(pl.lit("rank ") + pl.col("rank").cast(pl.String)).otherwise(pl.lit("(all ranks)")))
    return spans.select(list(SPAN_COLUMNS)).cast(SPAN_COLUMNS).sort("run", "t0_us")


def shared_run_spans(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """`run_spans`, computed once per report."""
    return shared(run_spans, con, run_ids, steps)


def _union_sql(source: str, keys: str) -> str:
    """SQL of the union of the intervals (t0_us, t1_us) of `source` per `keys`: one row per island."""
    return f"""(
        WITH o AS (
            SELECT {keys}, t0_us, t1_us,
                   max(t1_us) OVER (PARTITION BY {keys} ORDER BY t0_us, t1_us
                                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
            FROM {source}),
        i AS (
            SELECT *, sum(CASE WHEN reach IS NULL OR t0_us > reach THEN 1 ELSE 0 END)
                      OVER (PARTITION BY {keys} ORDER BY t0_us, t1_us ROWS UNBOUNDED PRECEDING) AS island
            FROM o)
        SELECT {keys}, island, min(t0_us) AS t0_us, max(t1_us) AS t1_us FROM i GROUP BY {keys}, island)"""


class _Timeline:
    """The spans of some runs registered with DuckDB, and the tables every frame below is read from."""

    def __init__(self, con: duckdb.DuckDBPyConnection, spans: pl.DataFrame):
        self.con = con
        self.spans = spans
        con.register("_tl_spans", self.spans.to_arrow())
        con.execute("""CREATE OR REPLACE TEMP TABLE _tl_stage AS SELECT row_number() OVER () AS id, * FROM _tl_spans
                       WHERE stage IS NOT NULL AND stage <> 'step' AND step IS NOT NULL""")
        con.execute(f"""CREATE OR REPLACE TEMP TABLE _tl_comm AS SELECT * FROM _tl_spans
                        WHERE stage IS NULL AND step IS NOT NULL AND regexp_matches(name, '{COMMUNICATION}', 'i')""")

    def close(self) -> None:
        self.con.execute("DROP TABLE IF EXISTS _tl_stage")
        self.con.execute("DROP TABLE IF EXISTS _tl_comm")
        self.con.unregister("_tl_spans")

    def _comm_overlap_sql(self, keys: str) -> str:
        """SQL of (keys, waited_us): how much of the union of the stage spans per `keys` lies inside
        the same worker's collective-communication spans."""
        return f"""(
            WITH u AS {_union_sql('_tl_stage', keys)},
            c AS {_union_sql('_tl_comm', 'run, step, worker')}
            SELECT {', '.join('u.' + k.strip() for k in keys.split(','))},
                   sum(least(u.t1_us, c.t1_us) - greatest(u.t0_us, c.t0_us)) AS waited_us
            FROM u JOIN c ON c.run = u.run AND c.step = u.step AND c.worker = u.worker
                 AND c.t0_us < u.t1_us AND c.t1_us > u.t0_us
            GROUP BY ALL)"""

    def busy(self) -> pl.DataFrame:
        """(run, step, domain, role, worker, rank, stage, busy_s, spans, gpu_s) per worker, stage and step."""
        keys = "run, step, domain, role, worker, rank, stage, synthesized"
        return frame(self.con,
            f"""
            WITH u AS {_union_sql('_tl_stage', keys)},
            outer_spans AS (
                SELECT s.* FROM _tl_stage s
                WHERE NOT EXISTS (
                    SELECT 1 FROM _tl_stage p
                    WHERE p.run = s.run AND p.step = s.step AND p.worker = s.worker AND p.stage = s.stage
                      AND p.t0_us <= s.t0_us AND p.t1_us >= s.t1_us
                      AND (p.t0_us < s.t0_us OR p.t1_us > s.t1_us OR p.id < s.id))),
            gpu AS (SELECT {keys}, sum(busy_us) / 1e6 AS gpu_s, count(*) AS spans FROM outer_spans GROUP BY ALL),
            waited AS {self._comm_overlap_sql(keys)},
            b AS (SELECT {keys}, sum(t1_us - t0_us) AS span_us FROM u GROUP BY ALL)
            SELECT b.* EXCLUDE (span_us), (b.span_us - coalesce(w.waited_us, 0)) / 1e6 AS busy_s,
                   coalesce(w.waited_us, 0) / 1e6 AS waited_s, coalesce(g.spans, 0) AS spans, g.gpu_s
            FROM b LEFT JOIN gpu g USING (run, step, domain, role, worker, rank, stage, synthesized)
            LEFT JOIN waited w USING (run, step, domain, role, worker, rank, stage, synthesized)
            """)

    def worker_busy(self) -> pl.DataFrame:
        """(run, step, domain, role, worker, rank, busy_s) over all of a worker's stage spans."""
        keys = "run, step, domain, role, worker, rank, synthesized"
        return frame(self.con, f"""
            WITH b AS (SELECT {keys}, sum(t1_us - t0_us) AS span_us FROM {_union_sql('_tl_stage', keys)} GROUP BY ALL),
            waited AS {self._comm_overlap_sql(keys)}
            SELECT b.* EXCLUDE (span_us), (b.span_us - coalesce(w.waited_us, 0)) / 1e6 AS busy_s
            FROM b LEFT JOIN waited w USING (run, step, domain, role, worker, rank, synthesized)""")

    def windows(self) -> pl.DataFrame:
        """(run, step, domain, window_s, t0_us) per step and clock domain."""
        return frame(self.con,
            """SELECT run, step, domain, (max(t1_us) - min(t0_us)) / 1e6 AS window_s, min(t0_us) AS t0_us
               FROM _tl_spans WHERE step IS NOT NULL AND name <> 'gpu kernels' GROUP BY ALL""")

    def overlap(self) -> pl.DataFrame:
        """(run, step, domain, overlap_s, training_s) per step."""
        training = ", ".join(f"'{s}'" for s in TRAINING_STAGES)
        return frame(self.con,
            f"""
            WITH g AS {_union_sql("(SELECT * FROM _tl_stage WHERE stage = 'gen')", 'run, domain')},
            t AS {_union_sql(f"(SELECT * FROM _tl_stage WHERE stage IN ({training}))", 'run, domain, step')},
            meet AS (
                SELECT t.run, t.step, t.domain, sum(least(t.t1_us, g.t1_us) - greatest(t.t0_us, g.t0_us)) AS overlap
                FROM t JOIN g ON g.run = t.run AND g.domain = t.domain AND g.t0_us < t.t1_us AND g.t1_us > t.t0_us
                GROUP BY ALL),
            lengths AS (SELECT run, step, domain, sum(t1_us - t0_us) AS training FROM t GROUP BY ALL)
            SELECT l.run, l.step, l.domain, coalesce(m.overlap, 0) / 1e6 AS overlap_s, l.training / 1e6 AS training_s
            FROM lengths l LEFT JOIN meet m USING (run, step, domain)
            """)

    def gpu(self) -> pl.DataFrame:
        """(run, worker, gpu_window_s, gpu_idle_s) from the `gpu kernels` spans."""
        return frame(self.con,
            """SELECT run, worker, sum(t1_us - t0_us) / 1e6 AS gpu_window_s,
                      sum(t1_us - t0_us - coalesce(busy_us, 0)) / 1e6 AS gpu_idle_s
               FROM _tl_spans WHERE name = 'gpu kernels' GROUP BY ALL""")


def _with_timeline(con, run_ids, steps, use):
    timeline = _Timeline(con, shared_run_spans(con, run_ids, steps))
    try:
        return use(timeline)
    finally:
        timeline.close()


def per_rank_stage(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """Busy time per worker and stage (`RANK_STAGE_COLUMNS`, module docstring)."""
    if not run_ids:
        return _empty(RANK_STAGE_COLUMNS)

    def compute(timeline: _Timeline) -> pl.DataFrame:
        busy = timeline.busy()
        if busy.is_empty():
            return _empty(RANK_STAGE_COLUMNS)
        return (busy.group_by("run", "role", "worker", "rank", "stage", "synthesized")
                .agg(pl.col("step").n_unique().alias("steps"), pl.col("spans").sum(), pl.col("busy_s").sum(),
                     pl.when(pl.col("gpu_s").is_not_null().any()).then(pl.col("gpu_s").sum()).alias("gpu_s"))
                .with_columns(mean_s=pl.col("busy_s") / pl.col("steps"))
                .select(list(RANK_STAGE_COLUMNS)).cast(RANK_STAGE_COLUMNS).sort("run", "role", "worker", "stage"))
    return _with_timeline(con, run_ids, steps, compute)


def per_step(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """One row per step with spans (`STEP_COLUMNS`, module docstring)."""
    if not run_ids:
        return _empty(STEP_COLUMNS)
    return shared(_per_step, con, run_ids, steps)


def _per_step(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange) -> pl.DataFrame:
    return _with_timeline(con, run_ids, steps, _steps_of)


def _steps_of(timeline: _Timeline) -> pl.DataFrame:
    spans = timeline.spans
    if spans.filter(pl.col("step").is_not_null()).is_empty():
        return _empty(STEP_COLUMNS)
    windows = timeline.windows()
    # A step's numbers come from its largest clock domain (the one with the longest window).
    main = (windows.sort("window_s", descending=True).group_by("run", "step", maintain_order=True)
            .agg(pl.col("domain").first(), pl.col("window_s").first()))
    # Bubbles compare durations, so ranks on clocks of their own (one file each) still compare.
    busy = timeline.busy()
    groups = (busy.group_by("run", "step", "role", "stage")
              .agg(pl.col("worker").count().alias("n"), pl.col("busy_s").max().alias("top"),
                   pl.col("busy_s").mean().alias("mean"), pl.col("busy_s").sum().alias("total"),
                   pl.col("worker").sort_by("busy_s", descending=True).first().alias("slowest"),
                   pl.col("rank").sort_by("busy_s", descending=True).first().alias("slowest_rank"))
              .filter(pl.col("n") >= 2)
              .with_columns(bubble=pl.col("n") * pl.col("top") - pl.col("total"),
                            room=pl.col("n") * pl.col("top")))
    bubbles = groups.group_by("run", "step").agg(
        pl.col("bubble").sum().alias("bubble_s"),
        (pl.col("bubble").sum() / pl.col("room").sum()).alias("bubble_share"),
        pl.col("slowest").sort_by("bubble", descending=True).first().alias("straggler"),
        pl.col("slowest_rank").sort_by("bubble", descending=True).first().alias("straggler_rank"),
        pl.col("role").sort_by("bubble", descending=True).first().alias("straggler_role"),
        pl.col("stage").sort_by("bubble", descending=True).first().alias("straggler_stage"),
        (pl.col("top") / pl.col("mean")).sort_by("bubble", descending=True).first().alias("straggler_lead"))
    workers = busy.group_by("run", "step").agg(pl.col("worker").n_unique().alias("workers"))
    overlap = timeline.overlap().join(main.select("run", "step", "domain"), on=["run", "step", "domain"]).select(
        "run", "step", "overlap_s",
        pl.when(pl.col("training_s") > 0).then(pl.col("overlap_s") / pl.col("training_s")).alias("overlap_share"))
    synthesized = spans.group_by("run", "step").agg(pl.col("synthesized").all())
    critical = _critical_paths(spans.join(main.select("run", "step", "domain"), on=["run", "step", "domain"]))
    out = (main.select("run", "step", "window_s")
           .join(synthesized, on=["run", "step"], how="left")
           .join(workers, on=["run", "step"], how="left")
           .join(bubbles, on=["run", "step"], how="left")
           .join(overlap, on=["run", "step"], how="left")
           .join(critical, on=["run", "step"], how="left"))
    # Laid end to end, synthesized stages never overlap: no overlap is measured there.
    out = out.with_columns(workers=pl.col("workers").fill_null(0),
                           **{c: pl.when(~pl.col("synthesized")).then(pl.col(c)) for c in ("overlap_s", "overlap_share")})
    return out.select(list(STEP_COLUMNS)).cast(STEP_COLUMNS).sort("run", "step")


CRITICAL_COLUMNS = {"run": pl.String, "step": pl.Int64, "critical_path": pl.String,
                    "critical_path_s": pl.Float64, "critical_stage": pl.String}


def _critical_paths(spans: pl.DataFrame) -> pl.DataFrame:
    """The critical path of each step (module docstring) from its stage spans of one clock domain."""
    stage_spans = spans.filter(pl.col("stage").is_not_null() & (pl.col("stage") != "step")
                               & pl.col("step").is_not_null())
    laid = _laid_end_to_end_paths(stage_spans.filter(pl.col("synthesized")))
    rows = []
    for (run, step), group in stage_spans.filter(~pl.col("synthesized")).group_by("run", "step", maintain_order=True):
        t0 = group.get_column("t0_us").to_numpy()
        t1 = group.get_column("t1_us").to_numpy()
        stages = group.get_column("stage").to_list()
        workers = group.get_column("worker").to_list()
        slack = CRITICAL_SLACK * (t1.max() - t0.min())
        # The last to end (the longest of ties) starts the walk back.
        current = int(np.lexsort((t0, -t1))[0])
        path = [current]
        while True:
            eligible = np.flatnonzero(t1 <= t0[current] + slack)
            eligible = eligible[t0[eligible] < t0[current]]
            if not len(eligible):
                break
            order = np.lexsort((t0[eligible], -t1[eligible]))
            current = int(eligible[order[0]])
            path.append(current)
        path.reverse()
        seconds: dict[str, float] = {}
        covered = 0.0
        reach = -np.inf
        for index in path:
            start, end = max(t0[index], reach), t1[index]
            if end > start:
                covered += end - start
                seconds[stages[index]] = seconds.get(stages[index], 0.0) + (end - start)
            reach = max(reach, end)
        text = " → ".join(f"{stages[i]} ({workers[i]})" for i in path)
        rows.append((run, step, text, covered / 1e6, max(seconds, key=seconds.get) if seconds else None))
    walked = pl.DataFrame(rows, schema=CRITICAL_COLUMNS, orient="row")
    return pl.concat([walked, laid]).cast(CRITICAL_COLUMNS)


def _laid_end_to_end_paths(spans: pl.DataFrame) -> pl.DataFrame:
    """The critical path of steps synthesized from timers, in bulk: their stages follow each other, so
    the path is each stage's longest span (its slowest rank) in order, as the walk back would find."""
    if spans.is_empty():
        return _empty(CRITICAL_COLUMNS)
    slowest = (spans.sort("t1_us", descending=True).group_by("run", "step", "stage").first()
               .sort("run", "step", "t0_us"))
    return (slowest.group_by("run", "step", maintain_order=True)
            .agg(pl.format("{} ({})", "stage", "worker").str.join(" → ").alias("critical_path"),
                 ((pl.col("t1_us") - pl.col("t0_us")).sum() / 1e6).alias("critical_path_s"),
                 pl.col("stage").sort_by(pl.col("t1_us") - pl.col("t0_us"), descending=True).first()
                 .alias("critical_stage"))
            .select(list(CRITICAL_COLUMNS)))


def per_rank(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """Busy and idle time per worker over the steps (`RANK_COLUMNS`, module docstring)."""
    if not run_ids:
        return _empty(RANK_COLUMNS)
    return _with_timeline(con, run_ids, steps, lambda timeline: _ranks_of(timeline, _steps_of(timeline)))


def _ranks_of(timeline: _Timeline, by_step: pl.DataFrame) -> pl.DataFrame:
    busy = timeline.worker_busy()
    gpu = timeline.gpu()
    if busy.is_empty() and gpu.is_empty():
        return _empty(RANK_COLUMNS)
    windows = timeline.windows()
    rows = (busy.join(windows.select("run", "step", "domain", "window_s"), on=["run", "step", "domain"], how="left")
            .group_by("run", "role", "worker", "rank", "synthesized")
            .agg(pl.col("step").n_unique().alias("steps"), pl.col("window_s").sum(), pl.col("busy_s").sum()))
    stragglers = (by_step.filter(pl.col("straggler").is_not_null())
                  .group_by("run", "straggler").agg(pl.len().alias("straggler_steps"))
                  .rename({"straggler": "worker"}))
    out = rows.join(gpu, on=["run", "worker"], how="full", coalesce=True)
    measured = ~pl.col("synthesized").fill_null(False)
    # A synthesized role is idle while the others' stages run by construction: no idle time is measured there.
    out = out.with_columns(
        role=pl.coalesce("role", pl.col("worker").str.split(" ").list.first()),
        idle_s=pl.when(measured).then(pl.col("window_s") - pl.col("busy_s")),
        idle_share=pl.when(measured & (pl.col("window_s") > 0)).then(1 - pl.col("busy_s") / pl.col("window_s")),
        synthesized=pl.col("synthesized").fill_null(False), steps=pl.col("steps").fill_null(0),
    ).join(stragglers, on=["run", "worker"], how="left").with_columns(
        straggler_steps=pl.col("straggler_steps").fill_null(0))
    return out.select(list(RANK_COLUMNS)).cast(RANK_COLUMNS).sort("run", "role", "worker")


@register("timeline", "busy and idle time per rank and stage, bubbles, straggler ranks, rollout/training overlap, critical path (spans)")
def summary(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """One row per run (`SUMMARY_COLUMNS`, module docstring)."""
    from polytrace_cli.analyze.common import run_names

    if not run_ids:
        return _empty(SUMMARY_COLUMNS)
    names = run_names(con, run_ids)
    spans = shared_run_spans(con, run_ids, steps)
    timeline = _Timeline(con, spans)
    try:
        by_step = _steps_of(timeline)
        ranks = _ranks_of(timeline, by_step)
    finally:
        timeline.close()
    rows = []
    for run_id in run_ids:
        run = names[run_id]
        mine = spans.filter(pl.col("run") == run)
        if mine.is_empty():
            rows.append({"run": run, "basis": "no_spans", "steps": 0, "workers": 0,
                         "note": "no spans and no stage timers: nothing to lay on a time axis"})
            continue
        synthesized = bool(mine.get_column("synthesized").all())
        stepped = by_step.filter(pl.col("run") == run)
        workers = ranks.filter((pl.col("run") == run) & (pl.col("steps") > 0))
        stragglers = stepped.filter(pl.col("straggler").is_not_null())
        top = (stragglers.group_by("straggler").agg(pl.len().alias("n")).sort("n", "straggler", descending=[True, False])
               if not stragglers.is_empty() else None)
        critical = (stepped.filter(pl.col("critical_stage").is_not_null()).group_by("critical_stage")
                    .agg(pl.col("critical_path_s").sum()).sort("critical_path_s", descending=True))
        gpu = ranks.filter((pl.col("run") == run) & pl.col("gpu_window_s").is_not_null())
        notes = []
        if synthesized:
            notes.append("synthesized from stage timers: stages laid end to end in the framework's order, "
                         "not measured intervals")
        if stragglers.is_empty():
            notes.append("no stage run by two workers or more: no bubble and no straggler")
        rows.append({
            "run": run, "basis": "synthesized" if synthesized else "spans",
            "steps": stepped.height, "workers": workers.height,
            "roles": ", ".join(sorted(set(mine.get_column("role").drop_nulls().to_list()))),
            "mean_window_s": stepped.get_column("window_s").mean() if stepped.height else None,
            "mean_idle_share": workers.get_column("idle_share").mean() if workers.height else None,
            "mean_bubble_share": stepped.get_column("bubble_share").mean() if stragglers.height else None,
            "mean_overlap_share": stepped.get_column("overlap_share").mean(),
            "top_straggler": top.get_column("straggler")[0] if top is not None else None,
            "top_straggler_share": top.get_column("n")[0] / stragglers.height if top is not None else None,
            "critical_stage": critical.get_column("critical_stage")[0] if critical.height else None,
            "gpu_idle_share": (gpu.get_column("gpu_idle_s").sum() / gpu.get_column("gpu_window_s").sum()
                               if gpu.height and gpu.get_column("gpu_window_s").sum() > 0 else None),
            "note": "; ".join(notes) or None,
        })
    return pl.DataFrame(rows, schema=SUMMARY_COLUMNS)


def step_lanes(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """The spans of each run's slowest step and of its typical step (the step whose window is the
    median's nearest), for drawing as lanes (`LANE_COLUMNS`): the spans plus `which` ('slowest' or
    'typical') and `offset_s`, `end_s` (seconds from the step's first start)."""
    schema = LANE_COLUMNS
    by_step = per_step(con, run_ids, steps)
    spans = shared_run_spans(con, run_ids, steps)
    if by_step.is_empty():
        return _empty(schema)
    chosen = []
    for (run,), group in by_step.filter(pl.col("window_s").is_not_null()).group_by("run", maintain_order=True):
        if group.height < 2:
            continue
        slowest = group.sort("window_s", descending=True).row(0, named=True)["step"]
        median = group.get_column("window_s").median()
        typical = (group.filter(pl.col("step") != slowest).with_columns(gap=(pl.col("window_s") - median).abs())
                   .sort("gap", "step").row(0, named=True)["step"])
        chosen += [(run, slowest, "slowest"), (run, typical, "typical")]
    if not chosen:
        return _empty(schema)
    picks = pl.DataFrame(chosen, schema={"run": pl.String, "step": pl.Int64, "which": pl.String}, orient="row")
    lanes = spans.join(picks, on=["run", "step"]).filter(pl.col("stage").is_not_null() & (pl.col("stage") != "step"))
    return (lanes.with_columns(start=pl.col("t0_us").min().over("run", "step"))
            .with_columns(offset_s=(pl.col("t0_us") - pl.col("start")) / 1e6,
                          end_s=(pl.col("t1_us") - pl.col("start")) / 1e6)
            .select(list(schema)).cast(schema).sort("run", "which", "worker", "t0_us"))
