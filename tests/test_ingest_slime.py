"""slime / miles console logs: the per-rollout dicts of both sides, streams that interleave, run facts.

The fixtures are written from slime's source at commit 624b824a898ab0ec1fcb4d373004c7f3852bf515
(THUDM/slime): `slime/observability/rollout_metrics.py` (`log_rollout_data` prints the rollout side's
`perf {rollout_id}: {...}` with `rollout/response_len/*`, `rollout/truncated_ratio` and
`perf/rollout_time`; `log_eval_rollout_data` prints `eval {rollout_id}: {...}`),
`slime/observability/train_metric_utils.py` (`gather_log_data` prints `rollout {rollout_id}: {...}`,
`log_perf_data` the training side's `perf {rollout_id}: {...}` with `perf/<timer>_time`,
`perf/step_time` = train_wait + train and `perf/wait_time_ratio`), `slime/backends/megatron_utils/model.py`
(`step {k}: {'train/...'}` per optimizer step) and `slime/observability/logging_utils.py` (the logging
prefix `[%(asctime)s] %(filename)s:%(lineno)d - `); the argument listing is the one Megatron-LM's
`validate_args` prints (`_print_args("arguments", args)`), which slime's `megatron_utils/arguments.py`
calls. `async.log` follows `train_async.py` (the rollout of
step N+1 runs while step N trains) with the keys of slime 0.1 (261ecee7, `slime/ray/buffer.py`,
`slime/backends/megatron_utils/data.py`: bare `print`, `perf/total_train_time`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polytrace_cli.ingest.driver import ingest_paths

FIXTURES = Path(__file__).parent / "fixtures" / "slime"


def _steps(con, run: str) -> list[tuple]:
    return con.execute(
        "SELECT segment, step, step_s, trainer_wait_s, rollout_s, update_weights_s, old_log_prob_s, ref_s,"
        " update_actor_s, trainer_idle_ratio, response_length_mean, response_length_max, clip_ratio, flags"
        " FROM steps JOIN runs USING (run_id) WHERE name = ? ORDER BY segment, step", [run]).fetchall()


def test_a_colocated_run_reads_both_sides_of_each_rollout(store):
    [report] = ingest_paths(store, [FIXTURES / "colocate.log"], run_name="colocated")
    assert report.format == "slime-console"
    # 26 lines: 8 dicts stored, the rollout side's perf 2 cut short (rejected), 17 other lines.
    assert (report.lines, report.stored, report.ignored, report.rejected) == (26, 8, 17, 1)
    ignored = dict(store.execute("SELECT rule, lines FROM ignored_lines").fetchall())
    assert ignored == {"blank": 1, "optimizer-step dict": 2, "other": 7, "timer": 2, "tqdm": 1, "traceback": 3,
                       "warning": 1}
    [(line_no, code)] = store.execute("SELECT line_no, code FROM ingest_errors").fetchall()
    assert (line_no, code) == (22, "unparsable-line")
    assert _steps(store, "colocated") == [
        (0, 0, 164.3, 104.2, 98.6, 3.1, 9.4, 8.8, 41.3, 0.6342, 812.5, 4096.0, 0.0625, []),
        (0, 1, 177.9, 115.4, 110.2, 3.0, 9.9, 9.1, 43.0, 0.6487, 901.0, 4096.0, 0.09375, []),
        (0, 2, 221.9, 158.0, None, 3.2, 10.1, 9.0, 44.1, 0.712, None, None, None, []),
    ]
    # The evaluation dict is a validation key of step 1; the training side's rollout dict gives the reward.
    pairs = dict(store.execute("SELECT key, value FROM step_metrics WHERE step = 1").fetchall())
    assert pairs["eval/aime"] == 0.31 and pairs["rollout/raw_reward"] == 0.35
    assert store.execute("SELECT canonical FROM named_step_metrics WHERE key = 'rollout/raw_reward'").fetchone() == (
        "reward_mean",)
    framework, meta = store.execute("SELECT framework, meta FROM runs").fetchone()
    meta = json.loads(meta)
    assert framework == "slime"
    assert {key: meta[key] for key in ("colocate", "actor_num_nodes", "actor_num_gpus_per_node", "rollout_num_gpus",
                                       "n_gpus", "n_sampling", "rollout_batch_size", "max_response_len", "model")} == {
        "colocate": True, "actor_num_nodes": 1, "actor_num_gpus_per_node": 4, "rollout_num_gpus": 4, "n_gpus": 4,
        "n_sampling": 8, "rollout_batch_size": 32, "max_response_len": 4096, "model": "/root/Qwen3-4B"}


def test_interleaved_sides_are_one_step_and_a_restart_is_a_segment(store):
    [report] = ingest_paths(store, [FIXTURES / "async.log"], run_name="async")
    assert (report.lines, report.stored, report.ignored, report.rejected) == (8, 8, 0, 0)
    # The rollout side's perf 1 comes before the training side's perf 0: no restart there. The job's
    # second start (rollout 0 again on both sides) is one new segment, not two.
    assert [row[:6] for row in _steps(store, "async")] == [
        (0, 0, 80.0, 45.0, 40.0, 2.0), (0, 1, 42.0, 6.0, 42.0, 2.1), (0, 2, 41.0, 5.5, 41.0, 2.0),
        (1, 0, 79.0, 44.0, 39.0, 2.0)]
    assert store.execute("SELECT segment, step, flag, detail FROM step_flags").fetchall() == [
        (1, 0, "restart", "step went back from 2 to 0")]
    assert json.loads(store.execute("SELECT meta FROM runs").fetchone()[0]) == {"framework": "slime"}


def test_a_verl_or_trl_log_is_not_taken_for_slime(tmp_path, store):
    log = tmp_path / "train.log"
    log.write_text("step:1 - timing_s/step:20.0 - perf/throughput:100.0\n"
                   "{'loss': 0.1, 'perf/step_time': 3.0}\n")
    [report] = ingest_paths(store, [log], run_name="other")
    assert report.format == "verl-console"


def test_tensorboard_events_of_a_slime_run(store, tmp_path):
    # slime `slime/observability/tensorboard_utils.py`: `add_scalar(key, value, step)` with the step key
    # (`rollout/step`) left out; both sides' perf dicts land on the rollout id.
    tensorboardX = pytest.importorskip("tensorboardX")
    folder = tmp_path / "slime_tb" / "tensorboard"
    writer = tensorboardX.SummaryWriter(logdir=str(folder))
    for rollout in (0, 1):
        for key, value in {"perf/rollout_time": 90.0 + rollout, "rollout/response_len/mean": 800.0,
                           "perf/train_wait_time": 100.0, "perf/train_time": 60.0, "perf/step_time": 160.0 + rollout,
                           "perf/actor_train_time": 40.0, "perf/update_weights_time": 3.0}.items():
            writer.add_scalar(key, value, rollout)
    writer.close()
    [report] = ingest_paths(store, [folder], run_name="slime_tb")
    assert report.format == "tensorboard-events"
    assert store.execute("SELECT framework FROM runs").fetchone() == ("slime",)
    assert [row[:6] for row in _steps(store, "slime_tb")] == [(0, 0, 160.0, 100.0, 90.0, 3.0),
                                                              (0, 1, 161.0, 100.0, 91.0, 3.0)]


# slime's W&B calls (`slime/observability/wandb_utils.py` `_init_wandb_common`, `logging_utils.log`): each
# group's keys are stepped by a step key of its own through `define_metric`, and `wandb.log` gets no `step`, so
# wandb's `_step` only counts the calls (four per rollout here).
WANDB_WRITER = """
import wandb
run = wandb.init(project="polytrace-test", settings=wandb.Settings(x_disable_stats=True),
                 config={"rollout_num_gpus": 4, "actor_num_gpus_per_node": 4, "actor_num_nodes": 1, "colocate": False,
                         "n_samples_per_prompt": 8})
