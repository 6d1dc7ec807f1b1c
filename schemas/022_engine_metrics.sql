-- Samples of inference engines' Prometheus series (vLLM, SGLang) and of GPU utilization that trackers
-- record, read from scrape files or Prometheus range-query exports. One row per sample; `metric` is the
-- canonical name (ingest/formats/prometheus/names.py) or NULL for a series polytrace gives no meaning.
-- Joined to a run's steps on the wall clock (analyze/engine.py).
CREATE TABLE IF NOT EXISTS engine_metrics (
    run_id    INTEGER NOT NULL,
    file_id   INTEGER NOT NULL,
    line_no   BIGINT,             -- the sample's line (a scrape file) or its index (an export)
    ts        DOUBLE NOT NULL,    -- seconds since the Unix epoch
    engine    VARCHAR,            -- vllm, sglang, or the series' name prefix
    instance  VARCHAR,            -- the engine replica: its scrape address, plus vLLM's `engine` index
    name      VARCHAR NOT NULL,   -- the series' name as exposed
    metric    VARCHAR,            -- canonical name, NULL when unknown
    labels    VARCHAR,            -- the other labels, as JSON text
    value     DOUBLE NOT NULL
);

-- When each logged step was written, on the wall clock, where the source says it (tracker timestamps:
-- MLflow's per-metric timestamp, wandb's `_timestamp`, TensorBoard's `wall_time`): the latest time of
-- the step's records in the file. Steps are joined to engine samples and checked for untimed gaps on it.
CREATE TABLE IF NOT EXISTS step_clock (
    run_id     INTEGER NOT NULL,
    file_id    INTEGER NOT NULL,
    segment    INTEGER NOT NULL,
    step       BIGINT NOT NULL,
    logged_at  DOUBLE NOT NULL    -- seconds since the Unix epoch
);
