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
