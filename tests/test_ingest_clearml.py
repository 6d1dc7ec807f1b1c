"""ClearML offline session folders, written by the real clearml package (2.1.12) with
`fixtures/clearml/write_sessions.py` (its task waits seconds on its reporter at close, too slow for a test),
logging as verl's ClearML backend does (`verl/utils/tracking.py` at volcengine/verl commit
03e1b65793f0f2dcc526cf6bf087028ca8c900e9: `report_scalar(title, series, ...)` from `key.split("/", 1)`,
`connect_configuration(config, name="Hyperparameters")`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from polytrace_cli.ingest.driver import ingest_paths

FIXTURES = Path(__file__).parent / "fixtures" / "clearml"


def _meta(con, run: str) -> tuple[str, dict]:
    framework, meta = con.execute("SELECT framework, meta FROM runs WHERE name = ?", [run]).fetchone()
    return framework, json.loads(meta)


def test_two_sessions_their_settings_and_the_nan_trap(store):
    reports = {(Path(r.path).parent.name, r.format): r for r in ingest_paths(store, [FIXTURES]) if r.status == "ingested"}
    assert sorted(reports) == [("offline-slime", "clearml-log"), ("offline-slime", "clearml-metrics"),
                               ("offline-slime", "clearml-task"), ("offline-verl", "clearml-log"),
                               ("offline-verl", "clearml-metrics"), ("offline-verl", "clearml-task")]
    metrics = reports[("offline-verl", "clearml-metrics")]
    assert (metrics.lines, metrics.stored, metrics.rejected) == (15, 15, 0)  # 3 steps of 5 scalars
    assert store.execute("SELECT step, step_s, gen_s, update_actor_s, response_length_mean FROM steps"
                         " JOIN runs USING (run_id) WHERE name = 'offline-verl' ORDER BY step").fetchall() == [
        (1, 171.0, 101.0, 40.0, 601.0), (2, 172.0, 102.0, 40.0, 602.0), (3, 173.0, 103.0, 40.0, 603.0)]
    framework, meta = _meta(store, "offline-verl")
    # The configuration was kept by ClearML as HOCON text; it is read back for the run's settings.
    assert framework == "verl" and meta["clearml_task_name"] == "verl-grpo"
    assert (meta["model"], meta["n_sampling"], meta["n_gpus"], meta["max_response_len"]) == ("Qwen/Qwen2.5-7B", 8, 8, 2048)
    # ClearML stored the NaN of step 2 as 0.0 and said so in its console log.
    assert meta["clearml_nan_reported_as"] == 0.0
    assert store.execute("SELECT value FROM step_metrics WHERE key = 'actor/grad_norm' AND step = 2").fetchone() == (0.0,)
    assert any("may be a NaN" in note for note in reports[("offline-verl", "clearml-log")].notes)
    framework, meta = _meta(store, "offline-slime")
    # Hyperparameters (`task.connect`): slime's arguments; training and rollout on their own GPUs.
    assert framework == "slime" and (meta["colocate"], meta["n_gpus"], meta["n_sampling"]) == (False, 8, 8)
    assert store.execute("SELECT step, step_s, trainer_wait_s FROM steps JOIN runs USING (run_id)"
                         " WHERE name = 'offline-slime' ORDER BY step").fetchall() == [(0, 90.0, 50.0), (1, 91.0, 50.0)]


def test_a_line_that_is_not_an_event_array_is_rejected_alone(store, tmp_path):
    session = tmp_path / "offline-x"
    shutil.copytree(FIXTURES / "offline-verl", session)
    metrics = session / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + '[{"type": "training_stats_scalar", "iter": 4, "metric": "timing_s"\n')
    [report] = [r for r in ingest_paths(store, [metrics]) if r.format == "clearml-metrics"]
    assert (report.lines, report.stored, report.rejected) == (16, 15, 1)
    assert store.execute("SELECT code FROM ingest_errors").fetchall() == [("invalid-json",)]
