"""The per-run step-time model: each stage's seconds as a linear function of the step's workload.

    gen_s            = a_gen + b_tail · r_max + b_vol · response_tokens
    old_log_prob_s, ref_s, values_s, update_actor_s, update_critic_s
                     = a_k + b_k · busiest_rank_tokens
    reward_s         = a_r + b_r · n_responses
    adv_s            = a_adv
    update_weights_s = a_w                      (weight sync: a constant per step)
    trainer_wait_s   = a_wait                   (an asynchronous trainer's wait for a batch: a level, set
                                                 by the rollout side, never fitted as generation)
    switch_s         = a_switch                 (the V1 trainer's mode switches)
    other_s          = a_rest                   (wall_s − Σ stages − testing_s − save_checkpoint_s)
                       + b_rest · busiest_rank_tokens when no training stage (old_log_prob, ref,
                       values, update_actor, update_critic) is logged: their time is then in the rest

verl balances each batch across DP ranks before training when `trainer.balance_batch` is on and then
logs global_seqlen/balanced_max besides global_seqlen/max. The busiest rank that sets the training
stages' time is then the balanced one: when both are logged, the training stages are fitted with each
and the one with the smaller summed residual spread (1.4826 · MAD) is kept (`busiest_feature`).

A run that logs a step time but no stage timer gets one stage, `whole_step`, with
a + b_tail · r_max + b_vol · response_tokens + b_busy · busiest_rank_tokens.

Each stage is fitted on the training steps that log it (overhead, validation and warm-up steps left
out by the mask) with scipy.optimize.least_squares: soft-L1 loss (robust to a few slow steps),
every coefficient bounded to ≥ 0, the features scaled by their largest value. A term is dropped
when its feature does not vary over those steps (or is missing), and a stage with fewer steps than
terms + 2, or no varying feature, is the median of its seconds (a constant, not bounded to ≥ 0).
Testing and checkpoint seconds are overheads: the model does not predict them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl
from scipy.optimize import least_squares, nnls

from polytrace_cli.model.workload import MODELLED_STAGES, OVERHEADS

TRAINING_STAGES = ("old_log_prob", "ref", "values", "update_actor", "update_critic")
STAGE_FEATURES: dict[str, tuple[str, ...]] = {
    "gen": ("r_max", "response_tokens"),
    "reward": ("n_responses",),
    **{stage: ("busiest_rank_tokens",) for stage in TRAINING_STAGES},
    "adv": (),
    "update_weights": (),
    # An asynchronous trainer's wait for a batch is set by the rollout side, not by this step's workload:
    # a level, never a generation line. The V1 trainer's mode switches: a constant per step.
    "trainer_wait": (),
    "switch": (),
    "other": (),
}
STEP_ONLY_FEATURES = ("r_max", "response_tokens", "busiest_rank_tokens")
# The busiest-rank features and the typical-workload key of their gap to the mean rank.
GAP_OF = {"busiest_rank_tokens": "imbalance_gap", "balanced_busiest_tokens": "balanced_gap"}
MAD_SCALE = 1.4826
# A feature varies when its range exceeds this share of its largest magnitude.
MIN_RELATIVE_RANGE = 1e-3


def float_values(series: pl.Series) -> np.ndarray:
    """The series as float64 values, null as NaN (a Series' fill_null runs a polars query per call,
    which cost more than the rest of a bootstrap's predictions)."""
    return series.cast(pl.Float64).to_numpy()


def values_or(series: pl.Series, fill: float) -> np.ndarray:
    """The series as float64 values, null and NaN taking `fill`."""
    values = float_values(series)
    return np.where(np.isnan(values), fill, values)


@dataclass(frozen=True)
class StageFit:
    """One stage's fitted line: seconds = intercept + Σ coefficients[f] · f. `dropped` lists the
    features left out because they do not vary; `scale_s` = 1.4826 · MAD of the fit residuals."""

    stage: str
    intercept: float
    coefficients: dict[str, float]
    dropped: tuple[str, ...]
    steps: int
    scale_s: float

    def predict(self, df: pl.DataFrame, fill: dict[str, float]) -> np.ndarray:
        """intercept + Σ b_f · x_f per row; a missing x_f takes fill[f] (the run's typical value)."""
        out = np.full(df.height, self.intercept, dtype=float)
        for name, coefficient in self.coefficients.items():
            out += coefficient * values_or(df[name], fill.get(name, 0.0))
        return out


@dataclass
class StepTimeModel:
    """A run's fitted step-time model (see the module docstring for the form).

    `typical` holds the run's typical workload: the median of each feature over the training steps,
    except busiest_rank_tokens = median(mean_rank_tokens) + median(busiest − mean_rank_tokens) (the
    same for balanced_busiest_tokens), so that b_k · (busiest − typical busiest) splits exactly
    into a volume part and an imbalance part. `busiest_feature` names the busiest-rank column the
    training stages follow.
    """

    stages: dict[str, StageFit]
    typical: dict[str, float]
    frame: pl.DataFrame = field(repr=False)
    training: pl.Series = field(repr=False)
    busiest_feature: str = "busiest_rank_tokens"

    @property
    def stage_names(self) -> list[str]:
        """The fitted stages in pipeline order (`other` last)."""
        return list(self.stages)

    def predict(self, df: pl.DataFrame) -> pl.DataFrame:
        """Per row of a workload frame: segment, step, `<stage>_s` = the stage's line at the row's
        workload for each fitted stage, and step_s = Σ of them (overheads not included)."""
        columns = {f"{stage}_s": fit.predict(df, self.typical) for stage, fit in self.stages.items()}
        total = np.sum(list(columns.values()), axis=0) if columns else np.zeros(df.height)
        return df.select("segment", "step").with_columns(
            *[pl.Series(name, values) for name, values in columns.items()], step_s=pl.Series(total))

    def predict_typical(self) -> dict[str, float]:
        """Each stage's seconds at the typical workload (and 'step' = their sum): expected_s."""
        one = pl.DataFrame({name: [value] for name, value in self.typical.items()} or {"row": [0.0]})
        values = {stage: float(fit.predict(one, self.typical)[0]) for stage, fit in self.stages.items()}
        values["step"] = sum(values.values())
        return values

    def replay(self) -> pl.DataFrame:
        """The model's prediction of the run as it was: `predict` on the frame it was fitted from,
        with the actual wall_s next to it."""
        return self.predict(self.frame).with_columns(wall_s=self.frame["wall_s"])

    def coefficients(self) -> pl.DataFrame:
        """One row per stage × term: stage, term ('intercept' or a feature), value, steps."""
        rows = []
        for stage, fit in self.stages.items():
            rows.append((stage, "intercept", fit.intercept, fit.steps))
            rows.extend((stage, name, value, fit.steps) for name, value in fit.coefficients.items())
        return pl.DataFrame(rows, schema={"stage": pl.String, "term": pl.String, "value": pl.Float64,
                                          "steps": pl.Int64}, orient="row")


def robust_scale(residuals: np.ndarray) -> float:
    """1.4826 · MAD of the residuals (0 when there are none)."""
    if residuals.size == 0:
        return 0.0
    return float(MAD_SCALE * np.median(np.abs(residuals - np.median(residuals))))


def varying_features(x: np.ndarray, names: tuple[str, ...]) -> tuple[list[int], list[str]]:
    """The columns of x whose range exceeds MIN_RELATIVE_RANGE of their largest magnitude (by index), and
    the names of the others (dropped: a constant feature's effect is in the intercept)."""
    varying, dropped = [], []
    for j, name in enumerate(names):
        column = x[:, j]
        span = np.ptp(column) if column.size else 0.0
        if column.size and span > MIN_RELATIVE_RANGE * max(np.max(np.abs(column)), 1e-12):
            varying.append(j)
        else:
            dropped.append(name)
    return varying, dropped


def fit_stage(stage: str, x: np.ndarray, names: tuple[str, ...], y: np.ndarray) -> StageFit:
    """Fit seconds y ≈ a + Σ b_j x_j (a, b_j ≥ 0) with a soft-L1 loss (see the module docstring).
    Rows with a missing y or feature are left out; x has one column per name."""
    keep_rows = np.isfinite(y) & np.all(np.isfinite(x), axis=1) if x.size else np.isfinite(y)
    x, y = x[keep_rows], y[keep_rows]
    varying, dropped = varying_features(x, names)
    if y.size == 0:
        return StageFit(stage, 0.0, {}, tuple(names), 0, 0.0)
    if not varying or y.size < len(varying) + 2:
        constant = float(np.median(y))
        return StageFit(stage, constant, {}, tuple(names), int(y.size), robust_scale(y - constant))
    scales = np.array([np.max(np.abs(x[:, j])) for j in varying])
    design = np.column_stack([np.ones(y.size), *(x[:, j] / s for j, s in zip(varying, scales))])
    y_scale = max(float(np.median(np.abs(y))), 1e-9)
    target = y / y_scale
    start, _ = nnls(design, target)
    scale = max(robust_scale(design @ start - target), 1e-3)
    result = least_squares(lambda theta: design @ theta - target, np.maximum(start, 1e-9),
                           bounds=(0.0, np.inf), loss="soft_l1", f_scale=scale, method="trf")
    theta = result.x * y_scale
    coefficients = {names[j]: float(theta[i + 1] / s) for i, (j, s) in enumerate(zip(varying, scales))}
    residuals = y - design @ theta
    return StageFit(stage, float(theta[0]), coefficients, tuple(dropped), int(y.size), robust_scale(residuals))


def typical_workload(df: pl.DataFrame, mask: pl.Series) -> dict[str, float]:
    """Medians of the workload features over the masked steps (see `StepTimeModel`)."""
    training = df.filter(mask)

    def median(expr: pl.Expr) -> float:
        value = training.select(expr.median()).item()
        return float(value) if value is not None else float("nan")

    typical = {name: median(pl.col(name)) for name in
               ("r_max", "response_tokens", "total_tokens", "mean_rank_tokens", "n_responses")}
    for feature, gap_name in GAP_OF.items():
        gap = median(pl.col(feature) - pl.col("mean_rank_tokens"))
        typical[feature] = typical["mean_rank_tokens"] + gap
        typical[gap_name] = gap
    return {k: v for k, v in typical.items() if np.isfinite(v)}


def stage_seconds(df: pl.DataFrame) -> dict[str, np.ndarray]:
    """Actual seconds per modelled stage, and other = wall_s − Σ stages − overheads (NaN when the
    step has no wall time or no stage timer). A run without stage timers gets `whole_step` instead:
    wall_s − overheads."""
    stage_columns = [s for s in MODELLED_STAGES if df[f"{s}_s"].is_not_null().any()]
    if not stage_columns:
        if "wall_s" not in df.columns:
            return {}
        overhead = sum(df[f"{o}_s"].fill_null(0).to_numpy() for o in OVERHEADS)
        return {"whole_step": float_values(df["wall_s"]) - overhead}
    actual = {s: float_values(df[f"{s}_s"]) for s in stage_columns}
    logged = sum(np.nan_to_num(v) for v in actual.values())
    overhead = sum(df[f"{o}_s"].fill_null(0).to_numpy() for o in OVERHEADS)
    actual["other"] = float_values(df["wall_s"]) - logged - overhead
    return actual


def _design(df: pl.DataFrame, names: tuple[str, ...]) -> np.ndarray:
    if not names:
        return np.empty((df.height, 0))
    return np.column_stack([float_values(df[n]) for n in names])


def choose_busiest(df: pl.DataFrame, train: np.ndarray, actual: dict[str, np.ndarray]) -> str:
    """The busiest-rank column the training stages follow: balanced_busiest_tokens when it is
    logged on every training step and the training stages' fits on it have a smaller summed
    residual spread than on busiest_rank_tokens; busiest_rank_tokens otherwise."""
    logged = [stage for stage in TRAINING_STAGES if stage in actual]
    balanced = df["balanced_busiest_tokens"].to_numpy()[train] if "balanced_busiest_tokens" in df.columns else None
    if not logged or balanced is None or not np.all(np.isfinite(balanced.astype(float))):
        return "busiest_rank_tokens"
    spread = {}
    for feature in GAP_OF:
        x = _design(df, (feature,))[train]
        spread[feature] = sum(fit_stage(stage, x, (feature,), actual[stage][train]).scale_s for stage in logged)
    return min(GAP_OF, key=lambda feature: (spread[feature], feature != "busiest_rank_tokens"))


def stage_feature_names(df: pl.DataFrame, stage: str, busiest: str) -> tuple[str, ...]:
    """The features a stage's line uses in this frame: `STAGE_FEATURES` (STEP_ONLY_FEATURES for
    whole_step; the busiest rank for `other` when no training stage is logged), busiest_rank_tokens
    read as the `busiest` column, features the frame never logs left out."""
    names = STEP_ONLY_FEATURES if stage == "whole_step" else STAGE_FEATURES[stage]
    if stage == "other" and not any(df[f"{s}_s"].is_not_null().any() for s in TRAINING_STAGES):
        names = ("busiest_rank_tokens",)
    names = tuple(busiest if n == "busiest_rank_tokens" else n for n in names)
    return tuple(n for n in names if df[n].is_not_null().any())


def fit_model(df: pl.DataFrame, mask: pl.Series) -> StepTimeModel:
    """Fit every stage the run logs on the steps where `mask` is true (see the module docstring)."""
    typical = typical_workload(df, mask)
    train = mask.fill_null(False).to_numpy()
    actual = stage_seconds(df)
    busiest = choose_busiest(df, train, actual)
    stages: dict[str, StageFit] = {}
    for stage, seconds in actual.items():
        names = stage_feature_names(df, stage, busiest)
        stages[stage] = fit_stage(stage, _design(df, names)[train], names, seconds[train])
    return StepTimeModel(stages, typical, df, mask, busiest)
