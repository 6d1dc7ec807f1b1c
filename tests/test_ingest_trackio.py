"""Trackio project files: written by the real trackio package (0.43.0) with the script beside the fixture
(`fixtures/trackio/write_project.py`; Trackio's web stack is too heavy for the test extras)."""

from __future__ import annotations

import json
import math
import shutil
import sqlite3
from pathlib import Path

import pytest

from polytrace_cli.ingest.driver import ingest_paths

FIXTURE = Path(__file__).parent / "fixtures" / "trackio" / "gsm8k-grpo.db"


def test_a_project_of_two_runs(store):
    [report] = ingest_paths(store, [FIXTURE], run_name="proj")
    assert report.format == "trackio-sqlite"
    # 5 metrics rows and 2 configs rows.
    assert (report.lines, report.stored, report.ignored, report.rejected) == (7, 7, 0, 0)
    runs = {name: (framework, json.loads(meta)) for name, framework, meta in
            store.execute("SELECT name, framework, meta FROM runs").fetchall()}
    assert set(runs) == {"proj", "proj-areal-grpo"}
    framework, meta = runs["proj"]
    assert framework == "verl" and meta["trackio_run_name"] == "verl-grpo"
    assert {key: meta[key] for key in ("model", "n_sampling", "n_gpus", "max_response_len")} == {
        "model": "Qwen/Qwen2.5-7B", "n_sampling": 8, "n_gpus": 8, "max_response_len": 2048}
    assert runs["proj-areal-grpo"][0] == "areal"
    assert store.execute("SELECT r.name, step, step_s, gen_s, update_actor_s, trainer_wait_s FROM steps"
                         " JOIN runs r USING (run_id) ORDER BY 1, 2").fetchall() == [
        ("proj", 1, 171.0, 101.0, 40.0, None), ("proj", 2, 172.0, 102.0, 40.0, None),
        ("proj", 3, 173.0, 103.0, 40.0, None),
        ("proj-areal-grpo", 0, None, None, 20.0, 40.0), ("proj-areal-grpo", 1, None, None, 20.0, 41.0)]
    # Trackio writes NaN and infinity as text; they are numbers again.
    values = dict(store.execute("SELECT step || ' ' || key, value FROM step_metrics"
                                " WHERE key IN ('actor/grad_norm', 'critic/score/max')").fetchall())
    assert math.isnan(values["2 actor/grad_norm"]) and values["3 critic/score/max"] == math.inf


def test_a_bad_row_is_rejected_alone_and_a_step_going_back_is_a_segment(store, tmp_path):
    damaged = tmp_path / "project.db"
    shutil.copy(FIXTURE, damaged)
    with sqlite3.connect(damaged) as con:
        run = con.execute("SELECT run_id FROM metrics WHERE run_name = 'verl-grpo' LIMIT 1").fetchone()[0]
        con.execute("INSERT INTO metrics (run_id, timestamp, run_name, step, metrics) VALUES (?, 't', 'verl-grpo', 1,"
                    " ?)", [run, b'{"timing_s/step": 99.0}'])
        con.execute("INSERT INTO metrics (run_id, timestamp, run_name, step, metrics) VALUES (?, 't', 'verl-grpo', 2,"
                    " ?)", [run, b'{"timing_s/step": '])
    [report] = ingest_paths(store, [damaged], run_name="proj")
    assert (report.lines, report.stored, report.rejected) == (9, 8, 1)
    [(line_no, reason, code)] = store.execute("SELECT line_no, reason, code FROM ingest_errors").fetchall()
    assert (line_no, code) == (7, "invalid-json") and reason.startswith("metrics row 7 is not a JSON object")
    assert store.execute("SELECT segment, step, step_s FROM steps JOIN runs USING (run_id) WHERE name = 'proj'"
                         " ORDER BY 1, 2").fetchall() == [(0, 1, 171.0), (0, 2, 172.0), (0, 3, 173.0), (1, 1, 99.0)]


