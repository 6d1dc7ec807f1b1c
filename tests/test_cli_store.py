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


def test_query_cannot_reach_outside_the_store(tmp_path):
    db = _ingested_store(tmp_path)
    outside = tmp_path / "outside.csv"
    outside.write_text("secret\n1\n")
    written = tmp_path / "written.csv"
    for sql in (f"select * from read_csv('{outside}')", f"select * from '{outside}'",
                f"copy (select 1) to '{written}'", f"attach '{tmp_path / 'other.duckdb'}' as other",
                "install httpfs", "load httpfs", "set enable_external_access = true",
                f"select * from glob('{tmp_path}/*')", "select 1; select 2"):
        result = runner.invoke(app, ["query", sql, "--db", str(db)])
        assert result.exit_code == 2, (sql, result.output)
        assert "error:" in result.output and "Traceback" not in result.output and "secret" not in result.output
    assert not written.exists() and not (tmp_path / "other.duckdb").exists()
    from polytrace_cli.store import open_store
    from polytrace_cli.store.sql import confine

    con = confine(open_store(db, read_only=True))
    try:
        for setting in ("enable_external_access", "autoinstall_known_extensions", "autoload_known_extensions"):
            assert con.execute(f"SELECT current_setting('{setting}')").fetchall() == [(False,)]
        assert con.execute("SELECT current_setting('lock_configuration')").fetchall() == [(True,)]
    finally:
        con.close()


UNUSUAL = ("select [1, 2] as l, {'a': 1, 'b': [1.5, 'nan'::double]} as s, map([1], ['x']) as m, "
           "'\\x00ab'::blob as b, date '2020-01-02' as d, interval 3 day as i, 'nan'::double as n, "
           "'[/opt/x] :x: [bold]' as t, true as flag")


def test_query_prints_nested_and_unusual_types_in_every_output(tmp_path):
    db = _ingested_store(tmp_path)
    table = runner.invoke(app, ["query", UNUSUAL, "--db", str(db)])
    assert table.exit_code == 0, table.output
    for text in ("[1, 2]", '{"1": "x"}', "\\x00ab", "2020-01-02", "3 days", "nan", "[/opt/x] :x: [bold]"):
        assert text in table.output, text
    rows = list(csv.reader(io.StringIO(runner.invoke(app, ["query", UNUSUAL, "--db", str(db), "--csv"]).stdout)))
    assert rows == [["l", "s", "m", "b", "d", "i", "n", "t", "flag"],
                    ["[1, 2]", '{"a": 1, "b": [1.5, "NaN"]}', '{"1": "x"}', "\\x00ab", "2020-01-02",
                     "3 days, 0:00:00", "nan", "[/opt/x] :x: [bold]", "true"]]
    [record] = json.loads(runner.invoke(app, ["query", UNUSUAL, "--db", str(db), "--json"]).stdout)
    assert record == {"l": [1, 2], "s": {"a": 1, "b": [1.5, "NaN"]}, "m": {"1": "x"}, "b": "\\x00ab",
                      "d": "2020-01-02", "i": "3 days, 0:00:00", "n": "NaN", "t": "[/opt/x] :x: [bold]",
                      "flag": True}


def test_data_is_never_read_as_markup(tmp_path):
    folder = tmp_path / "[bold]run"
    folder.mkdir()
    crash = "[/opt/conda/lib/python3.10] crashed :x: [bold]"
    (folder / "packed_lengths_step_0.jsonl").write_text(GOOD % 0 + crash + "\n")
    db = tmp_path / "s.duckdb"
    ingested = runner.invoke(app, ["ingest", str(folder), "--db", str(db)])
    assert ingested.exit_code == 0, ingested.output
    assert "[bold]run" in ingested.output
    shown = runner.invoke(app, ["errors", "--db", str(db)])
    assert shown.exit_code == 0, shown.output
    assert crash in shown.output.replace("\n", "") or "[/opt/conda/lib/python3.10]" in shown.output
    runs = runner.invoke(app, ["runs", "--db", str(db)])
    assert runs.exit_code == 0 and "[bold]run" in runs.output
    missing = runner.invoke(app, ["errors", "[/nope]", "--db", str(db)])
    assert missing.exit_code == 2 and "no run named [/nope]" in missing.output
    checked = runner.invoke(app, ["check", "[bold]run", "--max-p99-p50", "9", "--db", str(db)])
    assert checked.exit_code == 0, checked.output
    assert "check [bold]run" in checked.output


def test_a_named_command_runs_from_an_app_holding_it_alone_and_answers_as_the_whole_app(tmp_path):
    """The console script builds only the command it is asked for; its help, its errors and its run
    are those of the app holding every command."""
    from polytrace_cli.cli import COMMANDS, _app_for

    assert _app_for([]) is app and _app_for(["--version"]) is app and _app_for(["nosuch"]) is app
    for argv in (["ingest", "--help"], ["analyze", "--help"], ["ingest"], ["runs", "--db", str(tmp_path / "none.duckdb")]):
        single = _app_for(argv)
        assert single is not app
        alone, whole = runner.invoke(single, argv), runner.invoke(app, argv)
        assert (alone.exit_code, alone.output) == (whole.exit_code, whole.output)
    assert len(COMMANDS) > 20
    folder = tmp_path / "myrun"
    folder.mkdir()
    (folder / "packed_lengths_step_0.jsonl").write_text(GOOD % 0 + GOOD % 1)
    done = subprocess.run([sys.executable, "-m", "polytrace_cli.cli", "ingest", str(folder), "--db",
                           str(tmp_path / "s.duckdb"), "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [(r["status"], r["stored"], r["rows"]) for r in json.loads(done.stdout)] == [("ingested", 2, 6)]