wandb.define_metric("train/step"); wandb.define_metric("train/*", step_metric="train/step")
wandb.define_metric("rollout/step"); wandb.define_metric("rollout/*", step_metric="rollout/step")
wandb.define_metric("perf/*", step_metric="rollout/step")
for rollout in range(3):
    wandb.log({"rollout/response_len/mean": 800.0 + rollout, "perf/rollout_time": 90.0 + rollout, "rollout/step": rollout})
    wandb.log({"train/loss": 0.01, "train/step": rollout})
    wandb.log({"rollout/raw_reward": 0.3, "rollout/step": rollout})
    wandb.log({"perf/train_wait_time": 100.0, "perf/step_time": 160.0 + rollout, "rollout/step": rollout})
run.finish()
"""


def test_a_wandb_offline_run_of_slime_is_stepped_by_its_rollout_step(store, tmp_path):
    pytest.importorskip("wandb")
    import os
    import subprocess
    import sys

    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path),
           "WANDB_DISABLE_GIT": "true", "WANDB_DISABLE_CODE": "true", "WANDB_API_KEY": "", "HOME": str(tmp_path)}
    subprocess.run([sys.executable, "-c", WANDB_WRITER], env=env, check=True, timeout=120, capture_output=True)
    [log] = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    [report] = ingest_paths(store, [log], run_name="slime_wandb")
    assert report.format == "wandb-offline" and report.rejected == 0
    framework, meta = store.execute("SELECT framework, meta FROM runs").fetchone()
    meta = json.loads(meta)
    assert framework == "slime" and meta["wandb_step_metrics"] == ["rollout/step", "train/step"]
    assert (meta["colocate"], meta["n_gpus"], meta["n_sampling"]) == (False, 8, 8)
    assert [row[:6] for row in _steps(store, "slime_wandb")] == [
        (0, 0, 160.0, 100.0, 90.0, None), (0, 1, 161.0, 100.0, 91.0, None), (0, 2, 162.0, 100.0, 92.0, None)]
    assert store.execute("SELECT count(*) FROM step_metrics WHERE key IN ('rollout/step', 'train/step')").fetchone() == (0,)


def test_an_evaluation_before_and_after_the_first_training_is_no_restart(store, tmp_path):
    # slime `train.py`: `eval(0)` before the loop unless `--skip-eval-before-train`, and again after
    # rollout 0 when `--eval-interval 1`.
    log = tmp_path / "eval.log"
    log.write_text("eval 0: {'eval/aime': 0.2}\n"
                   "perf 0: {'perf/rollout_time': 40.0, 'rollout/response_len/mean': 500.0}\n"
                   "perf 0: {'perf/train_wait_time': 45.0, 'perf/train_time': 35.0, 'perf/step_time': 80.0}\n"
                   "eval 0: {'eval/aime': 0.25}\n"
                   "perf 1: {'perf/rollout_time': 41.0, 'rollout/response_len/mean': 520.0}\n")
    [report] = ingest_paths(store, [log], run_name="evals")
    assert report.stored == 5 and not report.notes
    assert store.execute("SELECT count(*) FROM step_flags").fetchone() == (0,)
    assert store.execute("SELECT step, step_s, rollout_s FROM steps ORDER BY step").fetchall() == [
        (0, 80.0, 40.0), (1, None, 41.0)]
