"""NeMo-RL's GPU monitor (`logger.monitor_gpus`): samples of the Ray nodes' GPUs logged beside the steps.

From `nemo_rl/utils/logger.py` (`RayGpuMonitorLogger`): every `collection_interval` seconds the monitor
reads each Ray node's Prometheus endpoint (`ray_node_gpus_utilization`, percent, per `GpuIndex`) and
keeps `node.<n>.gpu.<i>.util` (and `node.<n>.gpu.<i>.mem_gb`, `node.<n>.mem_gb`, `node.<n>.mem_total_gb`)
with the step int(seconds since the monitor started); every `flush_interval` seconds it logs the kept
samples through the run's loggers with the prefix `ray` and the step metric `ray/ray_step`
(TensorBoard and MLflow prefix that key too: `ray/ray/ray_step`). So a monitor series' step is a
time, not a training step: in a TensorBoard file or an MLflow store, these series are read as engine
samples (`engine_metrics`; a GPU's `util` as `gpu_utilization`, a share, instance `node <n> gpu <i>`),
never as steps.

A sample's wall clock: the monitor's start plus its step. The start is not logged; each flush writes
its samples at once, right after the last of them was taken, so per monitor (a step lower than the
one before starts another: a restarted job)

    start ≈ min over its samples of (logged_at − step)        ts = start + step

within about a second (the step is a whole second, the flush follows the collection). The step
metric itself is ignored (`GPU monitor step`).
"""

from __future__ import annotations

from polytrace_cli.lazy import polars as pl

MONITOR_SERIES = r"^ray/node\.\d+\."
MONITOR_STEP_KEYS = ("ray/ray/ray_step", "ray/ray_step")
GPU_UTILIZATION = r"^ray/node\.(\d+)\.gpu\.(\d+)\.util$"
STEP_RULE = "GPU monitor step"


def is_monitor_key(key: pl.Expr) -> pl.Expr:
    """Whether a logged key is one of the GPU monitor's (its series or its step metric)."""
    return key.str.contains(MONITOR_SERIES) | key.is_in(MONITOR_STEP_KEYS)


def monitor_samples(frame: pl.DataFrame, by: list[str] | None = None) -> pl.DataFrame:
    """Engine samples (line_no, ts, engine, instance, name, metric, labels, value, and the `by` columns)
    of the monitor's series in `frame` (line_no, step, key, value, logged_at in seconds; in the order
    written), per `by` group: ts = start + step, start as the module docstring says."""
    by = by or []
    series = frame.filter(pl.col("key").str.contains(MONITOR_SERIES)).sort("line_no")
    if not by:
        series = series.with_columns(_all=pl.lit(0))
    groups = by or ["_all"]
    gpu = pl.col("key").str.extract(GPU_UTILIZATION, 2)
    node = pl.col("key").str.extract(GPU_UTILIZATION, 1)
    over = [*groups, "_monitor"]
    return series.with_columns(
        _monitor=(pl.col("step") < pl.col("step").shift(1)).fill_null(False).cum_sum().over(groups)
    ).with_columns(ts=(pl.col("logged_at") - pl.col("step")).min().over(over) + pl.col("step")).select(
        *by, "line_no", "ts", engine=pl.lit("nemo-rl-gpu-monitor"),
        instance=pl.when(gpu.is_not_null()).then(pl.concat_str(pl.lit("node "), node, pl.lit(" gpu "), gpu)),
        name="key", metric=pl.when(gpu.is_not_null()).then(pl.lit("gpu_utilization")), labels=pl.lit("{}"),
        value=pl.when(gpu.is_not_null()).then(pl.col("value") / 100.0).otherwise(pl.col("value")),
    ).filter(pl.col("ts").is_not_null() & pl.col("value").is_not_null() & pl.col("value").is_finite())
