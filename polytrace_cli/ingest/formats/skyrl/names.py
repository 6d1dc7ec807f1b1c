"""SkyRL's metric names (skyrl-train), wherever they were logged: its console tracker, W&B, MLflow,
SwanLab, TensorBoard (`skyrl/train/utils/tracking.py`). This module imports nothing.

`skyrl/train/trainer.py` times each step with `Timer(name, self.all_timings)` blocks and logs them as
`timing/<name>` beside the step's metrics: `timing/step` holds `generate`, the forward passes
`fwd_logprobs_values_reward` (policy, reference and critic log-probs/values and a reward model, in
one), `compute_advantages_and_returns`, `train_critic_and_policy` (with `policy_train` and
`critic_train` inside), `sync_weights`, checkpoint saves and evaluations.
`skyrl/train/generators/utils.py` logs the responses' lengths as `generate/*_num_tokens`.
"""

FRAMEWORK = "skyrl"

METRIC_ALIASES = {
    "timing/step": "step_s",
    "timing/generate": "gen_s",
    "timing/fwd_logprobs_values_reward": "old_log_prob_s",
    "timing/compute_advantages_and_returns": "adv_s",
    "timing/policy_train": "update_actor_s",
    "timing/critic_train": "update_critic_s",
    "timing/sync_weights": "update_weights_s",
    "timing/eval": "testing_s",
    "timing/save_checkpoints": "save_checkpoint_s",
    "generate/avg_num_tokens": "response_length_mean",
    "generate/max_num_tokens": "response_length_max",
    "generate/min_num_tokens": "response_length_min",
    "reward/avg_raw_reward": "reward_mean",
}
VALIDATION_PREFIXES = ("eval/",)
# The formats whose files read these names (each one's `metric_aliases`): the store keys its names by
# format, and a store is opened without loading the formats.
FORMATS = ("skyrl-console",)

STAGE_MEANINGS = {
    "step_s": "timing/step: the whole step",
    "gen_s": "timing/generate: the generator producing the batch's trajectories",
    "old_log_prob_s": "timing/fwd_logprobs_values_reward: the policy's, reference's and critic's forward "
                      "passes (and a reward model's) together",
    "adv_s": "timing/compute_advantages_and_returns",
    "update_actor_s": "timing/policy_train: the policy's optimizer steps",
    "update_critic_s": "timing/critic_train: the critic's optimizer steps",
    "update_weights_s": "timing/sync_weights: the weight sync to the inference engines",
    "testing_s": "timing/eval: evaluation inside the step",
    "save_checkpoint_s": "timing/save_checkpoints",
}
