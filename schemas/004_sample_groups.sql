-- Responses stored one row per prompt group.
--
-- A packed-lengths trace holds millions of response lengths, 8 or 16 per prompt. Writing one
-- 17-column row per response made the insert the slowest part of ingesting such a trace; a group
-- row with the lengths as a list writes about 7x fewer values. `samples` stays the one name every
-- reader uses: it is now a view over per-response rows (`sample_rows`, the former table) and the
-- unnested groups. Writers insert into `sample_rows` or `sample_groups`, never into `samples`.
ALTER TABLE samples RENAME TO sample_rows;

CREATE TABLE sample_groups (
    run_id         INTEGER NOT NULL,
    file_id        INTEGER NOT NULL,
    step           INTEGER NOT NULL,
    rank           INTEGER,
    dp_rank        INTEGER,
    tp_rank        INTEGER,
    prompt_idx     INTEGER,             -- prompt (group) index within the step and dp rank
    prompt_len     INTEGER,
    validate       BOOLEAN,
    response_lens  INTEGER[] NOT NULL   -- one length per response; sample_idx is the list position - 1
);

CREATE VIEW samples AS
SELECT run_id, file_id, step, rank, dp_rank, tp_rank, prompt_idx, sample_idx, prompt_len, response_len,
       truncated, validate, turns, tool_calls, finish_reason, length_estimated, score
FROM sample_rows
UNION ALL
SELECT run_id, file_id, step, rank, dp_rank, tp_rank, prompt_idx,
       (generate_subscripts(response_lens, 1) - 1)::INTEGER AS sample_idx, prompt_len,
       unnest(response_lens) AS response_len, NULL::BOOLEAN AS truncated, validate, NULL::INTEGER AS turns,
       NULL::INTEGER AS tool_calls, NULL::VARCHAR AS finish_reason, false AS length_estimated,
       NULL::DOUBLE AS score
FROM sample_groups;