def test_system_metrics_give_gpu_utilization_per_step_window(store, tmp_path):
    """Trackio's layout (gradio-app/trackio @ 2a027522c487b16755d1cdf12e1ae45a9b6eb15a): `trackio/gpu.py`
    `collect_gpu_metrics` logs `gpu/<i>/utilization` (percent) and `gpu/mean_utilization` through
    `Run.log_system` (`trackio/run.py`, stamped `datetime.now(timezone.utc).isoformat()` when taken) into
    `system_metrics` (`trackio/sqlite_storage.py` `bulk_log_system`); a `metrics` row's timestamp is when
    its batch was written. Three 60 s steps, each 20 s of generation then 40 s of training: GPU 0 at 30%
    then 90%, GPU 1 at 50% throughout, one sample every 2 s; per step the GPUs' mean is
    (30·20 + 90·40) / 60 / 2 + 50 / 2 = 60%."""
    from datetime import datetime, timezone

    from polytrace_cli.analyze import engine
    from polytrace_cli.analyze.common import ALL_STEPS

    start = 1_700_000_000.0

    def iso(seconds):
        return datetime.fromtimestamp(seconds, timezone.utc).isoformat()

    project = tmp_path / "grpo.db"
    shutil.copy(FIXTURE, project)
    with sqlite3.connect(project) as con:
        run = con.execute("SELECT run_id FROM metrics WHERE run_name = 'verl-grpo' LIMIT 1").fetchone()[0]
        con.execute("DELETE FROM metrics")
        con.execute("DELETE FROM configs WHERE run_name <> 'verl-grpo'")
        for step in (1, 2, 3):
            con.execute("INSERT INTO metrics (run_id, timestamp, run_name, step, metrics) VALUES (?, ?, 'verl-grpo', ?, ?)",
                        [run, iso(start + 60 * step + 0.2),
                         step, json.dumps({"timing_s/step": 60.0, "timing_s/gen": 20.0}).encode()])
        for second in range(1, 180, 2):
            busy = 30.0 if second % 60 < 20 else 90.0
            sample = {"gpu/0/utilization": busy, "gpu/1/utilization": 50, "gpu/0/memory_usage": 0.8,
                      "gpu/mean_utilization": (busy + 50) / 2, "cpu/percent": 12.0}
            con.execute("INSERT INTO system_metrics (run_id, timestamp, run_name, metrics) VALUES (?, ?, 'verl-grpo', ?)",
                        [run, iso(start + 0.2 + second), json.dumps(sample)])
        con.execute("INSERT INTO system_metrics (run_id, timestamp, run_name, metrics) VALUES (?, ?, 'verl-grpo', ?)",
                    [run, iso(start + 1.5), json.dumps({"cpu/percent": 3.0})])
        con.execute("INSERT INTO system_metrics (run_id, timestamp, run_name, metrics) VALUES (?, ?, 'verl-grpo', ?)",
                    [run, iso(start + 2.5), "{\"gpu/0/utilization\": "])
    [report] = ingest_paths(store, [project], run_name="proj")
    # 3 metrics rows, 1 config, 92 system rows: 90 with GPUs, 1 without (ignored), 1 cut short (rejected).
    assert (report.lines, report.stored, report.ignored, report.rejected) == (96, 94, 1, 1)
    assert store.execute("SELECT reason FROM ingest_errors").fetchone()[0].startswith("system_metrics row 92 ")
    assert store.execute("SELECT count(*) FROM step_metrics WHERE key LIKE 'gpu/%'").fetchone() == (0,)
    samples = store.execute("SELECT instance, count(*), min(value), max(value) FROM engine_metrics"
                            " WHERE metric = 'gpu_utilization' GROUP BY ALL ORDER BY 1").fetchall()
    assert samples == [("gpu 0", 90, 0.3, 0.9), ("gpu 1", 90, 0.5, 0.5)]
    clock = store.execute("SELECT step, logged_at, source FROM step_clock ORDER BY step").fetchall()
    assert [(step, source) for step, _, source in clock] == [(1, "tracker"), (2, "tracker"), (3, "tracker")]
    assert [at for _, at, _ in clock] == pytest.approx([start + 60 * step + 0.2 for step in (1, 2, 3)], abs=1e-5)
    run_id = store.execute("SELECT run_id FROM runs WHERE name = 'proj'").fetchone()[0]
    detail = engine.per_step(store, [run_id], ALL_STEPS).sort("step")
    assert detail["step"].to_list() == [1, 2, 3]
    assert detail["gpu_utilization_mean"].to_list() == pytest.approx([0.60] * 3, abs=0.02)
    [summary] = engine.summary(store, [run_id], ALL_STEPS).iter_rows(named=True)
    assert summary["gpu_utilization_mean"] == pytest.approx(0.60, abs=0.02)
