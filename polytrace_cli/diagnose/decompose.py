"""Per-step decomposition of the time a step took beyond what the run's model expects of it.

With W̄ the typical workload (`StepTimeModel.typical`), f_k the fitted line of stage k and T the
step's wall time:

    expected_s = Σ_k f_k(W̄)                      (no testing or checkpoint)
    excess_s   = T − expected_s, split into causes that add up to it exactly:
        long_tail    = b_tail · (r_max − r̄_max)                                      stage gen
        token_volume = b_vol · (response_tokens − median) + b_r · (n_responses − median)
                       + Σ_k b_k · (mean_rank_tokens − median)
        dp_imbalance = Σ_k b_k · ((busiest − mean_rank_tokens) − median of that gap)
                       (busiest: the column the model's training stages follow, `busiest_feature`)
        validation   = testing_s                                                    stage testing
        checkpoint   = save_checkpoint_s                                            stage save_checkpoint
        weight_sync  = update_weights_s − a_w                                       stage update_weights
        warmup       = Σ_k (actual_k − f_k(W)) on warm-up steps
        unexplained  = Σ_k (actual_k − f_k(W)) on the other steps (the `other` stage is
                       T − Σ logged stages − overheads; a stage missing at a step counts 0 s)

A cause's stage is the stage holding the largest part of it.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from polytrace_cli.model import StepTimeModel, stage_seconds
from polytrace_cli.model.fit import GAP_OF

CAUSES = ("long_tail", "token_volume", "dp_imbalance", "unexplained", "validation", "checkpoint", "weight_sync",
          "warmup")
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


def decompose(frame: pl.DataFrame, model: StepTimeModel, warmup: np.ndarray) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(steps, parts): one row per timed step (`STEP_COLUMNS`: seconds = wall time, model_s = the
    model at the step's workload, residual_s = seconds − model_s − overheads − weight sync excess)
    and one row per step × cause × stage with its seconds (`PART_COLUMNS`); see the module docstring."""
    timed = frame["wall_s"].is_not_null().to_numpy()
    typical = model.typical
    expected_by_stage = model.predict_typical()
    predicted = model.predict(frame)
    actual = stage_seconds(frame)
    parts: list[tuple[str, str, np.ndarray]] = []

    def column(name: str) -> np.ndarray:
        return frame[name].cast(pl.Float64).fill_null(np.nan).fill_nan(np.nan).to_numpy()

    def filled(name: str) -> np.ndarray:
        values = column(name)
        return np.where(np.isfinite(values), values, typical.get(name, 0.0))

    for stage, fit in model.stages.items():
        for name, b in fit.coefficients.items():
            if name == "r_max":
                parts.append(("long_tail", stage, b * (filled(name) - typical[name])))
            elif name in VOLUME_FEATURES:
                parts.append(("token_volume", stage, b * (filled(name) - typical[name])))
            elif name in GAP_OF:
                gap = typical[GAP_OF[name]]
                mean = filled("mean_rank_tokens")
                busiest = np.where(np.isfinite(column(name)), column(name), mean + gap)
                parts.append(("token_volume", stage, b * (mean - typical["mean_rank_tokens"])))
                parts.append(("dp_imbalance", stage, b * ((busiest - mean) - gap)))
        residual = np.nan_to_num(actual.get(stage, np.zeros(frame.height))) - predicted[f"{stage}_s"].to_numpy()
        if stage == "update_weights":
            parts.append(("weight_sync", stage, np.where(warmup, 0.0, residual)))
            parts.append(("warmup", stage, np.where(warmup, residual, 0.0)))
        else:
            parts.append(("unexplained", stage, np.where(warmup, 0.0, residual)))
            parts.append(("warmup", stage, np.where(warmup, residual, 0.0)))
    parts.append(("validation", "testing", np.nan_to_num(column("testing_s"))))
    parts.append(("checkpoint", "save_checkpoint", np.nan_to_num(column("save_checkpoint_s"))))

    seconds = column("wall_s")
    expected = np.full(frame.height, expected_by_stage["step"])
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
