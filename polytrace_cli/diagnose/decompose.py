"""Per-step decomposition of the time a step took beyond what the run's model expects of it.

With f_k the fitted line of stage k, T the step's wall time and W̄_s the typical workload around
step s: per feature x, x̄_s = the running median of x over the nearest 21 training steps
(`thresholds.local_baseline`), and for the busiest rank x̄_s = mean_rank_tokens̄_s + gap̄_s with
gap = busiest − mean_rank_tokens, so that its volume and imbalance parts separate exactly. W̄_s is
the workload the step would have had without a change of its own: it follows a drift of the
workload over the run and ignores a single step's spike.

    expected_s = Σ_k f_k(W̄_s)                    (no testing or checkpoint)
    excess_s   = T − expected_s, split into causes that add up to it exactly:
        long_tail    = b_tail · (r_max − r̄_max,s)                                    stage gen
        token_volume = b_vol · (response_tokens − its x̄_s) + b_r · (n_responses − its x̄_s)
                       + Σ_k b_k · (mean_rank_tokens − its x̄_s)
        dp_imbalance = Σ_k b_k · ((busiest − mean_rank_tokens) − gap̄_s)
                       (busiest: the column the model's training stages follow, `busiest_feature`)
        validation   = testing_s                                                    stage testing
        checkpoint   = save_checkpoint_s                                            stage save_checkpoint
        weight_sync  = update_weights_s − a_w                                       stage update_weights
        rollout_wait = trainer_wait_s − a_wait  (an asynchronous trainer waiting longer than its usual level
                       for the rollout side: never long_tail or token_volume)       stage trainer_wait
        mode_switch  = switch_s − a_switch                                           stage switch
        warmup       = Σ_k (actual_k − f_k(W)) on warm-up steps
        unexplained  = Σ_k (actual_k − f_k(W)) on the other steps (the `other` stage is
                       T − Σ logged stages − overheads; a stage missing at a step counts 0 s)

The lines are linear, so f_k(W) − f_k(W̄_s) = Σ b · (x − x̄_s): the workload causes are what the
step's own workload added to the step its neighbours' workload would have taken.

A cause's stage is the stage holding the largest part of it.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from polytrace_cli.diagnose.thresholds import local_baseline
from polytrace_cli.model import StepTimeModel, stage_seconds
from polytrace_cli.model.fit import GAP_OF

CAUSES = ("long_tail", "token_volume", "dp_imbalance", "unexplained", "validation", "checkpoint", "weight_sync",
          "warmup", "rollout_wait", "mode_switch")
# Stages whose excess over their level is a cause of its own rather than unexplained time.
STAGE_CAUSE = {"update_weights": "weight_sync", "trainer_wait": "rollout_wait", "switch": "mode_switch"}
VOLUME_FEATURES = ("response_tokens", "n_responses", "total_tokens")

STEP_COLUMNS = {"segment": pl.Int64, "step": pl.Int64, "seconds": pl.Float64, "expected_s": pl.Float64,
                "model_s": pl.Float64, "excess_s": pl.Float64, "residual_s": pl.Float64}
PART_COLUMNS = {"segment": pl.Int64, "step": pl.Int64, "cause": pl.String, "stage": pl.String,
                "seconds": pl.Float64}


def residual_seconds(frame: pl.DataFrame, model: StepTimeModel) -> np.ndarray:
    """Per step, Σ_k (actual_k − f_k(W)) over the stages except weight sync: what the step's own
    workload does not explain (NaN for steps without a wall time)."""
    actual = stage_seconds(frame)
    predicted = model.predict(frame)
    total = np.zeros(frame.height)
    for stage in model.stages:
        if stage == "update_weights" or stage not in actual:
            continue
        total += np.nan_to_num(actual[stage]) - predicted[f"{stage}_s"].to_numpy()
    wall = frame["wall_s"].fill_null(np.nan).to_numpy()
    return np.where(np.isfinite(wall), total, np.nan)


def around(frame: pl.DataFrame, model: StepTimeModel, trailing: bool = False) -> dict[str, np.ndarray]:
    """W̄_s per step (see the module docstring): for each workload feature of `model.typical`, the
    running median of its values (missing ones at the run's typical value) over the nearest
    LOCAL_WINDOW training steps (with `trailing`, the LOCAL_WINDOW up to the step:
    `thresholds.local_baseline`); for each busiest-rank feature, mean_rank_tokens̄_s + its gap̄_s,
    gap = busiest − mean_rank_tokens (the gap's typical key holds gap̄_s)."""
    training = model.training.fill_null(False).to_numpy() if model.training.len() == frame.height \
        else np.ones(frame.height, dtype=bool)

    def filled(name: str) -> np.ndarray:
        values = frame[name].cast(pl.Float64).fill_null(np.nan).fill_nan(np.nan).to_numpy() \
            if name in frame.columns else np.full(frame.height, np.nan)
        return np.where(np.isfinite(values), values, model.typical.get(name, 0.0))

    local = {name: local_baseline(filled(name), training, trailing) for name in model.typical
             if name not in GAP_OF and name not in GAP_OF.values()}
    for feature, gap_name in GAP_OF.items():
        if feature not in model.typical or "mean_rank_tokens" not in local:
            continue
        mean = filled("mean_rank_tokens")
        raw = frame[feature].cast(pl.Float64).fill_null(np.nan).fill_nan(np.nan).to_numpy() \
            if feature in frame.columns else np.full(frame.height, np.nan)
        gap = np.where(np.isfinite(raw), raw - mean, model.typical[gap_name])
        local[gap_name] = local_baseline(gap, training, trailing)
        local[feature] = local["mean_rank_tokens"] + local[gap_name]
    return local


def decompose(frame: pl.DataFrame, model: StepTimeModel, warmup: np.ndarray,
              trailing: bool = False) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(steps, parts): one row per timed step (`STEP_COLUMNS`: seconds = wall time, expected_s = the
    model at the typical workload around the step, model_s = the model at the step's workload,
    residual_s = seconds − model_s − overheads − weight sync excess)
    and one row per step × cause × stage with its seconds (`PART_COLUMNS`); see the module docstring.
    With `trailing` the typical workload is that of the steps up to each step (`around`): a step's
    row then depends on no later step."""
    timed = frame["wall_s"].is_not_null().to_numpy()
    typical = model.typical
    predicted = model.predict(frame)
    actual = stage_seconds(frame)
    parts: list[tuple[str, str, np.ndarray]] = []

    def column(name: str) -> np.ndarray:
        return frame[name].cast(pl.Float64).fill_null(np.nan).fill_nan(np.nan).to_numpy()

    def filled(name: str) -> np.ndarray:
        values = column(name)
        return np.where(np.isfinite(values), values, typical.get(name, 0.0))

    local = around(frame, model, trailing)
    for stage, fit in model.stages.items():
        for name, b in fit.coefficients.items():
            if name == "r_max":
                parts.append(("long_tail", stage, b * (filled(name) - local[name])))
            elif name in VOLUME_FEATURES:
                parts.append(("token_volume", stage, b * (filled(name) - local[name])))
            elif name in GAP_OF:
                gap = local[GAP_OF[name]]
                mean = filled("mean_rank_tokens")
                busiest = np.where(np.isfinite(column(name)), column(name), mean + gap)
                parts.append(("token_volume", stage, b * (mean - local["mean_rank_tokens"])))
                parts.append(("dp_imbalance", stage, b * ((busiest - mean) - gap)))
        residual = np.nan_to_num(actual.get(stage, np.zeros(frame.height))) - predicted[f"{stage}_s"].to_numpy()
        if stage in STAGE_CAUSE:
            parts.append((STAGE_CAUSE[stage], stage, np.where(warmup, 0.0, residual)))
            parts.append(("warmup", stage, np.where(warmup, residual, 0.0)))
        else:
            parts.append(("unexplained", stage, np.where(warmup, 0.0, residual)))
            parts.append(("warmup", stage, np.where(warmup, residual, 0.0)))
    parts.append(("validation", "testing", np.nan_to_num(column("testing_s"))))
    parts.append(("checkpoint", "save_checkpoint", np.nan_to_num(column("save_checkpoint_s"))))

    seconds = column("wall_s")
    expected = model.predict(frame.select("segment", "step").with_columns(
        *[pl.Series(name, values) for name, values in local.items()]))
    expected = expected["step_s"].to_numpy()
    overheads = np.nan_to_num(column("testing_s")) + np.nan_to_num(column("save_checkpoint_s"))
    model_at_workload = predicted["step_s"].to_numpy()
    weight_sync = next((v for c, s, v in parts if c == "weight_sync"), np.zeros(frame.height))
    steps = pl.DataFrame({
        "segment": frame["segment"], "step": frame["step"], "seconds": seconds, "expected_s": expected,
        "model_s": model_at_workload, "excess_s": seconds - expected,
        "residual_s": seconds - model_at_workload - overheads - weight_sync,
    }).cast(STEP_COLUMNS).filter(pl.Series(timed))
    segment, step = frame["segment"].to_numpy()[timed], frame["step"].to_numpy()[timed]
    long = [pl.DataFrame({"segment": segment, "step": step, "cause": cause, "stage": stage, "seconds": values[timed]})
            for cause, stage, values in parts]
    table = (pl.concat(long).cast(PART_COLUMNS) if long else pl.DataFrame(schema=PART_COLUMNS))
    table = table.group_by("segment", "step", "cause", "stage").agg(pl.col("seconds").sum())
    return steps, table.filter(pl.col("seconds") != 0).sort("segment", "step", "cause", "stage")


def step_causes(parts: pl.DataFrame) -> pl.DataFrame:
    """Per step × cause: seconds = Σ over its stages, and stage = the stage holding the largest part
    in the direction of the sum; causes ordered by seconds, largest first."""
    ranked = parts.with_columns(
        signed=pl.col("seconds") * pl.col("seconds").sum().over("segment", "step", "cause").sign()
    )
    return (
        ranked.sort("signed", descending=True)
        .group_by("segment", "step", "cause", maintain_order=True)
        .agg(seconds=pl.col("seconds").sum(), stage=pl.col("stage").first())
        .sort(["segment", "step", "seconds"], descending=[False, False, True])
    )
