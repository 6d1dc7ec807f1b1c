"""NeMo-RL: the GRPO loop's console summaries, and its keys in TensorBoard event files written by a real
writer at test time.

The console fixture is written from NeMo-RL's source at commit 7ea279abfbeb698b092856d0dab61e7cf39bc909
(NVIDIA-NeMo/RL): `nemo_rl/algorithms/grpo.py` prints the `Epoch e/E` and `Step N/M` headers (the step
counted within the epoch), the `📊 Training Results:` bullets (Loss, Generation KL Error, Avg Reward,
Mean Generation Length), the `⏱️  Timing:` bullets (`Total step time`, then every timer with its
share), and `validate` the `📊 Validation Results:` and `⏱️  Validation Timing:` bullets;
`nemo_rl/algorithms/utils.py` `print_performance_metrics` the `🔍 Performance Metrics:` block;
`examples/run_grpo.py` the `Final config:` pprint. Its TensorBoard keys follow
`nemo_rl/utils/logger.py` (`TensorboardLogger.log_metrics`: `add_scalar(f"{prefix}/{name}", value,
step)`) with the prefixes `train`, `timing/train` and `validation` of `grpo.py`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polytrace_cli.ingest.driver import ingest_paths

FIXTURES = Path(__file__).parent / "fixtures" / "nemo_rl"


def _steps(con, run: str) -> list[tuple]:
    return con.execute(
        "SELECT segment, step, step_s, gen_s, old_log_prob_s, update_actor_s, update_weights_s, reward_s, adv_s,"
        " response_length_mean, is_validation_only FROM steps JOIN runs USING (run_id) WHERE name = ?"
        " ORDER BY segment, step", [run]).fetchall()


def test_the_console_summaries_give_the_stages_per_step(store):
    [report] = ingest_paths(store, [FIXTURES / "grpo_math.log"], run_name="nemo")
    assert report.format == "nemo-rl-console"
    # 32 bullets stored; `reward_calculation: n/a` rejected; headers, titles, other bullets and the rest ignored.
    assert (report.lines, report.stored, report.ignored, report.rejected) == (91, 32, 58, 1)
    ignored = dict(store.execute("SELECT rule, lines FROM ignored_lines").fetchall())
    assert ignored["step header"] == 5 and ignored["block title"] == 9 and ignored["other bullet"] == 2
    [(line_no, code)] = store.execute("SELECT line_no, code FROM ingest_errors").fetchall()
    assert (line_no, code) == (74, "unparsable-line")
    # Step 0 is the initial validation; the second epoch's `Step 1/2` is step 3.
    assert _steps(store, "nemo") == [
        (0, 0, None, None, None, None, None, None, None, None, True),
        (0, 1, 45.12, 20.11, 6.5, 10.02, 3.9, 1.3, 0.05, 612.34, False),
        (0, 2, 47.0, 21.5, 6.6, 10.1, 4.0, None, None, 640.0, False),
        (0, 3, 46.4, 21.0, None, 10.0, None, None, None, 655.5, False),
    ]
    validation = dict(store.execute("SELECT key, value FROM step_metrics WHERE step = 0").fetchall())
    assert validation == {"validation/accuracy": 0.25, "validation/avg_length": 401.5,
                          "validation/num_samples": 500.0, "timing/validation/total_validation_time": 30.25}
    framework, meta = store.execute("SELECT framework, meta FROM runs").fetchone()
    assert framework == "nemo_rl"
    assert json.loads(meta) == {"framework": "nemo_rl", "value_precision": 0.01, "model": "Qwen/Qwen2.5-1.5B",
                                "colocated": True, "async_grpo": False, "num_nodes": 1, "gpus_per_node": 8,
                                "n_gpus": 8, "num_prompts_per_step": 32, "n_sampling": 16}


def test_a_restarted_job_is_a_new_segment(store, tmp_path):
    text = (FIXTURES / "grpo_math.log").read_text()
    log = tmp_path / "restarted.log"
    log.write_text(text + text)
    [report] = ingest_paths(store, [log], run_name="again")
    assert report.status == "ingested"
    # The second start's initial validation is printed before its first header: it stays with step 3.
    assert store.execute("SELECT segment, step, flag, detail FROM step_flags").fetchall() == [
        (1, 1, "restart", "step went back from 3 to 1")]
    assert [row[:3] for row in _steps(store, "again")][-3:] == [(1, 1, 45.12), (1, 2, 47.0), (1, 3, 46.4)]


def test_tensorboard_events_of_a_nemo_rl_run(store, tmp_path):
    tensorboardX = pytest.importorskip("tensorboardX")
    folder = tmp_path / "nemo_tb" / "tensorboard"
    writer = tensorboardX.SummaryWriter(logdir=str(folder))
    for step, (total, generation) in enumerate([(45.0, 20.0), (47.0, 21.0)], start=1):
        for prefix, metrics in (("train", {"loss": 0.01, "reward": 0.4 + step / 100, "mean_gen_tokens_per_sample": 600.0 + step}),
                                ("timing/train", {"total_step_time": total, "generation": generation,
                                                  "policy_training": 10.0, "policy_and_reference_logprobs": 6.0,
                                                  "prepare_for_generation/transfer_and_update_weights": 4.0})):
            for name, value in metrics.items():
                writer.add_scalar(f"{prefix}/{name}", value, step)
    writer.close()
    [report] = ingest_paths(store, [folder], run_name="nemo_tb")
    assert report.format == "tensorboard-events"
    assert store.execute("SELECT framework FROM runs").fetchone() == ("nemo_rl",)
    assert _steps(store, "nemo_tb") == [(0, 1, 45.0, 20.0, 6.0, 10.0, 4.0, None, None, 601.0, False),
                                        (0, 2, 47.0, 21.0, 6.0, 10.0, 4.0, None, None, 602.0, False)]


# NeMo-RL's GPU monitor, as `nemo_rl/utils/logger.py` (NVIDIA-NeMo/RL @ 7ea279abfbeb698b092856d0dab61e7cf39bc909)
# writes it: `RayGpuMonitorLogger` collects `node.<n>.gpu.<i>.util` (Ray's `ray_node_gpus_utilization`,
# percent) and `node.<n>.gpu.<i>.mem_gb` every `collection_interval` with the step int(seconds since it
# started), and every `flush_interval` logs the kept samples with prefix `ray` and `ray/ray_step` added
# (prefixed again by the TensorBoard and MLflow loggers: `ray/ray/ray_step`). Three 60 s steps, 20 s of
# generation each: GPU 0 at 30% then 90%, GPU 1 at 50%; per step their mean is 60%.
MONITOR_START = 1_700_000_000.0 - 0.4
STEP_START = 1_700_000_000.0


def _monitor_writes():
    """(wall time, step, key, value) in the order the loggers write them: a flush every 5 samples, 50 ms after
    the last is taken; each training step's scalars when it ends."""
    writes = []
    for n in range(180):
        if n % 5 == 4:
            flushed = MONITOR_START + n + 0.05
            for sample in range(n - 4, n + 1):
                busy = 30.0 if (MONITOR_START + sample - STEP_START) % 60 < 20 else 90.0
                for key, value in (("ray/node.0.gpu.0.util", busy), ("ray/node.0.gpu.1.util", 50.0),
                                   ("ray/node.0.gpu.0.mem_gb", 41.5), ("ray/ray/ray_step", float(sample))):
                    writes.append((flushed, sample, key, value))
    for step in (1, 2, 3):
        end = STEP_START + 60 * step
        for key, value in (("train/loss", 0.01), ("timing/train/total_step_time", 60.0),
                           ("timing/train/generation", 20.0)):
            writes.append((end, step, key, value))
    return sorted(writes, key=lambda write: write[0])


