"""The per-run step-time model shared by `explain` and the what-if questions.

    from polytrace_cli.model import read_workload, training_mask, fit_model
    frame = read_workload(con, "my_run")          # one row per step: features, stage seconds, flags
    model = fit_model(frame, training_mask(frame))
    model.predict(frame)                          # per-stage expected seconds at each step's workload
    model.replay()                                # the model's prediction of the run as it was
    forecaster = fit_forecaster(frame, training_mask(frame))   # per stage: workload line, drift, shift or level
    forecast_next(frame)                          # the next step's stages, fitted on the steps so far
"""

from polytrace_cli.model.fit import STAGE_FEATURES, StageFit, StepTimeModel, fit_model, fit_stage, stage_seconds
from polytrace_cli.model.forecast import Forecaster, StageChoice, fit_forecaster, forecast_next
from polytrace_cli.model.workload import (
    FEATURES, MODELLED_STAGES, OVERHEADS, WORKLOAD_COLUMNS, logs_step_metrics, overheads_included, read_workload,
    run_info, training_mask,
)

__all__ = [
    "FEATURES", "MODELLED_STAGES", "OVERHEADS", "STAGE_FEATURES", "WORKLOAD_COLUMNS", "Forecaster", "StageChoice",
    "StageFit", "StepTimeModel", "fit_forecaster", "fit_model", "fit_stage", "forecast_next", "logs_step_metrics",
    "overheads_included", "read_workload", "run_info", "stage_seconds", "training_mask",
]
