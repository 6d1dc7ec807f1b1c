-- How a run executed (`semantics/execution_mode.py`): sync (colocated), one-step-off, fully-async,
-- colocate-async, separate-async or async-grpo, and the evidence it was decided from (config keys, metric
-- families present). A record decided before this column existed reads as NULL and is not current: the
-- run's record is decided on the spot when read, and stored again at its next ingest.
ALTER TABLE run_semantics ADD COLUMN IF NOT EXISTS execution_mode VARCHAR;
ALTER TABLE run_semantics ADD COLUMN IF NOT EXISTS execution_mode_evidence VARCHAR[];
