-- The `steps` view with its canonical columns in one list; `test_score/*` keys mark validation.

-- verl <= 0.1 logged its timers as `timing/<stage>` (no `timing_s/`); OpenRLHF's `timing/*` keys
-- have other names (`timing/generation`, `timing/ppo_train`, ...), so the two never collide.
INSERT OR IGNORE INTO metric_aliases VALUES
    ('timing/gen', 'gen_s'),
    ('timing/reward', 'reward_s'),
    ('timing/old_log_prob', 'old_log_prob_s'),
    ('timing/ref', 'ref_s'),
    ('timing/values', 'values_s'),
    ('timing/adv', 'adv_s'),
    ('timing/update_actor', 'update_actor_s'),
    ('timing/update_critic', 'update_critic_s'),
    ('timing/testing', 'testing_s'),
    ('timing/save_checkpoint', 'save_checkpoint_s'),
    ('timing/step', 'step_s');

-- verl 0.8 times the weight sync to the rollout engine as a stage of its own (~12 s a step).
INSERT OR IGNORE INTO metric_aliases VALUES ('timing_s/update_weights', 'update_weights_s');

-- One row per (run, segment, step) of a step-aggregate log. The canonical columns are the one
-- list in the PIVOT below (a view cannot read its columns from a table): adding a column is one
-- `metric_aliases` row for each key feeding it plus its name in that list. Analyses read the stage
-- columns from this view (the names ending in `_s`), not from a list of their own.
DROP VIEW steps;
CREATE VIEW steps AS
WITH m AS (
    SELECT sm.run_id, sm.segment, sm.step, sm.key, sm.value, a.canonical
    FROM step_metrics sm LEFT JOIN metric_aliases a ON a.key = sm.key
), per_step AS (
    SELECT run_id, segment, step,
           bool_and(key LIKE 'val-%' OR key LIKE 'val/%' OR key LIKE 'eval/%' OR key LIKE 'test_score/%')
               AS is_validation_only,
           count(*) FILTER (WHERE canonical = 'testing_s') > 0         AS has_testing,
           count(*) FILTER (WHERE canonical = 'save_checkpoint_s') > 0 AS has_checkpoint
    FROM m GROUP BY run_id, segment, step
), canonical AS (
    PIVOT (SELECT run_id, segment, step, canonical, value FROM m WHERE canonical IS NOT NULL)
    ON canonical IN (
        'gen_s', 'reward_s', 'old_log_prob_s', 'ref_s', 'values_s', 'adv_s', 'update_actor_s',
        'update_critic_s', 'update_weights_s', 'testing_s', 'save_checkpoint_s', 'step_s',
        'response_length_mean', 'response_length_max', 'response_length_min',
        'prompt_length_mean', 'prompt_length_max', 'prompt_length_min',
        'clip_ratio', 'total_tokens', 'throughput'
    )
    USING max(value)
    GROUP BY run_id, segment, step
), f AS (
    SELECT run_id, segment, step, list(DISTINCT flag ORDER BY flag) AS flags
    FROM step_flags GROUP BY ALL
)
SELECT p.run_id, p.segment, p.step, c.* EXCLUDE (run_id, segment, step),
       p.is_validation_only, p.has_testing, p.has_checkpoint,
       coalesce(list_contains(f.flags, 'truncated_line'), false) AS truncated_line,
       coalesce(f.flags, []::VARCHAR[])                         AS flags
FROM per_step p
LEFT JOIN canonical c ON c.run_id = p.run_id AND c.segment = p.segment AND c.step = p.step
LEFT JOIN f ON f.run_id = p.run_id AND f.segment = p.segment AND f.step = p.step;
