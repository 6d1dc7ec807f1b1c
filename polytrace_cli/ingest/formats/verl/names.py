"""verl's metric names, shared by every format that reads verl logs (console, the file logger's JSONL).

They hold wherever the keys were logged (also wandb and TensorBoard files of a verl run): the `steps`
view's columns are generated from these mappings (see `Ingester.metric_aliases`). This module loads
nothing, so a store can check its view cheaply.
"""

METRIC_ALIASES = {
    "timing_s/step": "step_s",
    "timing_s/gen": "gen_s",
    "timing_s/reward": "reward_s",
    "timing_s/old_log_prob": "old_log_prob_s",
    "timing_s/ref": "ref_s",
    "timing_s/values": "values_s",
    "timing_s/adv": "adv_s",
    "timing_s/update_actor": "update_actor_s",
    "timing_s/update_critic": "update_critic_s",
    # verl 0.8 times the weight sync to the rollout engine as a stage of its own (~12 s a step).
    "timing_s/update_weights": "update_weights_s",
    "timing_s/testing": "testing_s",
    "timing_s/save_checkpoint": "save_checkpoint_s",
    # The rollout engine's own generation time inside `timing_s/gen` (a name the model reads; no
    # `steps` view column).
    "timing_s/generate_sequences": "generate_sequences_s",
    # verl <= 0.1 logged its timers as `timing/<stage>`; OpenRLHF's `timing/*` keys have other names.
    "timing/gen": "gen_s",
    "timing/reward": "reward_s",
    "timing/old_log_prob": "old_log_prob_s",
    "timing/ref": "ref_s",
    "timing/values": "values_s",
    "timing/adv": "adv_s",
    "timing/update_actor": "update_actor_s",
    "timing/update_critic": "update_critic_s",
    "timing/testing": "testing_s",
    "timing/save_checkpoint": "save_checkpoint_s",
    "timing/step": "step_s",
    "response_length/mean": "response_length_mean",
    "response_length/max": "response_length_max",
    "response_length/min": "response_length_min",
    "response_length/clip_ratio": "clip_ratio",
    "prompt_length/mean": "prompt_length_mean",
    "prompt_length/max": "prompt_length_max",
    "prompt_length/min": "prompt_length_min",
    "perf/total_num_tokens": "total_tokens",
    "perf/throughput": "throughput",
    "perf/mfu/actor": "mfu_actor",
    # Keys only a run that trains a critic writes (verl/trainer/ppo/metric_utils.py: the value metrics, written
    # only with use_critic; the critic worker's losses, learning rate and MFU): comparisons tell PPO with a
    # critic from GRPO by them.
    "critic/values/mean": "critic_only",
    "critic/vf_explained_var": "critic_only",
    "critic/vf_loss": "critic_only",
    "critic/vf_clipfrac": "critic_only",
    "critic/vpred_mean": "critic_only",
    "critic/grad_norm": "critic_only",
    "critic/lr": "critic_only",
    "perf/mfu/critic": "critic_only",
    "perf/time_per_step": "time_per_step",
    # Tokens per data-parallel rank in the step: the busiest rank's, the mean, and the busiest after
    # verl's sequence balancing (names analyses read; no `steps` view column).
    "global_seqlen/max": "rank_tokens_max",
    "global_seqlen/mean": "rank_tokens_mean",
    "global_seqlen/balanced_max": "rank_tokens_balanced_max",
    # A console log without metric lines still yields step times from its tqdm progress bar; the rows
    # carry the step flag `tqdm_estimate`, so the estimate stays visible in the steps view.
    "tqdm/step_s": "step_s",
    # Asynchronous trainers (one-step-off, fully async, the V1 trainer's async modes). What `timing_s/gen`
    # means there (the trainer waiting for a trainable batch, not generating) is the run's execution mode
    # (`run_semantics.execution_mode`), not a name: the key keeps its alias above.
    # one_step_off_policy/ray_trainer.py: the weight sync to the rollout GPUs; docs/advance/one_step_off.md:
    # the wait for the previous step's generation, and the rollout's own generation time.
    "timing_s/sync_rollout_weights": "update_weights_s",
    "timing_s/wait_prev_gen": "trainer_wait_s",
    # fully_async_policy: the trainer's weight sync to the rollouter (fully_async_trainer.py), the
    # rollouter's busy seconds and idle share between two weight versions (fully_async_rollouter.py),
    # the trainer's idle share (detach_utils.py: timing_s/gen / timing_s/step), counters of stale and
    # dropped samples and the partial rollouts' share (detach_utils.py).
    "timing_s/param_sync": "update_weights_s",
    "rollouter/active_time": "rollout_s",
    "fully_async/rollouter/active_time": "rollout_s",
    "rollouter/idle_ratio": "rollout_idle_ratio",
    "fully_async/rollouter/idle_ratio": "rollout_idle_ratio",
    "trainer/idle_ratio": "trainer_idle_ratio",
    "fully_async/trainer/idle_ratio": "trainer_idle_ratio",
    "fully_async/count/stale_samples_processed": "stale_samples",
    "fully_async/count/dropped_stale_samples": "dropped_samples",
    "count/dropped_stale_samples": "dropped_samples",
    "fully_async/partial/partial_ratio": "partial_ratio",
    # With dynamic resource scheduling, the time the trainer's hybrid GPUs help the rollout while the trainer
    # waits for enough samples (fully_async_trainer.py): a part of the wait, not the whole (a name no view reads).
    "timing_s/wait_for_enough_samples": "hybrid_rollout_s",
    # V1 trainer (docs/advance/v1_async_trainer.md): staleness in model versions, dropped stale groups, and
    # the hybrid GPUs' mode switches (names the model reads; no `steps` column).
    "training/off_policy/trajectory_staleness/mean": "staleness_mean",
    "training/off_policy/trajectory_staleness/max": "staleness_max",
    "training/off_policy/dropped_samples": "dropped_samples",
    "timing_s/switch_to_rollout": "switch_to_rollout_s",
    "timing_s/switch_to_trainer": "switch_to_trainer_s",
}
# Keys logged by validation only (`val-core/...`, `val/...`, older `test_score/...`).
VALIDATION_PREFIXES = ("val-", "val/", "test_score/")
# The formats whose files read these names (each one's `metric_aliases`): the store keys its names by
# format, and a store is opened without loading the formats.
FORMATS = ("verl-console", "verl-jsonl")
# Key prefixes that tell an asynchronous recipe's execution mode (semantics/execution_mode.py), most
# specific first: one-step-off's wait and weight sync (one_step_off_policy/ray_trainer.py,
# docs/advance/one_step_off.md), the V1 trainer's switches and off-policy family
# (docs/advance/v1_async_trainer.md), the fully async policy's families (fully_async_policy/).
EXECUTION_MODE_KEYS = {
    "timing_s/wait_prev_gen": "one-step-off",
    "timing_s/sync_rollout_weights": "one-step-off",
    "timing_s/switch_": "separate-async",
    "fully_async/": "fully-async",
    "rollouter/": "fully-async",
    "trainer/idle_ratio": "fully-async",
    "timing_s/param_sync": "fully-async",
    "timing_s/wait_for_enough_samples": "fully-async",
    "training/off_policy/": "separate-async",
}

FRAMEWORK = "verl"
# What each canonical stage holds in a verl run (`verl/trainer/ppo/ray_trainer.py` `fit`: the
# `marked_timer` blocks); a stage left out has no counterpart in verl.
STAGE_MEANINGS = {
    "step_s": "timing_s/step: the trainer's whole step; whether testing and checkpoint saves are inside it "
              "depends on the version (decided per run)",
    "gen_s": "timing_s/gen: generating the batch's responses (from 0.4 summed over DAPO's generation batches)",
    "reward_s": "timing_s/reward: scoring the responses",
    "old_log_prob_s": "timing_s/old_log_prob: the actor's log-prob pass",
    "ref_s": "timing_s/ref: the reference model's log-prob pass",
    "values_s": "timing_s/values: the critic's value pass",
    "adv_s": "timing_s/adv: computing advantages",
    "update_actor_s": "timing_s/update_actor: the actor's optimizer steps",
    "update_critic_s": "timing_s/update_critic: the critic's optimizer steps",
    "update_weights_s": "timing_s/update_weights: the weight sync to the rollout engine (0.8+)",
    "testing_s": "timing_s/testing: validation",
    "save_checkpoint_s": "timing_s/save_checkpoint",
}
