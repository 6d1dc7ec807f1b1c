"""OpenRLHF's metric names (0.9+ `timing/*` keys, `rollout/*` and plain keys), wherever they were logged
(console, wandb, TensorBoard): the `steps` view's columns are generated from these mappings (see
`Ingester.metric_aliases`). This module loads nothing, so a store can check its view cheaply.
"""

# `timing/make_experience` contains generation (already `gen_s` through `timing/generation`) plus
# the reward, reference and value passes, so it names no stage column: adding it to one would count
# generation twice. `timing/broadcast` is the weight sync to the rollout engines.
METRIC_ALIASES = {
    # Only a run that trains a critic logs its loss: comparisons tell PPO with a critic from GRPO by it.
    "critic_loss": "critic_only",
    "timing/step_total": "step_s",
    "timing/generation": "gen_s",
    "timing/ppo_train": "update_actor_s",
    "rollout/response_length_mean": "response_length_mean",
    "response_length": "response_length_mean",
    "rollout/truncated_rate": "clip_ratio",
    "response_clip_ratio": "clip_ratio",
    "timing/make_experience": "make_experience_s",
    "timing/broadcast": "weight_sync_s",
    "rollout/reward_mean": "reward_mean",
    "reward": "reward_mean",
    "total_length": "total_length_mean",
    "eval/duration_s": "eval_s",
}
VALIDATION_PREFIXES = ("eval/",)
# The formats whose files read these names (each one's `metric_aliases`): the store keys its names by
# format, and a store is opened without loading the formats.
FORMATS = ("openrlhf-console",)

FRAMEWORK = "openrlhf"
# What each canonical stage holds in an OpenRLHF run (0.9+ `timing/*`); a stage left out has no counterpart.
STAGE_MEANINGS = {
    "step_s": "timing/step_total: the whole step",
    "gen_s": "timing/generation: generating the responses (inside timing/make_experience)",
    "update_actor_s": "timing/ppo_train: the whole training stage, the critic's update included",
}
