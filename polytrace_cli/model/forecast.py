"""A step-time forecaster that chooses, per stage, between the workload model and the stage's recent level.

The fixed-form model (`model.fit`) fits each stage once on every training step with equal weight. A
stage's cost per token can drift over a run, or shift level for no workload reason, and a line fitted
on old steps then extrapolates the wrong way. For each stage the forecaster therefore has candidates:

    workload   the model's line (intercept + Σ b_f · x_f, the features of `STAGE_FEATURES`), every
               history step weighted alike
    recency    the same line fitted with weights w = 0.5^(age / H), age in fitted steps counted back
               from the newest, half-life H = max(RECENT_STEPS, n / 4): drifting costs follow the
               recent steps
    shifted    the line fitted on the steps after the last level shift of the stage (below), or, when
               fewer than `MIN_SEGMENT` steps follow it, the workload line with its intercept moved by
               the median residual after the shift; the workload line when no shift is found. For a
               stage without a varying feature: the median of the steps after the shift, at most the
               last RECENT_STEPS of them
    trend      the workload line times a drift m(s) = α + β · (s − s_last) in the step number s, α and β
               fitted (Huber IRLS) to the ratio seconds / line over the history, m kept within
               [TREND_FLOOR, TREND_CEILING]: a cost per token that keeps drifting
    recent     the median of the stage over the last RECENT_STEPS fitted steps (its recent level)
    median     the median of the stage over every fitted step

The lines are fitted by iteratively reweighted non-negative least squares (Huber weights at
1.345 · σ, σ = 1.4826 · MAD of the residuals, 4 rounds): coefficients ≥ 0 as in `model.fit`, cheap
enough to refit at every step. A feature that does not vary is dropped as there.

Level shift: on the workload line's residuals r_1..r_n (step order), the split k minimising
Σ_{i≤k} (r_i − mean_left)² + Σ_{i>k} (r_i − mean_right)² with at least MIN_SEGMENT steps on each side;
it is a shift when |median_right − median_left| > SHIFT_Z · σ · √(1/k + 1/(n − k)) (σ the pooled
robust scale of the residuals around their segment medians) and above MIN_SHIFT_SHARE of the stage's
median.

Choice (time-series cross-validation inside the history): with n fitted steps, origins
o_j = ⌊n · (½ + ½ · j / CV_FOLDS)⌋, j = 0..CV_FOLDS − 1; each candidate is fitted on the steps before o_j
and predicts the steps o_j..o_{j+1} − 1 (o_CV_FOLDS = n); its error is the mean |predicted − real| / real
over every predicted step. The simpler candidate stands unless a more elaborate one's error is
CHOICE_MARGIN below it (`choose_candidate`): a level (median, else recent) unless the workload line
or a variant of it beats it, the plain line unless a variant (recency, shifted, trend) beats it. A
stage with no varying feature chooses between its levels and its level after a shift: its time is
not explained by the workload, and it gets no slope. A history shorter than MIN_CV_STEPS keeps the
workload line (the median for a stage without features).

Overheads (testing, save_checkpoint) are not forecast from the workload: a step that logs one gets
the median of its logged seconds over the history (`overheads`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl
from scipy.optimize import nnls

from polytrace_cli.model.fit import (
    StageFit, _design, choose_busiest, robust_scale, stage_feature_names, stage_seconds, typical_workload,
    varying_features,
)
from polytrace_cli.model.workload import OVERHEADS

CANDIDATES = ("median", "recent", "workload", "recency", "shifted", "trend")
LEVEL_CANDIDATES = ("median", "recent")
ADAPTIVE_CANDIDATES = ("recency", "shifted", "trend")
# A more elaborate candidate is chosen only when its cross-validated error is this share below the simpler one's.
CHOICE_MARGIN = 0.02
RECENT_STEPS = 10
CV_FOLDS = 4
MIN_CV_STEPS = 12
MIN_SEGMENT = 5
SHIFT_Z = 4.0
MIN_SHIFT_SHARE = 0.02
HUBER_K = 1.345
TREND_FLOOR, TREND_CEILING = 0.5, 2.0
IRLS_ROUNDS = 4


def fit_line(stage: str, x: np.ndarray, names: tuple[str, ...], y: np.ndarray,
             weights: np.ndarray | None = None) -> StageFit:
    """y ≈ a + Σ b_j x_j with a, b_j ≥ 0 by weighted Huber IRLS on non-negative least squares (see the
    module docstring); the median of y when no feature varies or fewer than terms + 2 rows remain."""
    weights = np.ones(y.size) if weights is None else np.asarray(weights, dtype=float)
    keep = np.isfinite(y) & (np.all(np.isfinite(x), axis=1) if x.size else True)
    x, y, weights = x[keep], y[keep], weights[keep]
    if y.size == 0:
        return StageFit(stage, 0.0, {}, tuple(names), 0, 0.0)
    varying, dropped = varying_features(x, names)
    if not varying or y.size < len(varying) + 2:
        constant = float(np.median(y))
        return StageFit(stage, constant, {}, tuple(names), int(y.size), robust_scale(y - constant))
    scales = np.array([max(np.max(np.abs(x[:, j])), 1e-12) for j in varying])
    design = np.column_stack([np.ones(y.size), *(x[:, j] / s for j, s in zip(varying, scales))])
    robust = np.ones(y.size)
    theta = np.zeros(design.shape[1])
    for _ in range(IRLS_ROUNDS):
        root = np.sqrt(weights * robust)
        theta, _ = nnls(design * root[:, None], y * root)
        residuals = y - design @ theta
        sigma = max(robust_scale(residuals), 1e-9 * max(float(np.median(np.abs(y))), 1e-9))
        u = np.abs(residuals) / (HUBER_K * sigma)
        robust = np.where(u <= 1.0, 1.0, 1.0 / np.maximum(u, 1e-12))
    coefficients = {names[j]: float(theta[i + 1] / s) for i, (j, s) in enumerate(zip(varying, scales))}
    residuals = y - design @ theta
    return StageFit(stage, float(theta[0]), coefficients, tuple(dropped), int(y.size), robust_scale(residuals))


def _level(stage: str, y: np.ndarray, names: tuple[str, ...]) -> StageFit:
    finite = y[np.isfinite(y)]
    constant = float(np.median(finite)) if finite.size else float("nan")
    return StageFit(stage, constant, {}, names, int(finite.size), robust_scale(finite - constant))


def level_shift(residuals: np.ndarray, typical: float) -> int | None:
    """The index k (first row of the new level) of the last level shift in a residual series, or None
    (see the module docstring for the test)."""
    r = residuals[np.isfinite(residuals)]
    n = r.size
    if n < 2 * MIN_SEGMENT:
        return None
    cumulative, squares = np.cumsum(r), np.cumsum(r * r)
    k = np.arange(MIN_SEGMENT, n - MIN_SEGMENT + 1)
    left_sse = squares[k - 1] - cumulative[k - 1] ** 2 / k
    right_sum = cumulative[-1] - cumulative[k - 1]
    right_sse = (squares[-1] - squares[k - 1]) - right_sum ** 2 / (n - k)
    best = int(k[np.argmin(left_sse + right_sse)])
    left, right = r[:best], r[best:]
    spread = np.concatenate([left - np.median(left), right - np.median(right)])
    sigma = max(robust_scale(spread), 1e-12)
    jump = abs(float(np.median(right) - np.median(left)))
    if jump > SHIFT_Z * sigma * np.sqrt(1.0 / best + 1.0 / (n - best)) and jump > MIN_SHIFT_SHARE * abs(typical):
        return best
    return None


@dataclass(frozen=True)
class Trend:
    """A drift multiplier m(s) = alpha + beta · (s − anchor), clipped to [TREND_FLOOR, TREND_CEILING]."""

    anchor: float
    alpha: float
    beta: float

    def factor(self, steps: np.ndarray) -> np.ndarray:
        """m at each step number."""
        return np.clip(self.alpha + self.beta * (np.asarray(steps, dtype=float) - self.anchor), TREND_FLOOR,
                       TREND_CEILING)


def _trend(ratio: np.ndarray, steps: np.ndarray) -> Trend:
    """Huber IRLS line of ratio on (step − last step)."""
    keep = np.isfinite(ratio)
    ratio, steps = ratio[keep], steps[keep].astype(float)
    anchor = float(steps[-1])
    design = np.column_stack([np.ones(ratio.size), steps - anchor])
    robust = np.ones(ratio.size)
    theta = np.array([1.0, 0.0])
    for _ in range(IRLS_ROUNDS):
        root = np.sqrt(robust)
        theta, *_ = np.linalg.lstsq(design * root[:, None], ratio * root, rcond=None)
        residuals = ratio - design @ theta
        u = np.abs(residuals) / (HUBER_K * max(robust_scale(residuals), 1e-9))
        robust = np.where(u <= 1.0, 1.0, 1.0 / np.maximum(u, 1e-12))
    return Trend(anchor, float(theta[0]), float(theta[1]))


def _candidate(method: str, stage: str, x: np.ndarray, names: tuple[str, ...], y: np.ndarray,
               steps: np.ndarray) -> tuple[StageFit, Trend | None] | None:
    """One candidate fitted on a history (rows in step order, x one column per name, `steps` their step
    numbers): its line and, for `trend`, its drift."""
    finite = np.isfinite(y)
    if not finite.any():
        return None
    if method == "median":
        return _level(stage, y, names), None
    if method == "recent":
        return _level(stage, y[finite][-RECENT_STEPS:], names), None
    if method == "workload":
        return fit_line(stage, x, names, y), None
    if method == "recency" and x.size:
        n = y.size
        half_life = max(RECENT_STEPS, n / 4.0)
        age = (n - 1 - np.arange(n)).astype(float)
        return fit_line(stage, x, names, y, 0.5 ** (age / half_life)), None
    base = fit_line(stage, x, names, y)
    line = _predict(base, x, names)
    if not base.coefficients and method in ("recency", "trend"):
        return None
    if method == "trend":
        usable = finite & (line > 0)
        if usable.sum() < 2 * MIN_SEGMENT:
            return None
        return base, _trend(np.where(usable, y / np.where(line > 0, line, 1.0), np.nan), steps)
    if method == "shifted":
        residuals = y - line
        rows = np.flatnonzero(np.isfinite(residuals))
        start = level_shift(residuals[rows], float(np.median(y[finite])))
        if start is None:
            return base, None
        after = rows[start:]
        if not base.coefficients:
            return _level(stage, y[after][-RECENT_STEPS:], names), None
        if after.size >= MIN_SEGMENT and after.size >= len(base.coefficients) + 2 + MIN_SEGMENT:
            return fit_line(stage, x[after], names, y[after]), None
        offset = float(np.median(residuals[after]))
        return StageFit(stage, base.intercept + offset, base.coefficients, base.dropped, base.steps, base.scale_s), None
    raise ValueError(method)


def _predict(fit: StageFit, x: np.ndarray, names: tuple[str, ...], trend: Trend | None = None,
             steps: np.ndarray | None = None) -> np.ndarray:
    out = np.full(x.shape[0], fit.intercept, dtype=float)
    for j, name in enumerate(names):
        if name in fit.coefficients:
            out += fit.coefficients[name] * x[:, j]
    if trend is not None and steps is not None:
        out = out * trend.factor(steps)
    return out


def cross_validated_errors(stage: str, x: np.ndarray, names: tuple[str, ...], y: np.ndarray,
                           steps: np.ndarray) -> dict[str, float]:
    """Each candidate's mean |relative error| over the rolling-origin folds (see the module docstring);
    a candidate that cannot be fitted on some fold (too short a history for a trend) is left out."""
    rows = np.flatnonzero(np.isfinite(y) & (y > 0) & (np.all(np.isfinite(x), axis=1) if x.size else True))
    x, y, steps = x[rows], y[rows], steps[rows]
    n = y.size
    origins = [int(n * (0.5 + 0.5 * j / CV_FOLDS)) for j in range(CV_FOLDS)] + [n]
    errors: dict[str, list[float]] = {method: [] for method in CANDIDATES}
    failed: set[str] = set()
    for start, stop in zip(origins[:-1], origins[1:]):
        if stop <= start:
            continue
        for method in CANDIDATES:
            fitted = _candidate(method, stage, x[:start], names, y[:start], steps[:start])
            if fitted is None:
                failed.add(method)
                continue
            predicted = _predict(fitted[0], x[start:stop], names, fitted[1], steps[start:stop])
            errors[method].extend(np.abs(predicted - y[start:stop]) / y[start:stop])
    return {method: float(np.mean(values)) for method, values in errors.items() if values and method not in failed}


def choose_candidate(errors: dict[str, float]) -> str:
    """The candidate a stage uses, from its cross-validated errors: the best level (median, else recent)
    unless a workload candidate's error is below (1 − CHOICE_MARGIN) × the level's; among the workload
    candidates the plain line unless a variant's error is below (1 − CHOICE_MARGIN) × the line's. A
    stage whose line has no varying feature only chooses between the levels and the level after a
    shift (`shifted`), never a trend."""
    def better(challenger: str, incumbent: str) -> bool:
        return challenger in errors and (incumbent not in errors
                                         or errors[challenger] < (1.0 - CHOICE_MARGIN) * errors[incumbent])

    level = "recent" if better("recent", "median") else "median"
    model = "workload"
    for variant in ADAPTIVE_CANDIDATES:
        if better(variant, model):
            model = variant
    return model if better(model, level) else level


@dataclass(frozen=True)
class StageChoice:
    """A stage's forecast: the chosen candidate (`method`), its line, the cross-validated error of every
    candidate (None when the history was too short to cross-validate), and where a level shift was
    found (the step number of the new level's first step, None when none)."""

    stage: str
    method: str
    fit: StageFit
    features: tuple[str, ...]
    cv_errors: dict[str, float] | None = None
    shift_step: int | None = None
    trend: Trend | None = None

    def predict(self, df: pl.DataFrame, fill: dict[str, float]) -> np.ndarray:
        """The line at each row's workload (a missing feature takes fill), times the drift at the row's
        step for a trend."""
        out = self.fit.predict(df, fill)
        if self.trend is not None:
            out = out * self.trend.factor(df["step"].cast(pl.Float64).to_numpy())
        return out

    @property
    def is_baseline(self) -> bool:
        """Whether the stage fell back to a level (median or recent) rather than a workload line."""
        return self.method in LEVEL_CANDIDATES


@dataclass
class Forecaster:
    """Per stage the chosen forecast (`choices`), the history's typical workload, the busiest-rank
    column the training stages follow, and the median seconds of each overhead over the history."""

    choices: dict[str, StageChoice]
    typical: dict[str, float]
    busiest_feature: str
    overheads: dict[str, float]
    recent_workload: dict[str, float] = field(default_factory=dict)
    next_step: int = 0

    def predict(self, df: pl.DataFrame) -> pl.DataFrame:
        """Per row of a workload frame: segment, step, `<stage>_s` for each forecast stage (`other` the
        rest), step_s = Σ of them (overheads not included)."""
        columns = {}
        for stage, choice in self.choices.items():
            columns[f"{stage}_s"] = choice.predict(df, self.typical)
        total = np.sum(list(columns.values()), axis=0) if columns else np.zeros(df.height)
        return df.select("segment", "step").with_columns(
            *[pl.Series(name, values) for name, values in columns.items()], step_s=pl.Series(total))

    def predict_wall(self, df: pl.DataFrame) -> np.ndarray:
        """step_s of `predict` plus, on each row that logs testing (a checkpoint), the history's median
        testing (checkpoint) seconds: the step's wall time as the schedule has it; NaN on a row that logs
        an overhead the history never saw."""
        total = self.predict(df)["step_s"].to_numpy().copy()
        for overhead in OVERHEADS:
            logged = df[f"{overhead}_s"].is_not_null().to_numpy()
            typical = self.overheads.get(overhead, float("nan"))
            total = total + np.where(logged, typical, 0.0)
        return total

    def predict_next(self) -> dict[str, float]:
        """Each stage's seconds at the recent workload (the median of each feature over the last
        RECENT_STEPS fitted steps) on the step after the last fitted one, and `step` = their sum: the
        next step's forecast before its workload is known."""
        workload = {name: [value] for name, value in self.recent_workload.items()}
        one = pl.DataFrame({"step": [self.next_step], **workload})
        values = {stage: float(choice.predict(one, self.typical)[0]) for stage, choice in self.choices.items()}
        values["step"] = sum(values.values())
        return values

    def methods(self) -> dict[str, str]:
        """stage → the chosen candidate."""
        return {stage: choice.method for stage, choice in self.choices.items()}


def fit_forecaster(df: pl.DataFrame, mask: pl.Series) -> Forecaster:
    """Fit the forecaster on the steps where `mask` is true, in the frame's row order (see the module
    docstring). Overheads: the medians of testing_s and save_checkpoint_s over every row before the
    last masked one that logs them."""
    train = mask.fill_null(False).to_numpy()
    typical = typical_workload(df, mask)
    actual = stage_seconds(df)
    busiest = choose_busiest(df, train, actual)
    choices: dict[str, StageChoice] = {}
    steps = df["step"].to_numpy()
    for stage, seconds in actual.items():
        names = stage_feature_names(df, stage, busiest)
        x, y, history_steps = _design(df, names)[train], seconds[train], steps[train]
        errors = None
        usable = int(np.sum(np.isfinite(y) & (y > 0)))
        if usable >= MIN_CV_STEPS:
            errors = cross_validated_errors(stage, x, names, y, history_steps)
        method = choose_candidate(errors) if errors else "workload" if names else "median"
        fitted = _candidate(method, stage, x, names, y, history_steps) or (fit_line(stage, x, names, y), None)
        shift_step = None
        if method == "shifted":
            residuals = y - _predict(fit_line(stage, x, names, y), x, names)
            rows = np.flatnonzero(np.isfinite(residuals))
            start = level_shift(residuals[rows], float(np.nanmedian(y)) if np.isfinite(y).any() else 0.0)
            if start is not None:
                shift_step = int(history_steps[rows[start]])
        choices[stage] = StageChoice(stage, method, fitted[0], names, errors, shift_step, fitted[1])
    last = int(np.flatnonzero(train)[-1]) + 1 if train.any() else 0
    overheads = {}
    for overhead in OVERHEADS:
        logged = df[f"{overhead}_s"].cast(pl.Float64).fill_null(np.nan).to_numpy()[:last]
        logged = logged[np.isfinite(logged)]
        if logged.size:
            overheads[overhead] = float(np.median(logged))
    recent = df.filter(mask.fill_null(False)).tail(RECENT_STEPS)
    recent_workload = {name: float(recent[name].median()) for name in typical
                       if name in recent.columns and recent[name].median() is not None}
    recent_workload = {**typical, **recent_workload}
    next_step = int(steps[train][-1]) + 1 if train.any() else 0
    return Forecaster(choices, typical, busiest, overheads, recent_workload, next_step)


def forecast_next(df: pl.DataFrame, mask: pl.Series | None = None) -> dict[str, float]:
    """Fit on the frame's steps so far (`training_mask` unless `mask` is given) and forecast the next
    step's stages at the recent workload (`Forecaster.predict_next`); what a live monitor calls after
    each step."""
    from polytrace_cli.model.workload import training_mask

    return fit_forecaster(df, training_mask(df) if mask is None else mask).predict_next()
