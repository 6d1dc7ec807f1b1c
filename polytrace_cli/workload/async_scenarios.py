"""Generated verl runs whose bound is known: a rollout pipeline and a trainer at chosen GPU splits.

Each scenario is a `StepTimeModel` of `workload.steplog` on the math preset's lengths (about 350 s of
generation and 175 s of training stages a step on all GPUs): the execution mode, the rollout's share of the
GPUs p, the staleness limit and the weight sync. With R = 350 / p and C = 175 / (1 − p) the rollout and
the trainer balance near p = 2/3; below it the trainer waits (rollout-bound), above it the rollout idles
(train-bound); a weight sync longer than both gaps makes it overhead-bound. The truth of a run
(`truth_bound`) is `async_pipeline.bound_of` on the means of the generator's per-step truth over the
steps after warm-up — the rule `diagnose.bounds` applies to the logged timers.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl

from polytrace_cli.workload.async_pipeline import bound_of
from polytrace_cli.workload.steplog import TRAINER_STAGES, StepTimeModel

BASE = StepTimeModel()
# name -> (model, expected bound): two GPU splits of each bound, a staleness-throttled run, a sync run.
SCENARIOS: dict[str, tuple[StepTimeModel, str]] = {
    "rollout-bound p=0.40": (replace(BASE, mode="fully-async", rollout_gpu_share=0.40), "rollout-bound"),
    "rollout-bound p=0.55": (replace(BASE, mode="fully-async", rollout_gpu_share=0.55), "rollout-bound"),
    "rollout-bound one-step-off p=0.50": (replace(BASE, mode="one-step-off", rollout_gpu_share=0.50), "rollout-bound"),
    "rollout-bound separate-async p=0.45": (replace(BASE, mode="separate-async", rollout_gpu_share=0.45),
                                            "rollout-bound"),
    "train-bound p=0.80": (replace(BASE, mode="fully-async", rollout_gpu_share=0.80), "train-bound"),
    "train-bound one-step-off p=0.75": (replace(BASE, mode="one-step-off", rollout_gpu_share=0.75), "train-bound"),
    "weight-sync-bound p=0.67": (replace(BASE, mode="fully-async", rollout_gpu_share=0.67, weight_sync_s=600.0),
                                 "overhead-bound"),
    "weight-sync-bound separate-async p=0.60": (replace(BASE, mode="separate-async", rollout_gpu_share=0.60,
                                                        weight_sync_s=500.0, switch_s=100.0), "overhead-bound"),
    "staleness-throttled K=0 p=0.75": (replace(BASE, mode="fully-async", rollout_gpu_share=0.75, staleness_limit=0),
                                       "train-bound"),
    "sync": (BASE, "rollout-bound"),
}


def truth_bound(frame: pl.DataFrame, first_step: int = 3) -> dict:
    """The true bound of a generated run (`steplog.step_table`'s frame) over its steps from first_step on:
    {'bound', 'seconds_per_step', 'wait_s', 'rollout_idle_s', 'overhead_s'}; a sync run's from its
    generation (rollout-bound), training stages (train-bound) and weight sync (overhead-bound)."""
    rows = frame.filter(pl.col("step") >= first_step)

    def mean(name: str) -> float:
        return float(rows[name].fill_null(0.0).mean()) if name in rows.columns else 0.0

    overhead = mean("update_weights_s") + mean("switch_s")
    if "trainer_wait_s" not in rows.columns:
        wait, idle = mean("gen_s"), sum(mean(f"{stage}_s") for stage in TRAINER_STAGES)
    else:
        wait, idle = mean("trainer_wait_s"), mean("rollout_idle_s")
    bound, seconds = bound_of(wait, idle, overhead)
    return {"bound": bound, "seconds_per_step": seconds, "wait_s": wait, "rollout_idle_s": idle,
            "overhead_s": overhead}


def relative_error(measured: float | None, truth: float) -> float:
    """|measured − truth| / truth (inf when nothing was measured)."""
    if measured is None or not np.isfinite(measured):
        return float("inf")
    return abs(measured - truth) / truth if truth else abs(measured)
