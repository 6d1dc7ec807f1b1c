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
    "perf/time_per_step": "time_per_step",
    # Tokens per data-parallel rank in the step: the busiest rank's, the mean, and the busiest after
    # verl's sequence balancing (names analyses read; no `steps` view column).
    "global_seqlen/max": "rank_tokens_max",
    "global_seqlen/mean": "rank_tokens_mean",
    "global_seqlen/balanced_max": "rank_tokens_balanced_max",
    # A console log without metric lines still yields step times from its tqdm progress bar; the rows
    # carry the step flag `tqdm_estimate`, so the estimate stays visible in the steps view.
    "tqdm/step_s": "step_s",
}
# Keys logged by validation only (`val-core/...`, `val/...`, older `test_score/...`).
VALIDATION_PREFIXES = ("val-", "val/", "test_score/")
