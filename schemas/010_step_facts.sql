-- Per file and step, what the `steps` view takes from that file's pairs, so that what is decided over
-- a whole run (its semantics record, whether its step time includes testing) reads one row per step
-- and canonical name instead of every pair, and a log that grew adds only its new lines' facts
-- (`store/step_facts.py`). Derived from `step_metrics` and `metric_aliases`: refreshed when they change.
CREATE TABLE IF NOT EXISTS step_facts (
    file_id          INTEGER NOT NULL,
    run_id           INTEGER NOT NULL,
    segment          INTEGER NOT NULL,
    step             BIGINT NOT NULL,
    canonical        VARCHAR,   -- a `metric_aliases` name; NULL on the row of the step's own facts
    value            DOUBLE,    -- the largest value of the step's pairs whose key maps to `canonical`
    pairs            BIGINT NOT NULL,  -- the pairs the row was taken from
    validation_only  BOOLEAN    -- on the step's own row: every pair's key has a validation prefix
);

-- Which pairs of a file `step_facts` holds: as many as `pairs`, up to line `last_line`, taken with the
-- aliases and validation prefixes of the catalog fingerprint `catalog`.
CREATE TABLE IF NOT EXISTS step_facts_files (
    file_id    INTEGER NOT NULL,
    run_id     INTEGER NOT NULL,
    pairs      BIGINT NOT NULL,
    last_line  BIGINT,
    catalog    VARCHAR NOT NULL
);
