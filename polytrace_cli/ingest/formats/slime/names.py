"""slime's (and miles', its fork's) metric names, wherever they were logged: the console's `perf N: {...}`
dicts, W&B and TensorBoard. This module imports nothing, so a store can check its view cheaply.

What the timers mean (slime `slime/observability/train_metric_utils.py` `log_perf_data`,
`slime/backends/megatron_utils/actor.py`, `slime/observability/timer.py`):

- `perf/train_wait_time`: the training actor's time outside `train()` since the previous `train()`
  ended: the wait for the rollout's batch, plus whatever the loop does between two trainings (the
  weight update, a checkpoint save, an evaluation). It is not verl's generation time: with
  `train_async.py` the rollout of step N+1 runs while step N trains, and only the wait is counted.
- `perf/train_time`: the whole `train()` call (reference and old log-probs, the actor update).
- `perf/step_time` = train_wait + train (`perf/total_train_time` before October 2025), and
  `perf/wait_time_ratio` = train_wait / step_time.
- `perf/rollout_time`: the rollout side's time to produce one rollout's samples (its own `perf N`
  line), which overlaps the trainer's wait.
- `perf/update_weights_time`, `perf/log_probs_time`, `perf/ref_log_probs_time`,
  `perf/actor_train_time`, `perf/save_model_time`: the timers of those functions, logged with the
  next training's perf line (the weight update after step N-1 is in step N's line).
"""

FRAMEWORK = "slime"

METRIC_ALIASES = {
    "perf/step_time": "step_s",
    "perf/total_train_time": "step_s",
    "perf/train_wait_time": "trainer_wait_s",
    "perf/wait_time_ratio": "trainer_idle_ratio",
    "perf/rollout_time": "rollout_s",
    "perf/update_weights_time": "update_weights_s",
    "perf/log_probs_time": "old_log_prob_s",
    "perf/ref_log_probs_time": "ref_s",
    "perf/actor_train_time": "update_actor_s",
    "perf/save_model_time": "save_checkpoint_s",
    # The rollout side's statistics of the samples' (effective) response lengths.
    "rollout/response_len/mean": "response_length_mean",
    "rollout/response_len/max": "response_length_max",
    "rollout/response_len/min": "response_length_min",
    # slime 0.1: the DP ranks' mean of their mean response length, from the training side.
    "rollout/response_lengths": "response_length_mean",
    "rollout/truncated_ratio": "clip_ratio",
    "rollout/raw_reward": "reward_mean",
}
VALIDATION_PREFIXES = ("eval/",)
# The formats whose files read these names (each one's `metric_aliases`): the store keys its names by
# format, and a store is opened without loading the formats.
FORMATS = ("slime-console",)

# What each canonical stage holds in a slime run; a stage left out has no counterpart in slime.
STAGE_MEANINGS = {
    "step_s": "perf/step_time: train_wait + train of the training actor; includes the weight update, "
              "checkpoint saves and evaluations that run between two trainings",
    "trainer_wait_s": "perf/train_wait_time: the training actor outside train(): waiting for the rollout "
                      "(all of generation when colocated), plus weight update, saves, evaluation",
    "rollout_s": "perf/rollout_time: the rollout side producing one rollout's samples (overlaps the "
                 "trainer's wait; runs beside training with train_async.py)",
    "update_weights_s": "perf/update_weights_time: the weight update to the SGLang engines before this "
                        "training (inside train_wait)",
    "old_log_prob_s": "perf/log_probs_time: the actor's log-prob pass",
    "ref_s": "perf/ref_log_probs_time: the reference model's log-prob pass",
    "update_actor_s": "perf/actor_train_time: the actor's optimizer steps",
    "save_checkpoint_s": "perf/save_model_time: the checkpoint save (inside the next step's train_wait)",
}
