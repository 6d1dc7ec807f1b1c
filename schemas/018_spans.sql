-- Intervals of work on a rank and role: profiler ranges, tracer spans, rollout sessions. One row per
-- interval read from a trace file; kernels are never stored one per row: a range's GPU kernel time is
-- summed into its `busy_us`. Spans laid end to end from a run's stage timers (for runs without any
-- read span) are derived when asked for (`analyze/timeline.py`) and carry `synthesized = true`
-- wherever they are shown; a reader sets `synthesized` only where it places an interval itself.
CREATE TABLE IF NOT EXISTS spans (
    run_id        INTEGER NOT NULL,
    file_id       INTEGER NOT NULL,
    step          INTEGER,            -- the trainer step, NULL when the source does not say
    rank          INTEGER,            -- global rank; for a rollout replica, the replica's rank
    dp_rank       INTEGER,
    tp_rank       INTEGER,
    pp_rank       INTEGER,
    cp_rank       INTEGER,
    role          VARCHAR NOT NULL,   -- actor, rollout, ref, critic, reward, trainer, driver
    replica       INTEGER,            -- rollout replica index where known
    lane          VARCHAR,            -- the thread, stream or sample inside the rank
    name          VARCHAR NOT NULL,   -- the name the source gives
    stage         VARCHAR,            -- canonical stage (gen, old_log_prob, ref, values, reward, update_actor, ...)
    t0_us         DOUBLE NOT NULL,    -- start, µs on the clock named by `clock`
    t1_us         DOUBLE NOT NULL,    -- end, ≥ t0_us
    clock         VARCHAR NOT NULL,   -- 'wall': µs since the Unix epoch (ranks line up); 'file': the file's own clock
    wall_t0_us    DOUBLE,             -- start as µs since the Unix epoch, where the source gives wall clock
    busy_us       DOUBLE,             -- GPU kernel time inside the span (sum of kernel overlaps), NULL when unknown
    status        VARCHAR,            -- a rollout session's outcome (accepted, rejected, failed, dropped)
    detail        VARCHAR,            -- a reason or other short text the source attaches
    source_event  BIGINT,             -- the event's index in the file (0-based) or its line number
    synthesized   BOOLEAN NOT NULL DEFAULT false
);
