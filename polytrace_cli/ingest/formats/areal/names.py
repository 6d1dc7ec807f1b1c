"""AReaL's metric names, wherever they were logged: its console stats tables, W&B, SwanLab, Trackio and
TensorBoard (`areal/utils/stats_logger.py` `StatsLogger.commit` sends one dict per step to each). This
module imports nothing, so a store can check its view cheaply.

`areal/utils/stats_tracker.py` keeps timings under `timeperf/<name>` and a statistic with a denominator
as `<scope>/<name>/{avg,min,max}`. `areal/trainer/rl_trainer.py` times `rollout` (`prepare_batch`: the
trainer waiting for the rollout workers to hand over a batch; generation runs beside training unless the
off-policyness allowed is 0), `recompute_logp`, `ref_logp`, `critic_values`, `compute_advantage`,
`train_step`, `critic_train_step`, `update_weights`, `save` and `eval`, and logs no step total.
`areal/trainer/ppo/actor.py` (scope `ppo_actor`) logs `seq_len` (prompt and response), `prompt_len`,
`task_reward` and `no_eos_ratios` (responses cut at the length limit) per sequence.
"""

FRAMEWORK = "areal"

METRIC_ALIASES = {
    "timeperf/rollout": "trainer_wait_s",
    "timeperf/recompute_logp": "old_log_prob_s",
    "timeperf/ref_logp": "ref_s",
    "timeperf/critic_values": "values_s",
    "timeperf/compute_advantage": "adv_s",
    "timeperf/train_step": "update_actor_s",
    "timeperf/critic_train_step": "update_critic_s",
    "timeperf/update_weights": "update_weights_s",
    "timeperf/save": "save_checkpoint_s",
    "timeperf/eval": "testing_s",
    "ppo_actor/prompt_len/avg": "prompt_length_mean",
    "ppo_actor/prompt_len/max": "prompt_length_max",
    "ppo_actor/prompt_len/min": "prompt_length_min",
    "ppo_actor/seq_len/avg": "total_length_mean",
    "ppo_actor/no_eos_ratios/avg": "clip_ratio",
    "ppo_actor/task_reward/avg": "reward_mean",
    # The policy versions between a sample's generation and the update that trains on it
    # (`_log_version_staleness_stats`, called by `grpo_loss_fn` under `ppo_actor/update`), averaged
    # over the minibatches. Their `_max` is the minibatches' mean of their maxima, not the step's
    # maximum, so it names no column.
    "ppo_actor/update/version_stats/sample_staleness_theta_avg": "staleness_mean",
}
VALIDATION_PREFIXES = ("eval-rollout/",)
# The formats whose files read these names (each one's `metric_aliases`): the store keys its names by
# format, and a store is opened without loading the formats.
FORMATS = ("areal-console", "areal-traces", "areal-sessions")

STAGE_MEANINGS = {
    "trainer_wait_s": "timeperf/rollout: the trainer waiting for the rollout workers' batch (all of "
                      "generation when no off-policyness is allowed)",
    "old_log_prob_s": "timeperf/recompute_logp: the actor's log-prob pass",
    "ref_s": "timeperf/ref_logp: the reference model's log-prob pass",
    "values_s": "timeperf/critic_values: the critic's value pass",
    "adv_s": "timeperf/compute_advantage",
    "update_actor_s": "timeperf/train_step: the actor's PPO update",
    "update_critic_s": "timeperf/critic_train_step",
    "update_weights_s": "timeperf/update_weights: the weight update to the inference servers",
    "save_checkpoint_s": "timeperf/save",
    "testing_s": "timeperf/eval",
}

# A perf-tracer session phase (`areal/utils/perf_tracer.py`, `SessionRecord.default_phase_configs`) and its
# stage, for the trace reader (`traces.py`).
PHASE_STAGES = {"generate": "gen", "reward": "reward", "toolcall": "tool"}
