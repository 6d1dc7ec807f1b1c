-- The responses a packed-lengths line says its prompt group was sampled with (`n_sampling`), stored with
-- the group: a batch of step files is read straight into `sample_groups`, and the run's `n_sampling`
-- fact is then taken from the stored rows. NULL on groups stored before this column existed.
ALTER TABLE sample_groups ADD COLUMN IF NOT EXISTS n_sampling INTEGER;
