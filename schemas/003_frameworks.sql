-- OpenRLHF, wandb and TensorBoard: canonical names for stage keys that have no column in the
-- `steps` view. They are named so that analyses can find them, but map to no view column:
-- `timing/make_experience` contains generation (already `gen_s` through `timing/generation`)
-- plus reward, reference and value forward passes, so adding it to a stage would count
-- generation twice; `timing/broadcast` is the weight sync to the rollout engines.
INSERT OR IGNORE INTO metric_aliases VALUES
    ('timing/make_experience', 'make_experience_s'),
    ('timing/broadcast', 'weight_sync_s'),
    ('rollout/reward_mean', 'reward_mean'),
    ('reward', 'reward_mean'),
    ('total_length', 'total_length_mean'),
    ('eval/duration_s', 'eval_s');
