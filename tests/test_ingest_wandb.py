"""wandb run folders (config, summary, tables, console capture) and CSV exports."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from polytrace_cli.cli import app
from polytrace_cli.ingest.driver import ingest_paths

FIXTURES = Path(__file__).parent / "fixtures" / "wandb"
RUN_FOLDER = FIXTURES / "wandb" / "run-20250518_123456-abc123xy"


def _by_name(reports) -> dict:
    return {Path(r.path).name: r for r in reports}


def test_config_yaml_becomes_run_meta_and_names_the_framework(store):
    [report] = ingest_paths(store, [RUN_FOLDER / "files" / "config.yaml"])
    assert report.format == "wandb-config"
    assert (report.lines, report.stored, report.ignored, report.rejected) == (7, 4, 3, 0)
    framework, model, meta = store.execute("SELECT framework, model, meta FROM runs").fetchall()[0]
    assert (framework, model) == ("verl", "Qwen/Qwen2.5-7B-Instruct")
    assert json.loads(meta) == {
        "model": "Qwen/Qwen2.5-7B-Instruct", "n_sampling": 8, "max_response_len": 3072, "max_prompt_len": 1024,
        "algorithm": "grpo", "tp_size": 2, "train_batch_size": 256, "n_gpus": 16, "framework_detected": "verl",
        "wandb_versions": {"cli_version": "0.19.8", "python_version": "3.10.14"},
    }
    assert dict(store.execute("SELECT rule, lines FROM ignored_lines").fetchall()) == {
        "wandb bookkeeping": 2, "config entry not used": 1}


def test_openrlhf_config_gpus_and_framework(store, tmp_path):
    path = tmp_path / "wandb" / "run-1-x" / "files" / "config.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(
        "_wandb:\n  value:\n    cli_version: 0.18.0\n"
        "pretrain:\n  value: meta-llama/Llama-3.1-8B\n"
        "n_samples_per_prompt:\n  value: 4\n"
        "generate_max_len:\n  value: 2048\n"
        "actor_num_nodes:\n  value: 1\nactor_num_gpus_per_node:\n  value: 4\n"
        "vllm_num_engines:\n  value: 2\nvllm_tensor_parallel_size:\n  value: 2\n"
        "advantage_estimator:\n  value: reinforce_baseline\n"
    )
    [report] = ingest_paths(store, [path])
    meta = json.loads(store.execute("SELECT meta FROM runs").fetchall()[0][0])
    assert store.execute("SELECT framework FROM runs").fetchall() == [("openrlhf",)]
    assert {k: meta[k] for k in ("n_sampling", "max_response_len", "n_gpus", "vllm_gpus", "algorithm", "tp_size")} == {
        "n_sampling": 4, "max_response_len": 2048, "n_gpus": 4, "vllm_gpus": 4,
        "algorithm": "reinforce_baseline", "tp_size": 2}
    assert (report.lines, report.stored + report.ignored) == (9, 9)


def test_summary_goes_to_run_meta_not_step_metrics(store):
    [report] = ingest_paths(store, [RUN_FOLDER / "files" / "wandb-summary.json"])
    assert (report.lines, report.stored, report.ignored, report.rejected, report.rows) == (9, 7, 2, 0, 0)
    meta = json.loads(store.execute("SELECT meta FROM runs").fetchall()[0][0])
    assert meta["wandb_summary"] == {"timing_s/step": 61.5, "val-core/openai/gsm8k/reward/mean@1": 0.875,
                                     "actor/pg_loss": "nan", "kl": 0.25}
    assert (meta["wandb_last_step"], meta["wandb_runtime_s"]) == (3, 250.5)
    assert store.execute("SELECT count(*) FROM step_metrics").fetchall() == [(0,)]


def test_cumulative_validation_table_stores_each_row_once(store, tmp_path):
    tables = tmp_path / "run-a" / "files" / "media" / "table"
    shutil.copytree(RUN_FOLDER / "files" / "media" / "table" / "val", tables)
    reports = _by_name(ingest_paths(store, [tmp_path]))
    first, second = reports["generations_1_1a2b3c4d.table.json"], reports["generations_3_9f8e7d6c.table.json"]
    assert (first.lines, first.stored, first.ignored, first.rows) == (1, 1, 0, 2)
    assert (second.lines, second.stored, second.ignored, second.rows) == (2, 1, 1, 1)
    rows = store.execute(
        "SELECT step, prompt_idx, prompt_len, response_len, score, validate, length_estimated FROM samples"
        " ORDER BY step, prompt_idx").fetchall()
    # ceil(len/4): "What is 2+2?" 12 -> 3, "The answer is 4." 16 -> 4, 36 chars -> 9, "11" -> 1,
    # "abcdefgh" 8 -> 2, "abcdefghi" 9 -> 3; the step-3 sample with a null output is not a sample.
    assert rows == [(1, 0, 3, 4, 1.0, False, True), (1, 1, 9, 1, 1.0, False, True), (3, 0, 2, 3, 0.0, False, True)]
    assert store.execute("SELECT count(DISTINCT run_id) FROM samples").fetchall() == [(1,)]


def test_long_table_without_step_column_takes_the_file_name_step(store, tmp_path):
    path = tmp_path / "run-b" / "files" / "media" / "table" / "val_samples_7_0abc.table.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"columns": ["prompt", "response", "score"],
                                "data": [["abcd", "abcdefgh", 1], ["a", "ab", 0], ["only one cell"]]}))
    [report] = ingest_paths(store, [path])
    assert (report.lines, report.stored, report.rejected) == (3, 2, 1)
    assert store.execute("SELECT step, prompt_idx, prompt_len, response_len, score, validate FROM samples"
                         " ORDER BY prompt_idx").fetchall() == [(7, 0, 1, 2, 1.0, True), (7, 1, 1, 1, 0.0, True)]
    assert store.execute("SELECT line_no, reason FROM ingest_errors").fetchall() == [
        (3, "row does not have the table's 3 columns")]


def test_run_folder_files_land_in_one_run(store, tmp_path):
    folder = tmp_path / "wandb" / "run-20250518_123456-abc123xy"
    shutil.copytree(RUN_FOLDER, folder)
    # Tables logged under a key without a slash sit directly in media/table.
    flat = folder / "files" / "media" / "table"
    for path in (flat / "val").iterdir():
        path.rename(flat / path.name)
    (flat / "val").rmdir()
    reports = ingest_paths(store, [tmp_path])
    assert {r.format for r in reports} == {"wandb-config", "wandb-summary", "wandb-table", "verl-console"}
    assert {r.run for r in reports} == {"run-20250518_123456-abc123xy"}
    assert store.execute("SELECT count(*) FROM runs").fetchall() == [(1,)]
    assert store.execute("SELECT step, gen_s, step_s FROM steps ORDER BY step").fetchall() == [
        (1, 30.0, 60.0), (2, 31.0, 62.0)]


def test_tables_under_a_key_folder_land_in_the_run(store):
    reports = ingest_paths(store, [FIXTURES])
    by_format = {}
    for report in reports:
        by_format.setdefault(report.format, set()).add(report.run)
    # media/table/val/*.table.json belong to the run folder, not to a run named `val`.
    assert by_format["wandb-table"] == {"run-20250518_123456-abc123xy"}
    assert by_format["verl-console"] == {"run-20250518_123456-abc123xy"}
    assert by_format["wandb-csv"] == {"fixtures"}  # the CSV export beside the folder is its own source
    assert store.execute("SELECT name FROM runs ORDER BY name").fetchall() == [
        ("fixtures",), ("run-20250518_123456-abc123xy",)]
    assert store.execute(
        "SELECT count(*) FROM samples JOIN runs USING (run_id) WHERE name = 'run-20250518_123456-abc123xy'"
    ).fetchall()[0][0] > 0


def test_cli_ingests_the_whole_folder(tmp_path):
    result = CliRunner().invoke(app, ["ingest", str(FIXTURES), "--db", str(tmp_path / "s.duckdb"), "--json"])
    assert result.exit_code == 0, result.output
    formats = sorted(r["format"] for r in json.loads(result.stdout))
    assert formats == ["verl-console", "wandb-config", "wandb-csv", "wandb-summary", "wandb-table", "wandb-table"]


def test_csv_export_plain_values_missing_cells_and_restart(store):
    path = FIXTURES / "wandb_export.csv"
    [report] = ingest_paths(store, [path])
    assert report.format == "wandb-csv"
    # header + 5 rows: rows 1, 2 and the last store values, row 3 is empty, row "x" is rejected.
    assert (report.lines, report.stored, report.ignored, report.rejected) == (6, 3, 2, 1)
    rows = store.execute(
        "SELECT segment, step, key, value, line_no FROM step_metrics ORDER BY line_no, key").fetchall()
    assert [r[:3] for r in rows] == [
        (0, 1, "kl"), (0, 1, "timing_s/gen"), (0, 1, "timing_s/step"),
        (0, 2, "timing_s/gen"),
        (1, 2, "kl"), (1, 2, "timing_s/step"),
    ]
    assert [r[3] for r in rows][:5] == [0.01, 30.0, 60.5, 31.25, rows[4][3]] and rows[5][3] == 70.0
    assert rows[4][3] != rows[4][3]  # NaN
    assert [r[4] for r in rows] == [2, 2, 2, 3, 6, 6]
    assert store.execute("SELECT line_no, reason FROM ingest_errors").fetchall() == [
        (5, "Step is not an integer: 'x'")]
    meta = json.loads(store.execute("SELECT meta FROM runs").fetchall()[0][0])
    assert meta["wandb_run_name"] == "grpo-7b"


def test_csv_export_with_several_runs_is_rejected_naming_them(store, tmp_path):
    path = tmp_path / "panel.csv"
    path.write_text('"Step","a - reward","a - reward__MIN","b - reward"\n"1","0.5","0.5","0.6"\n')
    [report] = ingest_paths(store, [path])
    assert report.status == "rejected"
    assert report.message == "the export holds 2 runs (a, b); export one run per file"
