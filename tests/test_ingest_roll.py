"""ROLL's RLVR pipeline console: the step's metrics as a JSON dict, and its step total logged one step late.

The fixture is written from ROLL's source at commit 8eb27cc2dc34c4d1310b169d9b86d339004d811a (alibaba/ROLL):
`roll/pipeline/rlvr/rlvr_pipeline.py` (`pipeline step N start...`, `time/step_total` added at the start of a
step from `pre_step_total_time`, 0 at first, the `Timer` blocks `time/step_generate`, `time/ref_log_probs_values`,
`time/old_log_probs`, `time/step_train`, `time/step_model_update`, `time/val_step`, and
`logger.info(json.dumps(metrics))` after the generation examples), `examples/start_rlvr_pipeline.py` (the
config printed at start, keys of `examples/*/qwen*_rlvr*.yaml`), `roll/utils/metrics/metrics_manager.py`
(`add_token_metrics`: `token/response_length/*`) and `roll/utils/logging.py` (the line prefix).
"""

from __future__ import annotations

import json
from pathlib import Path

from polytrace_cli.ingest.driver import ingest_paths

FIXTURES = Path(__file__).parent / "fixtures" / "roll"


def test_the_dicts_give_stages_and_the_late_step_total_its_own_step(store):
    [report] = ingest_paths(store, [FIXTURES / "rlvr.log"], run_name="roll")
    assert report.format == "roll-console"
    # The config printed at start (10 lines) is counted under the noise rules.
    assert (report.lines, report.stored, report.ignored, report.rejected) == (25, 3, 21, 1)
    assert store.execute("SELECT line_no, code FROM ingest_errors").fetchall() == [(23, "invalid-json")]
    # Step 1 logs 80.25, the total of step 0; step 2's dict is cut short, so step 1's total (logged by
    # step 2) and step 2's (logged by step 3) are not known.
    assert store.execute(
        "SELECT step, step_s, gen_s, old_log_prob_s, ref_s, update_actor_s, update_weights_s, testing_s,"
        " response_length_mean FROM steps ORDER BY step").fetchall() == [
        (0, 80.25, 41.0, 8.0, 7.0, 20.0, 3.5, None, 612.5),
        (1, None, 44.0, 8.5, None, 21.0, 3.4, 12.0, 640.0),
        (3, None, 46.0, None, None, 20.0, None, None, None)]
    assert store.execute("SELECT value FROM step_metrics WHERE key = 'time/step_total' ORDER BY step").fetchall() == [
        (0.0,), (80.25,), (86.5,)]
    framework, meta = store.execute("SELECT framework, meta FROM runs").fetchone()
    # Training on GPUs 0-3, inference on 4-7: not colocated.
    assert framework == "roll" and json.loads(meta) == {
        "framework": "roll", "n_sampling": 8, "num_gpus_per_node": 8, "actor_train_gpus": 4, "actor_infer_gpus": 4,
        "colocate": False, "n_gpus": 8, "console_clock": "printed times without a zone, read as UTC"}


def test_the_stdout_trackers_lines_are_the_steps_when_present(store, tmp_path):
    # `roll/utils/tracking.py` `StdoutTracker.log`: `metrics_tag: {"step": N, "metrics": {...}}`, the reducer
    # tags of the keys removed (`_strip_metric_tag`); the pipeline's own dicts of the same steps keep them.
    prefix = "[2025-08-19 15:37:31] [tracking.py (160)] [INFO] [PIPELINE 0 / 1][PID 5512] "
    log = tmp_path / "roll.log"
    log.write_text(
        prefix + "pipeline step 0 start...\n"
        + prefix + '{"time/step_total": 0, "time/step_generate": 41.0, "actor/pg_loss@sum": 0.5}\n'
        + prefix + 'metrics_tag: {"step": 0, "metrics": {"time/step_total": 0, "time/step_generate": 41.0,'
                   ' "actor/pg_loss": 0.5}}\n'
        + prefix + "pipeline step 1 start...\n"
        + prefix + 'metrics_tag: {"step": 1, "metrics": {"time/step_total": 80.0, "time/step_generate": 44.0}}\n')
    [report] = ingest_paths(store, [log], run_name="tagged")
    assert (report.lines, report.stored, report.rejected) == (5, 2, 0)
    assert dict(store.execute("SELECT rule, lines FROM ignored_lines").fetchall()) == {
        "metrics dict also in metrics_tag": 1, "step boundary": 2}
    assert store.execute("SELECT step, step_s, gen_s FROM steps ORDER BY step").fetchall() == [(0, 80.0, 41.0),
                                                                                              (1, None, 44.0)]
    assert store.execute("SELECT count(*) FROM step_metrics WHERE key = 'actor/pg_loss'").fetchone() == (1,)
