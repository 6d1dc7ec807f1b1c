"""A number too large for a double (`1e400`) in a framework's or tracker's log is rejected with its line
(`out-of-range`), never stored as a false infinity, and costs no other line."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from polytrace_cli.ingest.driver import ingest_paths

FIXTURES = Path(__file__).parent / "fixtures"
AREAL_ROW = "│ timeperf/train_step │ {} │"

CASES = {
    "slime-console": ("train.log", "perf 1: {'perf/step_time': 1e400}\nperf 2: {'perf/step_time': 5.0}\n"),
    "nemo-rl-console": ("train.log", "========================= Step 1/2 =========================\n"
                                     "⏱️  Timing:\n  • Total step time: 1e400s\n  • generation: 2.00s (40.0%)\n"),
    "roll-console": ("train.log", 'pipeline step 0 start...\n{"time/step_total": 1e400}\n'
                                  'pipeline step 1 start...\n{"time/step_total": 2.0}\n'),
    "areal-console": ("train.log", "Train step 1/5 done.\nStats (1/1):\n╒═╕\n" + AREAL_ROW.format("1e400") + "\n"
                                   + AREAL_ROW.format("2.0000e+00") + "\n╘═╛\n"),
    "clearml-metrics": ("offline-x/metrics.jsonl",
                        '[{"type": "training_stats_scalar", "iter": 1, "metric": "timing_s", "variant": "step",'
                        ' "value": 1e400}, {"type": "training_stats_scalar", "iter": 1, "metric": "timing_s",'
                        ' "variant": "gen", "value": 2.0}]\n'),
}


@pytest.mark.parametrize("fmt", sorted(CASES))
def test_a_number_too_large_for_a_double_is_rejected_alone(store, tmp_path, fmt):
    name, text = CASES[fmt]
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if fmt == "clearml-metrics":
        (path.parent / "task.json").write_text("{}")
    [report] = [r for r in ingest_paths(store, [path], format_name=fmt) if r.format == fmt]
    assert report.rejected == 1 and report.stored == 1, report
    assert store.execute("SELECT code FROM ingest_errors").fetchall() == [("out-of-range",)]
    assert store.execute("SELECT count(*) FROM step_metrics WHERE isinf(value)").fetchone() == (0,)


def test_a_trackio_row_with_a_number_too_large_for_a_double_is_rejected_alone(store, tmp_path):
    project = tmp_path / "project.db"
    shutil.copy(FIXTURES / "trackio" / "gsm8k-grpo.db", project)
    with sqlite3.connect(project) as con:
        con.execute("INSERT INTO metrics (run_id, timestamp, run_name, step, metrics) SELECT run_id, 't', run_name, 9,"
                    " ? FROM metrics LIMIT 1", [b'{"timing_s/step": 1e400}'])
    [report] = ingest_paths(store, [project], run_name="proj")
    assert report.rejected == 1 and report.stored == 7
    assert store.execute("SELECT code FROM ingest_errors").fetchall() == [("out-of-range",)]
