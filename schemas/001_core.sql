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

-- Maps framework metric keys to canonical step columns (the `steps` view).
CREATE TABLE metric_aliases (
    key        VARCHAR PRIMARY KEY,
    canonical  VARCHAR NOT NULL
);

INSERT INTO metric_aliases VALUES
    -- verl
    ('timing_s/step', 'step_s'),
    ('timing_s/gen', 'gen_s'),
    ('timing_s/reward', 'reward_s'),
    ('timing_s/old_log_prob', 'old_log_prob_s'),
    ('timing_s/ref', 'ref_s'),
    ('timing_s/values', 'values_s'),
    ('timing_s/adv', 'adv_s'),
    ('timing_s/update_actor', 'update_actor_s'),
    ('timing_s/update_critic', 'update_critic_s'),
    ('timing_s/testing', 'testing_s'),
    ('timing_s/save_checkpoint', 'save_checkpoint_s'),
    ('response_length/mean', 'response_length_mean'),
    ('response_length/max', 'response_length_max'),
    ('response_length/min', 'response_length_min'),
    ('response_length/clip_ratio', 'clip_ratio'),
    ('prompt_length/mean', 'prompt_length_mean'),
    ('prompt_length/max', 'prompt_length_max'),
    ('prompt_length/min', 'prompt_length_min'),
    ('perf/total_num_tokens', 'total_tokens'),
    ('perf/throughput', 'throughput'),
    ('perf/time_per_step', 'time_per_step'),
    -- OpenRLHF (0.9+ timing keys; rollout/* and plain keys)
    ('timing/step_total', 'step_s'),
    ('timing/generation', 'gen_s'),
    ('timing/ppo_train', 'update_actor_s'),
    ('rollout/response_length_mean', 'response_length_mean'),
    ('response_length', 'response_length_mean'),
    ('rollout/truncated_rate', 'clip_ratio'),
    ('response_clip_ratio', 'clip_ratio');

-- One row per (run, segment, step) of a step-aggregate log, with canonical columns.
CREATE VIEW steps AS
WITH m AS (
    SELECT sm.run_id, sm.segment, sm.step, sm.key, sm.value, a.canonical
    FROM step_metrics sm LEFT JOIN metric_aliases a ON a.key = sm.key
), f AS (
    SELECT run_id, segment, step, list(DISTINCT flag ORDER BY flag) AS flags
    FROM step_flags GROUP BY ALL
)
SELECT
    m.run_id, m.segment, m.step,
    max(value) FILTER (WHERE canonical = 'gen_s')                AS gen_s,
    max(value) FILTER (WHERE canonical = 'reward_s')             AS reward_s,
    max(value) FILTER (WHERE canonical = 'old_log_prob_s')       AS old_log_prob_s,
    max(value) FILTER (WHERE canonical = 'ref_s')                AS ref_s,
    max(value) FILTER (WHERE canonical = 'values_s')             AS values_s,
    max(value) FILTER (WHERE canonical = 'adv_s')                AS adv_s,
    max(value) FILTER (WHERE canonical = 'update_actor_s')       AS update_actor_s,
    max(value) FILTER (WHERE canonical = 'update_critic_s')      AS update_critic_s,
    max(value) FILTER (WHERE canonical = 'testing_s')            AS testing_s,
    max(value) FILTER (WHERE canonical = 'save_checkpoint_s')    AS save_checkpoint_s,
    max(value) FILTER (WHERE canonical = 'step_s')               AS step_s,
    max(value) FILTER (WHERE canonical = 'response_length_mean') AS response_length_mean,
    max(value) FILTER (WHERE canonical = 'response_length_max')  AS response_length_max,
    max(value) FILTER (WHERE canonical = 'response_length_min')  AS response_length_min,
    max(value) FILTER (WHERE canonical = 'prompt_length_mean')   AS prompt_length_mean,
    max(value) FILTER (WHERE canonical = 'prompt_length_max')    AS prompt_length_max,
    max(value) FILTER (WHERE canonical = 'prompt_length_min')    AS prompt_length_min,
    max(value) FILTER (WHERE canonical = 'clip_ratio')           AS clip_ratio,
    max(value) FILTER (WHERE canonical = 'total_tokens')         AS total_tokens,
    max(value) FILTER (WHERE canonical = 'throughput')           AS throughput,
    bool_and(m.key LIKE 'val-%' OR m.key LIKE 'val/%' OR m.key LIKE 'eval/%') AS is_validation_only,
    count(*) FILTER (WHERE canonical = 'testing_s') > 0          AS has_testing,
    count(*) FILTER (WHERE canonical = 'save_checkpoint_s') > 0  AS has_checkpoint,
    coalesce(list_contains(any_value(f.flags), 'truncated_line'), false) AS truncated_line,
    coalesce(any_value(f.flags), []::VARCHAR[])                  AS flags
FROM m
LEFT JOIN f ON f.run_id = m.run_id AND f.segment = m.segment AND f.step = m.step
GROUP BY m.run_id, m.segment, m.step;
