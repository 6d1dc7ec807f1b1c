"""The command line end to end: ingest, runs, query, errors, formats, synth, demo."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from polytrace_cli.cli import app

runner = CliRunner()
GOOD = ('{"step": %d, "rank": 0, "dp_rank": 0, "tp_rank": 0, "local_index": 0, "input": 10, "output": [5, 6, 7], '
        '"n_sampling": 3, "validate": false}\n')


def _ingested_store(tmp_path: Path) -> Path:
    folder = tmp_path / "myrun"
    folder.mkdir()
    for step in range(2):
        (folder / f"packed_lengths_step_{step}.jsonl").write_text(GOOD % step)
    db = tmp_path / "s.duckdb"
    result = runner.invoke(app, ["ingest", str(folder), "--db", str(db), "--task", "math"])
    assert result.exit_code == 0, result.output
    return db


def test_ingest_json_reports_every_file(tmp_path):
    folder = tmp_path / "r"
    folder.mkdir()
    (folder / "packed_lengths_step_0.jsonl").write_text(GOOD % 0)
    result = runner.invoke(app, ["ingest", str(folder), "--db", str(tmp_path / "s.duckdb"), "--json", "--run", "named"])
    assert result.exit_code == 0
    [report] = json.loads(result.stdout)
    assert (report["status"], report["run"], report["rows"], report["lines"]) == ("ingested", "named", 3, 1)


def test_runs_lists_counts(tmp_path):
    db = _ingested_store(tmp_path)
    result = runner.invoke(app, ["runs", "--db", str(db), "--json"])
    [run] = json.loads(result.stdout)
    assert (run["run"], run["task"], run["files"], run["samples"], run["steps"]) == ("myrun", "math", 2, 6, 2)
    assert (run["first_step"], run["last_step"], run["segments"]) == (0, 1, None)


def test_query_outputs_table_json_and_csv(tmp_path):
    db = _ingested_store(tmp_path)
    sql = "select step, sum(response_len) as tokens from samples group by step order by step"
    as_json = json.loads(runner.invoke(app, ["query", sql, "--db", str(db), "--json"]).stdout)
    assert as_json == [{"step": 0, "tokens": 18}, {"step": 1, "tokens": 18}]
    rows = list(csv.reader(io.StringIO(runner.invoke(app, ["query", sql, "--db", str(db), "--csv"]).stdout)))
    assert rows == [["step", "tokens"], ["0", "18"], ["1", "18"]]
    assert "tokens" in runner.invoke(app, ["query", sql, "--db", str(db)]).stdout


def test_query_is_read_only_and_bad_sql_is_one_line(tmp_path):
    db = _ingested_store(tmp_path)
    for sql in ("drop table samples", "insert into runs (run_id, name) values (99, 'x')", "selec nonsense"):
        result = runner.invoke(app, ["query", sql, "--db", str(db)])
        assert result.exit_code == 2, sql
        assert "error:" in result.output and "Traceback" not in result.output
    assert json.loads(runner.invoke(app, ["query", "select count(*) n from samples", "--db", str(db), "--json"]).stdout) == [{"n": 6}]


def test_errors_shows_quarantined_lines(tmp_path):
    folder = tmp_path / "r"
    folder.mkdir()
    (folder / "packed_lengths_step_0.jsonl").write_text(GOOD % 0 + "oops\n")
    db = tmp_path / "s.duckdb"
    runner.invoke(app, ["ingest", str(folder), "--db", str(db)])
    [row] = json.loads(runner.invoke(app, ["errors", "--db", str(db), "--json"]).stdout)
    assert (row["line"], row["raw"]) == (2, "oops\n")
    assert row["reason"].startswith("not JSON")
    assert row["code"] == "invalid-json"
    table = runner.invoke(app, ["errors", "--db", str(db)]).stdout
    assert "invalid-json" in table


def test_unknown_run_and_missing_store_are_one_line_errors(tmp_path):
    missing = runner.invoke(app, ["runs", "--db", str(tmp_path / "none.duckdb")])
    assert missing.exit_code == 2 and "polytrace ingest" in missing.output
    db = _ingested_store(tmp_path)
    unknown = runner.invoke(app, ["errors", "nosuchrun", "--db", str(db)])
    assert unknown.exit_code == 2 and "no run named nosuchrun" in unknown.output


def test_formats_lists_the_trace_ingesters():
    result = runner.invoke(app, ["formats"])
    for name in ("polytrace-packed", "polytrace-reward", "polytrace-dapo-filter", "polytrace-multiturn", "polytrace-dataset"):
        assert name in result.stdout


def test_console_script_runs_as_a_process(tmp_path):
    db = _ingested_store(tmp_path)
    result = subprocess.run([sys.executable, "-m", "polytrace_cli.cli", "runs", "--db", str(db), "--csv"],
                            capture_output=True, text=True)
    assert result.returncode == 0
    assert result.stdout.splitlines()[1].startswith("myrun,polytrace,math,2,")