def _check_monitor_run(con, name):
    from polytrace_cli.analyze import engine
    from polytrace_cli.analyze.common import ALL_STEPS

    run_id = con.execute("SELECT run_id FROM runs WHERE name = ?", [name]).fetchone()[0]
    # The monitor's steps are seconds, not steps: no step of its own, no segment cut by them.
    assert con.execute("SELECT segment, step, step_s, gen_s FROM steps ORDER BY step").fetchall() == [
        (0, 1, 60.0, 20.0), (0, 2, 60.0, 20.0), (0, 3, 60.0, 20.0)]
    assert con.execute("SELECT count(*) FROM step_metrics WHERE key LIKE 'ray/%'").fetchone() == (0,)
    samples = con.execute("SELECT instance, count(*), min(ts) FROM engine_metrics WHERE metric = 'gpu_utilization'"
                          " GROUP BY ALL ORDER BY 1").fetchall()
    assert [(instance, count) for instance, count, _ in samples] == [("node 0 gpu 0", 180), ("node 0 gpu 1", 180)]
    assert all(abs(first - MONITOR_START) <= 1.0 for _, _, first in samples)  # the monitor's start, within a second
    assert con.execute("SELECT lines FROM ignored_lines WHERE rule = 'GPU monitor step'").fetchone() == (180,)
    detail = engine.per_step(con, [run_id], ALL_STEPS).sort("step")
    assert detail["gpu_utilization_mean"].to_list() == pytest.approx([0.60] * 3, abs=0.02)


def test_the_gpu_monitor_in_tensorboard_is_gpu_utilization_per_step_window(store, tmp_path):
    tensorboardX = pytest.importorskip("tensorboardX")
    folder = tmp_path / "nemo_gpu" / "tensorboard"
    writer = tensorboardX.SummaryWriter(logdir=str(folder))
    for wall, step, key, value in _monitor_writes():
        writer.add_scalar(key, value, step, walltime=wall)
    writer.close()
    [report] = ingest_paths(store, [folder], run_name="nemo_gpu")
    assert report.format == "tensorboard-events" and report.rejected == 0
    _check_monitor_run(store, "nemo_gpu")


def test_the_gpu_monitor_in_an_mlflow_file_store_is_gpu_utilization_per_step_window(store, tmp_path):
    # The file store's layout (`mlruns/<experiment>/<run>/metrics/<key>`, one `timestamp value step` line per
    # value, timestamps in ms: mlflow/store/tracking/file_store.py), as `mlflow.log_metrics` writes it.
    run = tmp_path / "mlruns" / "0" / "abc123"
    (run / "metrics").mkdir(parents=True)
    (run / "meta.yaml").write_text("run_id: abc123\nexperiment_id: '0'\nrun_name: grpo\n")
    lines: dict[str, list[str]] = {}
    for wall, step, key, value in _monitor_writes():
        lines.setdefault(key, []).append(f"{round(wall * 1000)} {value} {step}\n")
    for key, text in lines.items():
        (run / "metrics" / key).parent.mkdir(parents=True, exist_ok=True)
        (run / "metrics" / key).write_text("".join(text))
    ingest_paths(store, [tmp_path / "mlruns"], run_name="nemo_mlflow")
    _check_monitor_run(store, "nemo_mlflow")
