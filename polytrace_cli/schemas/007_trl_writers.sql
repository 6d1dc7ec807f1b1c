-- TRL (GRPOTrainer, RLOOTrainer, PPOTrainer, Unsloth): canonical names for the keys its trainers
-- log, in every source (console dicts, trainer_state.json, TensorBoard and wandb with `train/`
-- removed, MLflow). `num_tokens` is cumulative and maps to nothing: the ingesters derive
-- `num_tokens/per_step` from it, which is the step's tokens. TRL 0.14 logs `completion_length`
-- where later versions log `completions/mean_length`. A progress-bar step time is `tqdm/step_s`
-- (already `step_s`). `kl`, `entropy` and PPO's `objective/*` are named so analyses can find them;
-- they have no column in the `steps` view.
INSERT OR IGNORE INTO metric_aliases VALUES
    ('completions/mean_length', 'response_length_mean'),
    ('completions/min_length', 'response_length_min'),
    ('completions/max_length', 'response_length_max'),
    ('completion_length', 'response_length_mean'),
    ('completions/clipped_ratio', 'clip_ratio'),
    ('num_tokens/per_step', 'total_tokens'),
    ('step_time', 'step_s'),
    ('kl', 'kl_mean'),
    ('objective/kl', 'kl_mean'),
    ('entropy', 'entropy_mean'),
    ('objective/entropy', 'entropy_mean'),
    ('objective/rlhf_reward', 'reward_mean');
