"""ROLL's metric names (alibaba/ROLL's RLVR pipeline), wherever they were logged: its console's JSON
dicts, W&B, TensorBoard, SwanLab. This module imports nothing, so a store can check its view cheaply.

`roll/pipeline/rlvr/rlvr_pipeline.py` times each step with `Timer` blocks logged as `time/<name>`:
`step_generate` (rollout, rewards included), `ref_log_probs_values`, `old_log_probs`, `step_train`,
`step_model_update` (the weight sync), `val_step`; `roll/utils/metrics/metrics_manager.py`
`add_token_metrics` logs `token/response_length/{mean,max,min}` and `token/prompt_length/*`.

`time/step_total` is not its step's time: the pipeline logs, at the start of step N, the total of
step N-1 (`pre_step_total_time`, 0 at the first step). It therefore maps to no column; ROLL's console
reader stores each value also one step back as `time/step_total/own` (the step it measured), which is
the step time.
"""

FRAMEWORK = "roll"

METRIC_ALIASES = {
    "time/step_total/own": "step_s",
    "time/step_generate": "gen_s",
    "time/old_log_probs": "old_log_prob_s",
    "time/ref_log_probs_values": "ref_s",
    "time/step_train": "update_actor_s",
    "time/step_model_update": "update_weights_s",
    "time/val_step": "testing_s",
    "token/response_length/mean": "response_length_mean",
    "token/response_length/max": "response_length_max",
    "token/response_length/min": "response_length_min",
    "token/prompt_length/mean": "prompt_length_mean",
    "token/prompt_length/max": "prompt_length_max",
    "token/prompt_length/min": "prompt_length_min",
}
VALIDATION_PREFIXES = ("val_correct/",)
# The formats whose files read these names (each one's `metric_aliases`): the store keys its names by
# format, and a store is opened without loading the formats.
FORMATS = ("roll-console",)

STAGE_MEANINGS = {
    "step_s": "time/step_total of the next step (ROLL logs each step's total one step late); a tracker's "
              "log read alone has no step time",
    "gen_s": "time/step_generate: generating the batch, reward scoring included",
    "old_log_prob_s": "time/old_log_probs: the actor's log-prob pass",
    "ref_s": "time/ref_log_probs_values: the reference model's log-probs (and the critic's values)",
    "update_actor_s": "time/step_train: the actor's (and critic's) training",
    "update_weights_s": "time/step_model_update: the weight sync to the inference workers",
    "testing_s": "time/val_step: validation",
}
