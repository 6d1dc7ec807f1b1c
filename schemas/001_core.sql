-- Core tables of the polytrace store. Column names are the public contract;
-- later files add columns or tables, never rename these.

CREATE SEQUENCE run_id_seq START 1;
CREATE SEQUENCE file_id_seq START 1;

CREATE TABLE runs (
    run_id      INTEGER PRIMARY KEY,
    name        VARCHAR NOT NULL UNIQUE,
    framework   VARCHAR,              -- verl, openrlhf, polytrace, wandb, tensorboard, synthetic
    task        VARCHAR,              -- math, code, search, video, tool, image, ...
    model       VARCHAR,
    source_dir  VARCHAR,
    meta        JSON,                 -- dp/tp sizes, n_sampling, max_response_len, versions found
    created_at  TIMESTAMP DEFAULT current_timestamp
);

CREATE TABLE files (
    file_id         INTEGER PRIMARY KEY,
    run_id          INTEGER NOT NULL,
    path            VARCHAR NOT NULL,   -- absolute path at ingest time
    sha256          VARCHAR NOT NULL,
    bytes           BIGINT NOT NULL,
    format          VARCHAR NOT NULL,
    format_version  VARCHAR,
    parser_version  VARCHAR NOT NULL,
    lines           BIGINT NOT NULL,    -- lines (or records, for whole-document formats) read
    stored          BIGINT NOT NULL,    -- lines that produced rows
    ignored         BIGINT NOT NULL,    -- lines skipped by a named rule (see ignored_lines)
    rejected        BIGINT NOT NULL,    -- lines quarantined in ingest_errors
    rows            BIGINT NOT NULL,    -- rows written across all tables
    seconds         DOUBLE NOT NULL,
    ingested_at     TIMESTAMP DEFAULT current_timestamp,
    UNIQUE (run_id, path)
);

-- Per file and rule, how many lines were skipped on purpose (console noise, tqdm bars, ...).
CREATE TABLE ignored_lines (
    file_id  INTEGER NOT NULL,
    rule     VARCHAR NOT NULL,
    lines    BIGINT NOT NULL
);

CREATE TABLE ingest_errors (
    file_id  INTEGER NOT NULL,
    line_no  BIGINT,                    -- 1-based; NULL when the whole file is rejected
    reason   VARCHAR NOT NULL,
    raw      VARCHAR                    -- the offending text, cut to 300 characters
);

-- Every logged scalar of a step-aggregate log (console, JSONL, wandb, TensorBoard).
CREATE TABLE step_metrics (
    run_id      INTEGER NOT NULL,
    segment     INTEGER NOT NULL,       -- increments when a restart makes the step go backwards
    step        BIGINT NOT NULL,
    key         VARCHAR NOT NULL,
    value       DOUBLE,                 -- NULL for text values
    text_value  VARCHAR,
    file_id     INTEGER NOT NULL,
    line_no     BIGINT
);

-- Events attached to a step: truncated_line, restart, resumed, tqdm_estimate, ...
CREATE TABLE step_flags (
    run_id   INTEGER NOT NULL,
    segment  INTEGER NOT NULL,
    step     BIGINT NOT NULL,
    flag     VARCHAR NOT NULL,
    detail   VARCHAR,
    file_id  INTEGER NOT NULL,
    line_no  BIGINT
);

-- One row per generated response.
CREATE TABLE samples (
    run_id         INTEGER NOT NULL,
    file_id        INTEGER NOT NULL,
    step           INTEGER NOT NULL,
    rank           INTEGER,
    dp_rank        INTEGER,
    tp_rank        INTEGER,
    prompt_idx     INTEGER,             -- prompt (group) index within the step and dp rank
    sample_idx     INTEGER,             -- response index within the prompt group
    prompt_len     INTEGER,
    response_len   INTEGER,
    truncated      BOOLEAN,             -- hit the length cap (NULL when the cap is unknown)
    validate       BOOLEAN,
    turns          INTEGER,
    tool_calls     INTEGER,
    finish_reason  VARCHAR,
    length_estimated BOOLEAN DEFAULT false  -- lengths estimated from text, not counted tokens
);

CREATE TABLE turns (
    run_id             INTEGER NOT NULL,
    file_id            INTEGER NOT NULL,
    step               INTEGER NOT NULL,
    rank               INTEGER,
    prompt_idx         INTEGER,
    sample_idx         INTEGER,
    turn               INTEGER NOT NULL,
    prompt_tokens      INTEGER,
    cached_tokens      INTEGER,
    completion_tokens  INTEGER,
    engine_latency_s   DOUBLE,
    finish_reason      VARCHAR,
    tool_call_count    INTEGER
);

CREATE TABLE tool_calls (
    run_id           INTEGER NOT NULL,
    file_id          INTEGER NOT NULL,
    step             INTEGER NOT NULL,
    rank             INTEGER,
    prompt_idx       INTEGER,
    sample_idx       INTEGER,
    turn             INTEGER,
    tool_name        VARCHAR,
    latency_s        DOUBLE,
    status           VARCHAR,
    query_count      INTEGER,
    response_tokens  INTEGER
);

CREATE TABLE rank_timings (
    run_id        INTEGER NOT NULL,
    file_id       INTEGER NOT NULL,
    step          INTEGER NOT NULL,
    rank          INTEGER,
    dp_rank       INTEGER,
    tp_rank       INTEGER,
    stage         VARCHAR NOT NULL,     -- reward, gen, ...
    seconds       DOUBLE,
    batch_size    INTEGER,
    tokens        BIGINT,               -- response tokens handled by the rank in the stage
    response_max  INTEGER,
    validate      BOOLEAN
);

CREATE TABLE filter_batches (
    run_id                      INTEGER NOT NULL,
    file_id                     INTEGER NOT NULL,
    workload_step               INTEGER,
    trainer_step                INTEGER,
    gen_batch_index             INTEGER,
    prompt_count                INTEGER,
    n_sampling                  INTEGER,
    train_batch_size            INTEGER,
    num_prompt_in_batch_before  INTEGER,
    kept                        INTEGER,
    used                        INTEGER,
    kept_indices                INTEGER[],
    used_indices                INTEGER[]
);

-- Maps framework metric keys to canonical step columns (the `steps` view). Its rows are written from
-- the formats' declarations (`Ingester.metric_aliases`), never by a migration.
CREATE TABLE metric_aliases (
    key        VARCHAR PRIMARY KEY,
    canonical  VARCHAR NOT NULL
);

-- The `metric_aliases` rows and the `steps` view (one row per run, segment and step with the canonical
-- columns) are generated from the formats' declarations when a store is opened: store/catalog.py.
