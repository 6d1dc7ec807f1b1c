-- What each run's numbers mean, decided once at ingest (and again when files are added to the run):
-- every view of step time, DP imbalance and responses per step reads it (`analyze/semantics.py`).
CREATE TABLE IF NOT EXISTS run_semantics (
    run_id                     INTEGER PRIMARY KEY,
    step_time_basis            VARCHAR,   -- logged / logged without overheads / derived from stage timers; NULL: no timer
    includes_testing           BOOLEAN,   -- the logged step time counts testing (NULL: cannot tell)
    includes_checkpoint        BOOLEAN,   -- the logged step time counts the checkpoint save (NULL: cannot tell)
    balance_batch              VARCHAR NOT NULL,  -- on / off / unknown
    balance_batch_source       VARCHAR,
    lambda_basis               VARCHAR,   -- which busiest rank sets the time; NULL: no per-rank data
    responses_per_step         DOUBLE,
    responses_per_step_source  VARCHAR,
    training_samples           BIGINT NOT NULL,
    validation_samples         BIGINT NOT NULL,
    truncated_steps            BIGINT[] NOT NULL,  -- steps with a log line cut short
    crash                      VARCHAR,   -- the error the log ends with, after its last step
    partial_steps              BIGINT[] NOT NULL,  -- steps holding fewer responses than responses_per_step
    collapse_step              BIGINT,    -- first step of a length collapse lasting to the end of the run
    collapse_length            DOUBLE,    -- mean response length from collapse_step on
    collapse_typical_length    DOUBLE,    -- median of the mean response length before it
    decided_at                 TIMESTAMP DEFAULT current_timestamp
);
