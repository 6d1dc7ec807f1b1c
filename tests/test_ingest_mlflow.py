"""MLflow stores written at test time by mlflow-skinny (no server): the `mlruns/` file store and the
SQLite store, read back without MLflow: every value exactly, params and tags as run meta."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from polytrace_cli.ingest.driver import ingest_paths

pytest.importorskip("mlflow")

# verl-style keys over four steps; step 2's reward is NaN. The job then resumes from step 3 and logs
# steps 3 and 4 again with other values (a new segment).
VALUES = {step: {"timing_s/step": 10.0 + step / 3, "response_length/mean": 300.1 * step,
                 "critic/rewards/mean": float("nan") if step == 2 else 0.07 * step} for step in range(1, 5)}
AGAIN = {step: {"timing_s/step": 20.0 + step / 7} for step in (3, 4)}
PARAMS = {"actor_rollout_ref.rollout.n": 8, "actor_rollout_ref.model.path": "Qwen/Qwen2.5-7B",
          "data.max_response_length": 4096, "trainer.nnodes": 1, "trainer.n_gpus_per_node": 8}
WRITER = """
import json, sys, mlflow
uri, values, again, params, runs = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[4]), int(sys.argv[5])
mlflow.set_tracking_uri(uri)
mlflow.set_experiment("polytrace-test")
for index in range(runs):
    with mlflow.start_run(run_name=f"grpo-{index}") as run:
        mlflow.log_params(params)
        mlflow.set_tag("purpose", "test")
        for step, row in values.items():
            mlflow.log_metrics({k: float(v) for k, v in row.items()}, step=int(step))
        for step, row in again.items():
            mlflow.log_metrics(row, step=int(step))
    if index == 2:
        mlflow.delete_run(run.info.run_id)
"""


def write_store(tmp_path: Path, uri: str, runs: int = 1) -> None:
    env = {**os.environ, "MLFLOW_ALLOW_FILE_STORE": "true", "MLFLOW_ENABLE_TELEMETRY": "false", "DO_NOT_TRACK": "1",
           "HOME": str(tmp_path)}
    values = {str(s): {k: ("NaN" if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
              for s, row in VALUES.items()}
    subprocess.run([sys.executable, "-c", WRITER, uri, json.dumps(values), json.dumps({str(s): r for s, r in AGAIN.items()}),
                    json.dumps(PARAMS), str(runs)], env=env, check=True, timeout=180, capture_output=True, cwd=tmp_path)


def check_metrics(con, run_id: int) -> None:
    rows = con.execute("SELECT segment, step, key, value FROM step_metrics WHERE run_id = ?", [run_id]).fetchall()
    stored = {(segment, step, key): value for segment, step, key, value in rows}
    assert len(stored) == len(rows)
    expected = {(0, step, key): value for step, row in VALUES.items() for key, value in row.items()}
    expected.update({(1, step, key): value for step, row in AGAIN.items() for key, value in row.items()})
    assert stored.keys() == expected.keys()
    for key, value in expected.items():
        assert (math.isnan(value) and math.isnan(stored[key])) or stored[key] == value, key


def check_meta(meta: dict) -> None:
    assert (meta["n_sampling"], meta["model"], meta["max_response_len"], meta["n_gpus"]) == (8, "Qwen/Qwen2.5-7B", 4096, 8)
    assert meta["mlflow_params"]["actor_rollout_ref.rollout.n"] == "8"
    assert meta["mlflow_tags"]["purpose"] == "test"


@pytest.fixture(scope="module")
def file_store(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("mlflow")
    write_store(folder, f"file://{folder / 'mlruns'}")
    return folder / "mlruns"


def test_file_store_reads_back_every_value(store, file_store):
    reports = [r for r in ingest_paths(store, [file_store]) if r.status != "skipped"]
    [run_folder] = [p for p in file_store.glob("*/*") if (p / "metrics").is_dir()]
    assert {r.run for r in reports} == {run_folder.name}
    formats = sorted({r.format for r in reports})
    assert formats == ["mlflow-metric", "mlflow-run-file"]
    metric_reports = [r for r in reports if r.format == "mlflow-metric"]
    assert sorted(r.lines for r in metric_reports) == [4, 4, 6]  # timing_s/step logged 4 + 2 times
    assert all(r.rejected == 0 for r in reports)
    [(run_id, framework, meta)] = store.execute("SELECT run_id, framework, meta FROM runs").fetchall()
    check_metrics(store, run_id)
    assert framework == "verl"
    meta = json.loads(meta)
    check_meta(meta)
    assert meta["mlflow_run_name"] == "grpo-0"
    restart = store.execute("SELECT step, step_s, flags FROM steps WHERE segment = 1 ORDER BY step").fetchall()
    assert [row[:2] for row in restart] == [(3, AGAIN[3]["timing_s/step"]), (4, AGAIN[4]["timing_s/step"])]


def test_a_bad_metric_line_is_rejected_alone(store, file_store, tmp_path):
    copy = tmp_path / "mlruns"
    shutil.copytree(file_store, copy)
    [metric_file] = copy.glob("*/*/metrics/timing_s/step")
    with metric_file.open("a") as handle:
        handle.write("1700000000000 not-a-number 5\n1700000000001 1.5 6\n")
    reports = ingest_paths(store, [metric_file])
    [report] = reports
    assert (report.lines, report.stored, report.rejected) == (8, 7, 1)
    [(line_no, code)] = store.execute("SELECT line_no, code FROM ingest_errors").fetchall()
    assert (line_no, code) == (7, "unparsable-line")


@pytest.mark.slow
def test_sqlite_store_reads_back_every_run(store, tmp_path):
    write_store(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}", runs=3)
    [report] = ingest_paths(store, [tmp_path / "mlflow.db"], run_name="mlflowdb")
    assert report.format == "mlflow-sqlite" and report.rejected == 0
    metric_rows, param_rows, tag_rows = 14, len(PARAMS), 5  # tags: purpose and four mlflow.* of each run
    runs = store.execute("SELECT run_id, name, framework, meta FROM runs ORDER BY run_id").fetchall()
    assert [name for _, name, _, _ in runs] == ["mlflowdb", "mlflowdb-grpo-1"]
    assert report.ignored == metric_rows + param_rows + tag_rows  # the deleted third run
    assert report.lines == 3 * (metric_rows + param_rows + tag_rows)
    for run_id, _, framework, meta in runs:
        check_metrics(store, run_id)
        assert framework == "verl"
        check_meta(json.loads(meta))
    assert [json.loads(meta)["mlflow_run_name"] for *_, meta in runs] == ["grpo-0", "grpo-1"]


def test_an_artifact_of_a_file_store_run_belongs_to_the_run(store, file_store, tmp_path):
    copy = tmp_path / "mlruns"
    shutil.copytree(file_store, copy)
    [run_folder] = [p for p in copy.glob("*/*") if (p / "metrics").is_dir()]
    artifact = run_folder / "artifacts" / "logs" / "train.log"
    artifact.parent.mkdir(parents=True)
    artifact.write_text("step:1 - timing_s/step:12.5 - response_length/mean:300.0\n")
    [report] = ingest_paths(store, [artifact])
    assert (report.format, report.run) == ("verl-console", run_folder.name)
