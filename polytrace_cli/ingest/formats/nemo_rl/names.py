"""NeMo-RL's metric names, wherever they were logged: its console summary per step, TensorBoard, W&B,
MLflow and SwanLab (`nemo_rl/utils/logger.py`: every backend gets `log_metrics(metrics, step, prefix)`,
so a key is `<prefix>/<name>`). This module imports nothing, so a store can check its view cheaply.

GRPO (`nemo_rl/algorithms/grpo.py`) logs its timers under `timing/train/` (seconds summed over the
step), its training metrics under `train/` (read with that prefix removed, as every `train/` key),
validation under `validation/` and `timing/validation/`. The synchronous loop times `generation`,
`reward_calculation`, `policy_and_reference_logprobs` (the policy's and the reference model's log-prob
passes together), `advantage_calculation`, `policy_training`, `checkpointing` and the weight refit
`prepare_for_generation/transfer_and_update_weights` inside `total_step_time`; the asynchronous one
(`async_grpo.enabled`) times `exposed_generation` (the trainer waiting for the replay buffer to hold a
trainable batch: generation runs beside training) and `weight_sync` instead.
"""

FRAMEWORK = "nemo_rl"

METRIC_ALIASES = {
    "timing/train/total_step_time": "step_s",
    "timing/train/generation": "gen_s",
    "timing/train/exposed_generation": "trainer_wait_s",
    "timing/train/reward_calculation": "reward_s",
    "timing/train/policy_and_reference_logprobs": "old_log_prob_s",
    "timing/train/advantage_calculation": "adv_s",
    "timing/train/policy_training": "update_actor_s",
    "timing/train/prepare_for_generation/transfer_and_update_weights": "update_weights_s",
    "timing/train/weight_sync": "update_weights_s",
    "timing/train/checkpointing": "save_checkpoint_s",
    "mean_gen_tokens_per_sample": "response_length_mean",
    "mean_prompt_length": "prompt_length_mean",
}
VALIDATION_PREFIXES = ("validation/", "timing/validation/")
# The formats whose files read these names (each one's `metric_aliases`): the store keys its names by
# format, and a store is opened without loading the formats.
FORMATS = ("nemo-rl-console", "nemo-rl-trace")

# What each canonical stage holds in a NeMo-RL GRPO run; a stage left out has no counterpart.
STAGE_MEANINGS = {
    "step_s": "timing/train/total_step_time: the whole step, validation inside it when it runs",
    "gen_s": "timing/train/generation: generating the step's responses (synchronous GRPO)",
    "trainer_wait_s": "timing/train/exposed_generation: the trainer waiting for the replay buffer "
                      "(asynchronous GRPO; the rest of generation runs beside training)",
    "reward_s": "timing/train/reward_calculation: the environments scoring the responses",
    "old_log_prob_s": "timing/train/policy_and_reference_logprobs: the policy's and the reference "
                      "model's log-prob passes together (no separate reference time)",
    "adv_s": "timing/train/advantage_calculation",
    "update_actor_s": "timing/train/policy_training: the policy's optimizer steps",
    "update_weights_s": "timing/train/prepare_for_generation/transfer_and_update_weights (synchronous) "
                        "or timing/train/weight_sync (asynchronous): the weight refit to vLLM",
    "save_checkpoint_s": "timing/train/checkpointing",
}
