"""Trackio project files: written by the real trackio package (0.43.0) with the script beside the fixture
(`fixtures/trackio/write_project.py`; Trackio's web stack is too heavy for the test extras)."""

from __future__ import annotations

import json
import math
import shutil
import sqlite3
from pathlib import Path

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
