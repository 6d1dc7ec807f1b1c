"""How far a policy's saving could move with the noise in the fitted coefficients.

A policy that only changes the workload saves, per stage, Σ_f b_f · D_f with D_f = Σ_steps
(x_f before − x_f after) (the intercepts cancel). With each stage fitted by least squares on its
training steps, Cov(b) ≈ σ² (XᵀX)⁻¹ (X = [1, features] over those steps, σ = the fit's robust
residual scale, 1.4826 · MAD), so

    Var(saving) = Σ_stages dᵀ Cov(b) d,     d = (0, D_1, ..., D_p)

and the standard error is its square root. It covers the coefficients' noise only: not the
policy's own assumptions, nor a model whose form is wrong.
"""

from __future__ import annotations

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
