"""What the inference engines' Prometheus series mean: exposed name -> canonical name.

Names as vLLM and SGLang register them (vLLM's V1 `vllm/v1/metrics/loggers.py`, and the V0 names it
deprecated in 0.9; SGLang's `python/sglang/srt/metrics/collector.py`). A counter is exposed with a
`_total` suffix, a histogram as `_bucket`, `_sum` and `_count` series. This module imports nothing:
opening a store never loads a reader.
"""

# Engine series are not step metrics: no key of a step maps to a `steps` column from here.
METRIC_ALIASES: dict[str, str] = {}
VALIDATION_PREFIXES: tuple[str, ...] = ()

# Gauges: the value at the sample's time.
GAUGES = {
    "vllm:num_requests_running": "requests_running",
    "sglang:num_running_reqs": "requests_running",
    "vllm:num_requests_waiting": "requests_waiting",
    "sglang:num_queue_reqs": "requests_waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",      # 0..1, from vLLM 0.9
    "vllm:gpu_cache_usage_perc": "kv_cache_usage",     # 0..1, before vLLM 0.9
    "sglang:token_usage": "kv_cache_usage",            # 0..1: used share of the KV token pool
    "sglang:gen_throughput": "generation_tokens_per_s",
    "sglang:cache_hit_rate": "prefix_cache_hit_rate",
    "vllm:gpu_prefix_cache_hit_rate": "prefix_cache_hit_rate",
    "sglang:num_retracted_reqs": "requests_retracted",
}
# Counters: cumulative since the engine started; a step's share is the rise over its window.
COUNTERS = {
    "vllm:num_preemptions_total": "preemptions_total",
    "vllm:generation_tokens_total": "generation_tokens_total",
    "vllm:prompt_tokens_total": "prompt_tokens_total",
    "sglang:generation_tokens_total": "generation_tokens_total",
    "sglang:prompt_tokens_total": "prompt_tokens_total",
}
# Histograms: the `_sum` and `_count` series are kept (a window's mean is Δsum / Δcount); buckets are not.
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": "time_to_first_token_s",
    "sglang:time_to_first_token_seconds": "time_to_first_token_s",
    "vllm:e2e_request_latency_seconds": "request_latency_s",
    "sglang:e2e_request_latency_seconds": "request_latency_s",
    "vllm:request_queue_time_seconds": "queue_time_s",
    "sglang:queue_time_seconds": "queue_time_s",
}


def canonical_names() -> dict[str, str]:
    """Every exposed series name polytrace gives a meaning to -> its canonical name (histograms as
    `<name>_sum` -> `<canonical>_sum` and `<name>_count` -> `<canonical>_count`)."""
    names = {**GAUGES, **COUNTERS}
    for name, canonical in HISTOGRAMS.items():
        names[f"{name}_sum"] = f"{canonical}_sum"
        names[f"{name}_count"] = f"{canonical}_count"
    return names
