"""How far a policy's saving could move: by resampling steps (the bootstrap the what-if numbers report),
and, for reference, from the coefficients' noise by a formula.

Bootstrap (`bootstrap_contexts`): BOOTSTRAP_DRAWS times, the fitted steps are drawn with replacement
and the model refitted on them; the logged testing and checkpoint seconds are drawn with replacement
among the steps that log them; the policy is priced again against that draw's own replay, and
saving_se_s is the standard deviation of the draws' savings. It covers how much the answer depends
on which steps the run happened to have (a slow step, a cheap validation), not the policy's own
assumptions nor a model whose form is wrong.

The formula (`saving_standard_error`):

A policy that only changes the workload saves, per stage, Σ_f b_f · D_f with D_f = Σ_steps
(x_f before − x_f after) (the intercepts cancel). With each stage fitted by least squares on its
training steps, Cov(b) ≈ σ² (XᵀX)⁻¹ (X = [1, features] over those steps, σ = the fit's robust
residual scale, 1.4826 · MAD), so

    Var(saving) = Σ_stages dᵀ Cov(b) d,     d = (0, D_1, ..., D_p)

and the standard error is its square root. It covers the coefficients' noise only: not the
policy's own assumptions, nor a model whose form is wrong.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl

from polytrace_cli.model import StepTimeModel, stage_seconds


def saving_standard_error(model: StepTimeModel, before: pl.DataFrame, after: pl.DataFrame) -> float:
    """The standard error (s) of Σ predict(before) − Σ predict(after) from the coefficients' noise."""
    actual = stage_seconds(model.frame)
    fitted_rows = model.training.fill_null(False).to_numpy()
    variance = 0.0
    for stage, fit in model.stages.items():
        names = list(fit.coefficients)
        if not names or stage not in actual:
            continue
        fill = [model.typical.get(name, 0.0) for name in names]
        shift = np.array([
            float((before[name].fill_null(value) - after[name].fill_null(value)).sum())
            for name, value in zip(names, fill)])
        if not np.any(shift):
            continue
        x = np.column_stack([model.frame[name].cast(pl.Float64).fill_null(np.nan).to_numpy() for name in names])
        y = actual[stage]
        rows = fitted_rows & np.isfinite(y) & np.all(np.isfinite(x), axis=1)
        design = np.column_stack([np.ones(int(rows.sum())), x[rows]])
        scales = np.maximum(np.max(np.abs(design), axis=0), 1e-12)
        gram = (design / scales).T @ (design / scales)
        covariance = fit.scale_s ** 2 * np.linalg.pinv(gram) / np.outer(scales, scales)
        d = np.concatenate([[0.0], shift])
        variance += float(d @ covariance @ d)
    return float(np.sqrt(max(variance, 0.0)))


BOOTSTRAP_DRAWS = 30
BOOTSTRAP_SEED = 0


def bootstrap_contexts(ctx, draws: int = BOOTSTRAP_DRAWS, seed: int = BOOTSTRAP_SEED) -> list:
    """`draws` copies of a policy's run context (`simulate.policies.RunContext`), each with the model
    refitted on the fitted steps resampled with replacement and the replay's logged testing and
    checkpoint seconds resampled among the steps that log them; the workload and schedule stay as
    logged. A draw whose refit fails is left out."""
    from polytrace_cli.model import fit_model

    rng = np.random.default_rng(seed)
    fitted = np.flatnonzero(ctx.model.training.fill_null(False).to_numpy())
    plan = ctx.plan
    out = []
    for _ in range(draws):
        rows = np.sort(rng.choice(fitted, size=fitted.size, replace=True))
        sample = ctx.frame[rows]
        try:
            model = fit_model(sample, pl.Series([True] * sample.height))
        except (ValueError, np.linalg.LinAlgError):
            continue
        predicted = model.predict(ctx.frame)
        stages = {stage: predicted[f"{stage}_s"].to_numpy() for stage in model.stages}
        overheads = []
        for values in (plan.testing, plan.checkpoint):
            logged = values > 0
            resampled = values.copy()
            if logged.any():
                resampled[logged] = rng.choice(values[logged], size=int(logged.sum()), replace=True)
            overheads.append(resampled)
        draw_plan = type(plan)(plan.steps, stages, overheads[0], overheads[1], plan.validation_only_s)
        out.append(dataclasses.replace(ctx, model=model, plan=draw_plan, predicted_workload=None, caveats=[]))
    return out


def bootstrap_standard_error(savings: list[float]) -> float | None:
    """The standard deviation (ddof 1) of a saving over the bootstrap draws; None with fewer than 2."""
    values = np.asarray([s for s in savings if np.isfinite(s)], dtype=float)
    return float(np.std(values, ddof=1)) if values.size >= 2 else None
