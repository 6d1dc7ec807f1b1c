"""TRL's metric names (GRPOTrainer, RLOOTrainer, PPOTrainer, Unsloth), wherever they were logged
(console, trainer_state.json, and TensorBoard, wandb or MLflow with `train/` removed): the `steps`
view's columns are generated from these mappings (see `Ingester.metric_aliases`). This module loads
nothing, so a store can check its view cheaply.
"""

# `num_tokens` is cumulative and maps to nothing: the ingesters derive `num_tokens/per_step`, the
# step's tokens. TRL 0.14 logs `completion_length` where later versions log
# `completions/mean_length`. `kl`, `entropy` and PPO's `objective/*` are named so that analyses can
# find them; they have no `steps` column. A progress-bar step time is `tqdm/step_s` (verl's names).
METRIC_ALIASES = {
    "completions/mean_length": "response_length_mean",
    "completions/min_length": "response_length_min",
    "completions/max_length": "response_length_max",
    "completion_length": "response_length_mean",
    "completions/clipped_ratio": "clip_ratio",
    "num_tokens/per_step": "total_tokens",
    "step_time": "step_s",
    "wall_time/step_s": "step_s",
    "trl/steps_covered": "steps_covered",
    "reward": "reward_mean",
    "kl": "kl_mean",
    "objective/kl": "kl_mean",
    "entropy": "entropy_mean",
    "objective/entropy": "entropy_mean",
    "objective/rlhf_reward": "reward_mean",
    # AsyncGRPO (trl/experimental/async_grpo/async_rollout_worker.py): the rollout worker's scoring wait,
    # requests in flight and generated tokens per second (names the model reads; no `steps` column).
    "rollout/score_wait_s": "score_wait_s",
    "rollout/inflight": "rollout_inflight",
    "rollout/generated_tok_s": "rollout_tokens_per_s",
}
# The Trainer's `eval_*` keys are stored as `eval/*`.
VALIDATION_PREFIXES = ("eval/",)
# The formats whose files read these names (each one's `metric_aliases`): the store keys its names by
# format, and a store is opened without loading the formats.
FORMATS = ("trl-console", "trl-trainer-state")
# Key prefixes that tell TRL's AsyncGRPO (semantics/execution_mode.py).
EXECUTION_MODE_KEYS = {
    "rollout/score_wait_s": "async-grpo",
    "rollout/inflight": "async-grpo",
    "rollout/generated_tok_s": "async-grpo",
}

FRAMEWORK = "trl"
# What each canonical stage holds in a TRL run; TRL logs no stage timers, so every stage but the step
# has no counterpart.
STAGE_MEANINGS = {
    "step_s": "step_time: the Trainer's seconds per optimizer step (recent TRL), else the progress bar's "
              "elapsed time per step; generation, scoring and the update are all inside it",
}
