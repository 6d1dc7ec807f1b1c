-- Where a step's wall clock came from: 'tracker' (a tracker's own timestamps: MLflow, wandb,
-- TensorBoard, Trackio) or 'console' (the timestamp printed at the start of the step's record lines in
-- a console log). A run's tracker clock, where it has one, is used before its console clock. NULL for
-- rows written before this column existed: all of them tracker clocks.
ALTER TABLE step_clock ADD COLUMN IF NOT EXISTS source VARCHAR;
