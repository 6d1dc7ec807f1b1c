"""What the names in trace files mean: a range's canonical stage and a process's role.

A range's stage comes from its name (`STAGE_PATTERNS`, regular expressions matched in order on the
lowered name, then on its last dotted part); a process's or thread's role from the words in its name
(`ROLE_WORDS`).

Sources: verl's worker annotations (`DistProfiler.annotate(role=...)` in `verl/workers/fsdp_workers.py`:
`actor_update`, `rollout_generate`, `actor_compute_log_prob`, `ref_compute_log_prob`,
`compute_values`, `critic_update`, `compute_rm_score`) and its trainer's timers
(`marked_timer("gen" | "old_log_prob" | ...)` in `verl/trainer/ppo/ray_trainer.py`); NeMo-RL's
tracer spans (`nemo_rl/utils/trace.py`: `step`, `generation`, `training`); AReaL's perf tracer
(`areal/utils/perf_tracer.py`: `train.rollout`, `<engine>.train_batch`, ...).
"""

STAGE_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"(step|train_step|grpo_step|ppo_step|global_step|training_step)(\s*#?\d+)?", "step"),
    (r"(rollout_generate|generate_sequences|generation|generate|agenerate|gen|rollout|rollout_generation|"
     r"sample_rollout|agent_loop_rollout(_replica_\d+)?|async_generation)", "gen"),
    (r"(actor_compute_log_prob|compute_log_prob|old_log_prob|compute_logp|logprob_inference|get_logprobs|"
     r"prev_logprob|policy_logprobs)", "old_log_prob"),
    (r"(ref_compute_log_prob|compute_ref_log_prob|ref|ref_logprob|reference_logprobs|ref_logprobs)", "ref"),
    (r"(compute_values|values|critic_values)", "values"),
    (r"(compute_advantage|compute_advantages|adv|advantage)", "adv"),
    (r"(actor_update|update_actor|policy_training|training|train|train_batch|mini_batch_?\d+|ppo_update|"
     r"update_policy|policy_update|train_step_actor)", "update_actor"),
    (r"(critic_update|update_critic|critic_training)", "update_critic"),
    (r"(compute_rm_score|reward|rewards|compute_reward|compute_rewards|reward_fn|calculate_reward|env_step)", "reward"),
    (r"(update_weights|weight_sync|refit|param_sync|sync_weights|prepare_for_generation|update_weight)", "update_weights"),
    (r"(testing|validate|validation|eval|evaluation)", "testing"),
    (r"(save_checkpoint|checkpoint|save)", "save_checkpoint"),
)

ROLE_WORDS: tuple[tuple[str, str], ...] = (
    (r"rollout|vllm|sglang|generation|inference|replica|agent_loop", "rollout"),
    (r"\bref\b|reference", "ref"),
    (r"critic", "critic"),
    (r"reward|\brm\b", "reward"),
    (r"actor|policy|trainer|train|fsdp|megatron|workerdict", "actor"),
    (r"driver|controller|taskrunner|main_task|grpo_driver", "driver"),
)
