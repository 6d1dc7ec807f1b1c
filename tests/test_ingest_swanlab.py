"""SwanLab offline run folders, written by the real swanlab package at three versions (0.7.20: record log
version 1, JSON records in `backup.swanlab`; 0.8.0 and 0.10.3: version 2, protobuf records in
`run-<id>.swanlab`) with `fixtures/swanlab/write_runs.py` (SwanLab is too heavy for the test extras)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from polytrace_cli.ingest.driver import ingest_paths

FIXTURES = Path(__file__).parent / "fixtures" / "swanlab"


@pytest.mark.parametrize("version, record_version", [("0.7.20", 1), ("0.8.0", 2), ("0.10.3", 2)])
def test_a_run_folder_of_each_record_version(store, version, record_version):
    reports = ingest_paths(store, [FIXTURES / f"v{version}"])
    formats = sorted(report.format for report in reports if report.status == "ingested")
    assert formats == ["swanlab-config", "swanlab-records"]
    [records] = [report for report in reports if report.format == "swanlab-records"]
    # 5 logs of 4 scalars, but SwanLab itself drops the second start's steps 1 and 2 (it keeps a key's
    # steps increasing): 12 scalars; nothing rejected; every other record ignored by its type.
    assert (records.stored, records.rejected, records.lines - records.ignored) == (12, 0, 12)
    [(framework, meta)] = store.execute("SELECT framework, meta FROM runs").fetchall()
    meta = json.loads(meta)
    assert framework == "nemo_rl"
    assert (meta["swanlab_record_version"], meta["swanlab_run_name"], meta["swanlab_project"]) == (
        record_version, "nemo-grpo", "gsm8k-grpo")
    assert meta["swanlab_state"] == "finished" and meta["model"] == "Qwen/Qwen2.5-1.5B" and meta["n_sampling"] == 16
    # `train/` is dropped from the keys.
    assert store.execute("SELECT segment, step, step_s, gen_s, update_actor_s FROM steps ORDER BY 1, 2").fetchall() == [
        (0, 1, 45.0, 22.5, 10.0), (0, 2, 47.0, 23.5, 10.0), (0, 3, 46.0, 23.0, 10.0)]
    [(loss,)] = store.execute("SELECT value FROM step_metrics WHERE key = 'loss' AND step = 3").fetchall()
    assert math.isnan(loss)


def test_a_cut_record_log_keeps_the_records_before(store, tmp_path):
    [log] = (FIXTURES / "v0.10.3").rglob("*.swanlab")
    data = log.read_bytes()
    cut = tmp_path / "run-x" / log.name
    cut.parent.mkdir()
    cut.write_bytes(data[: len(data) - 40])
    [report] = ingest_paths(store, [cut])
    assert report.status == "ingested" and report.rejected == 1
    [(reason, code)] = store.execute("SELECT reason, code FROM ingest_errors").fetchall()
    assert code == "corrupt-file" and reason.startswith("record log damaged at byte")
    assert store.execute("SELECT count(*) FROM step_metrics").fetchone()[0] == 12
