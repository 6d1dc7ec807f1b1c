"""The command line for daily use: steps, rm, rename, --wait, flag spellings and tables that fit the terminal."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from polytrace_cli.cli import app
from polytrace_cli.commands import common
from polytrace_cli.commands.tables import cell, fit_columns, print_item, print_table
from polytrace_cli.display import column_cells
from polytrace_cli.store import open_store
from tests.conftest import PROJECT_ROOT, copy_store

runner = CliRunner()
GROUP = ('{"step": %d, "rank": %d, "dp_rank": %d, "tp_rank": 0, "local_index": 0, "input": %d, "output": %s, '
         '"n_sampling": 3, "validate": false}\n')


def _invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def _write_run(folder: Path, steps: int = 3) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for step in range(steps):
        (folder / f"packed_lengths_step_{step}.jsonl").write_text(
            GROUP % (step, 0, 0, 10, "[5, 6, 7]") + GROUP % (step, 1, 1, 20, f"[{step + 1}, 2, 3]"))
    return folder


@pytest.fixture(scope="module")
def two_runs_once(tmp_path_factory) -> Path:
    """A store of runs alpha and beta ingested from the folders of those names beside it, built once."""
    root = tmp_path_factory.mktemp("two-runs")
    db = root / "s.duckdb"
    for name in ("alpha", "beta"):
        result = _invoke("ingest", _write_run(root / name), "--db", db)
        assert result.exit_code == 0, result.output
    return db


@pytest.fixture
def two_runs(two_runs_once, tmp_path) -> Path:
    """A copy of the two-run store for one test."""
    return copy_store(two_runs_once, tmp_path / "s.duckdb")


def _table_counts(db: Path) -> dict[str, dict[int, int]]:
    """Rows per run id in every base table keyed by run_id or file_id."""
    con = open_store(db, read_only=True)
    try:
        counts = {}
        tables = con.execute("SELECT table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE'").fetchall()
        for (table,) in tables:
            columns = {c[0] for c in con.execute(f'DESCRIBE "{table}"').fetchall()}
            if "run_id" in columns:
                rows = con.execute(f'SELECT run_id, count(*) FROM "{table}" GROUP BY run_id').fetchall()
            elif "file_id" in columns:
                rows = con.execute(f'SELECT f.run_id, count(*) FROM "{table}" t JOIN files f USING (file_id) GROUP BY 1').fetchall()
            else:
                continue
            counts[table] = dict(rows)
        return counts
    finally:
        con.close()


# --- steps --------------------------------------------------------------------------------------

def test_steps_json_csv_and_table(two_runs):
    result = _invoke("steps", "alpha", "--db", two_runs, "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["step"] for r in rows] == [0, 1, 2]
    # Step 0: rank 0 holds 5,6,7 with prompt 10 (48 tokens), rank 1 holds 1,2,3 with prompt 20 (66 tokens).
    assert rows[0]["tokens"] == 114 and rows[0]["lambda_tokens"] == pytest.approx(66 / 57)
    assert rows[0]["lambda_makespan"] == pytest.approx(7 / 5)
    assert "expected_step_s" in rows[0] and "top_cause" in rows[0]
    ranged = json.loads(_invoke("steps", "alpha", "--db", two_runs, "--steps", "1:2", "--json").stdout)
    assert [r["step"] for r in ranged] == [1, 2]
    table = list(csv.DictReader(io.StringIO(_invoke("steps", "alpha", "--db", two_runs, "--csv").stdout)))
    assert [r["step"] for r in table] == ["0", "1", "2"] and table[0]["tokens"] == "114.0"
    shown = _invoke("steps", "alpha", "--db", two_runs)
    assert shown.exit_code == 0 and "lambda" in shown.stdout and "1.158" in shown.stdout


def test_steps_errors_are_one_line(two_runs):
    for args, needle in [(("steps", "nope"), "no run named nope"), (("steps", "alpha", "--steps", "x"), "--steps"),
                         (("steps", "alpha", "--json", "--csv"), "choose one")]:
        result = _invoke(*args, "--db", two_runs)
        assert result.exit_code == 2 and needle in result.output and "Traceback" not in result.output


# --- rm and rename ------------------------------------------------------------------------------

def test_rm_deletes_every_row_of_the_run_and_a_reingest_reads_it_again(two_runs, two_runs_once):
    before = _table_counts(two_runs)
    alpha_id, beta_id = 1, 2
    assert before["sample_groups"][alpha_id] == 6 and before["files"][alpha_id] == 3
    result = _invoke("rm", "alpha", "--db", two_runs, "--csv")
    assert result.exit_code == 0, result.output
    removed = {(r["table"]): int(r["rows"]) for r in csv.DictReader(io.StringIO(result.stdout)) if r["run"] == "alpha"}
    assert removed == {"files": 3, "sample_groups": 6, "file_run_meta": 3, "run_semantics": 1, "runs": 1}
    after = _table_counts(two_runs)
    assert all(alpha_id not in per_run for per_run in after.values())
    assert all(after[table].get(beta_id) == rows.get(beta_id) for table, rows in before.items())
    again = json.loads(_invoke("ingest", two_runs_once.parent / "alpha", "--db", two_runs, "--json").stdout)
    assert {r["status"] for r in again} == {"ingested"}
    runs = {r["run"]: r for r in json.loads(_invoke("runs", "--db", two_runs, "--json").stdout)}
    assert runs["alpha"]["samples"] == 18


def test_rm_of_an_unknown_run_removes_nothing(two_runs):
    before = _table_counts(two_runs)
    result = _invoke("rm", "beta", "nope", "--db", two_runs)
    assert result.exit_code == 2 and "no run named nope" in result.output
    assert _table_counts(two_runs) == before


def test_rm_counts_the_step_facts_apart_from_the_runs_data(demo_run, tmp_path):
    _, folder = demo_run
    db = copy_store(folder / "logs" / "demo.duckdb", tmp_path / "demo.duckdb")
    con = open_store(db, read_only=True)
    run = con.execute("SELECT name FROM runs WHERE framework = 'verl'").fetchall()[0][0]
    facts = con.execute("SELECT (SELECT count(*) FROM step_facts JOIN runs USING (run_id) WHERE name = ?)"
                        " + (SELECT count(*) FROM step_facts_files JOIN runs USING (run_id) WHERE name = ?)",
                        [run, run]).fetchone()[0]
    metrics = con.execute("SELECT count(*) FROM step_metrics JOIN runs USING (run_id) WHERE name = ?",
                          [run]).fetchone()[0]
    con.close()
    assert facts > 0
    result = _invoke("rm", run, "--db", db)
    assert result.exit_code == 0, result.output
    line = " ".join(result.stdout.split())
    assert f"step_metrics {cell(metrics)}" in line and "step_facts " not in line
    assert line.endswith(f"and {cell(facts)} rows of step facts kept from them")


def test_rename_keeps_the_rows_under_the_new_name(two_runs):
    result = _invoke("rename", "alpha", "gamma", "--db", two_runs)
    assert result.exit_code == 0, result.output
    runs = {r["run"]: r for r in json.loads(_invoke("runs", "--db", two_runs, "--json").stdout)}
    assert set(runs) == {"gamma", "beta"} and runs["gamma"]["samples"] == 18
    assert json.loads(_invoke("steps", "gamma", "--db", two_runs, "--json").stdout)[0]["tokens"] == 114
    taken = _invoke("rename", "gamma", "beta", "--db", two_runs)
    assert taken.exit_code == 2 and "already exists" in taken.output
    missing = _invoke("rename", "alpha", "delta", "--db", two_runs)
    assert missing.exit_code == 2 and "no run named alpha" in missing.output


# --- --wait -------------------------------------------------------------------------------------

HOLDER = """
import sys, duckdb
con = duckdb.connect(sys.argv[1])
con.execute("CREATE TABLE IF NOT EXISTS holder_probe (x INTEGER)")
print("holding", flush=True)
sys.stdin.readline()  # held until the test lets go (or closes stdin)
con.close()
"""


def _cli(*args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    return subprocess.run([sys.executable, "-m", "polytrace_cli.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=120)


def _hold(db: Path) -> subprocess.Popen:
    """A process holding the store's write lock until `_release(holder)`."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout.readline().strip() == "holding"
    return holder


def _release(holder: subprocess.Popen) -> None:
    holder.stdin.close()
    holder.wait(timeout=60)


def test_wait_outlasts_a_writer_holding_the_store(two_runs):
    """The lock is let go only once the waiting command has said that it waits: it found the store
    locked, and answers once the lock is free, however slow the machine."""
    holder = _hold(two_runs)
    try:
        locked = _cli("runs", "--db", two_runs)
        assert locked.returncode == 2 and "locked" in locked.stderr and len(locked.stderr.strip().splitlines()) == 1
        env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
        waiting = subprocess.Popen([sys.executable, "-m", "polytrace_cli.cli", "runs", "--db", str(two_runs),
                                    "--wait", "120", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, env=env)
        notice = waiting.stderr.readline()
        assert "is locked by another process; waiting up to 120 s" in notice
        _release(holder)
        out, err = waiting.communicate(timeout=120)
        assert waiting.returncode == 0, err
        assert {r["run"] for r in json.loads(out)} == {"alpha", "beta"}
    finally:
        if holder.poll() is None:
            _release(holder)


def test_wait_gives_up_with_the_locked_error(two_runs):
    holder = _hold(two_runs)
    try:
        started = time.monotonic()
        result = _cli("rm", "alpha", "--db", two_runs, "--wait", 0.5)
        assert result.returncode == 2 and "locked" in result.stderr and "Traceback" not in result.stderr
        assert time.monotonic() - started >= 0.5  # it waited its half second before giving up
    finally:
        _release(holder)  # what it holds is this test's copy


# --- one meaning per flag -----------------------------------------------------------------------

def test_renamed_flags_refuse_the_old_spelling_clearly(two_runs, tmp_path):
    old_synth = _invoke("synth", "--task", "math", "--out", tmp_path / "w", "--steps", 2)
    assert old_synth.exit_code == 2 and "--num-steps" in old_synth.output and not (tmp_path / "w").exists()
    old_fit = _invoke("fit", "alpha", "--out", tmp_path / "alpha.params.json", "--db", two_runs)
    assert old_fit.exit_code == 2 and "--output" in old_fit.output
    assert not (tmp_path / "alpha.params.json").exists()
    both = _invoke("fit", "alpha", "--out", tmp_path / "f", "--output", tmp_path / "x.json", "--db", two_runs)
    assert both.exit_code == 2 and "not both" in both.output


def test_fit_out_is_a_folder_and_output_a_file(two_runs, tmp_path):
    pytest.importorskip("polytrace_cli.analyze.fit")
    # A fit needs 20 lengths: eight steps of six responses, less those at the evident cap.
    assert _invoke("ingest", _write_run(tmp_path / "longer", steps=8), "--db", two_runs).exit_code == 0
    folder = _invoke("fit", "longer", "--out", tmp_path / "fits", "--db", two_runs)
    assert folder.exit_code == 0, folder.output
    assert json.loads((tmp_path / "fits" / "longer.params.json").read_text())["format"] == "polytrace-params/1"
    assert "params" not in folder.stdout.split("┃")  # no raw parameter column in the table
    as_csv = _invoke("fit", "longer", "--output", tmp_path / "a.json", "--db", two_runs, "--csv")
    header = next(csv.reader(io.StringIO(as_csv.stdout)))
    assert header == ["kind", "family", "KS", "AIC", "best", "sampled"] and (tmp_path / "a.json").exists()


def test_version_and_short_help():
    from polytrace_cli import __version__

    assert _invoke("--version").stdout.strip() == __version__
    short, long = _invoke("-h"), _invoke("--help")
    assert short.exit_code == 0 and short.stdout == long.stdout and "steps" in short.stdout
    assert _invoke("rm", "-h").exit_code == 0


def test_the_command_list_breaks_no_description_mid_sentence():
    """On a terminal wide enough for every description, each command takes one line of the list."""
    from polytrace_cli.cli import COMMANDS

    listing = runner.invoke(app, ["--help"], env={"COLUMNS": "400"}).stdout
    panel = listing[listing.index("Commands"):]
    rows = [line.strip("│ ") for line in panel.splitlines()[1:] if line.startswith("│")]
    assert [row.split()[0] for row in rows] == list(COMMANDS)
    steps_row = next(row for row in rows if row.startswith("steps "))
    assert "clip ratio, tokens, DP load λ" in steps_row


def test_the_command_runs_one_blas_thread_unless_the_user_says_otherwise(monkeypatch):
    from polytrace_cli import cli

    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "3")
    cli._one_blas_thread()
    assert os.environ["OPENBLAS_NUM_THREADS"] == "1" and os.environ["MKL_NUM_THREADS"] == "3"


def test_the_command_sets_polars_allocator_options_unless_the_user_did(monkeypatch):
    from polytrace_cli import cli

    monkeypatch.delenv("_RJEM_MALLOC_CONF", raising=False)
    cli._compact_polars_allocator()
    assert os.environ["_RJEM_MALLOC_CONF"] == cli.POLARS_ALLOCATOR
    monkeypatch.setenv("_RJEM_MALLOC_CONF", "narenas:4")
    cli._compact_polars_allocator()
    assert os.environ["_RJEM_MALLOC_CONF"] == "narenas:4"


def test_json_and_csv_wherever_there_is_output(two_runs):
    assert json.loads(_invoke("formats", "--json").stdout)[0]["format"]
    assert next(csv.reader(io.StringIO(_invoke("formats", "--csv").stdout))) == ["format", "framework", "reads"]
    verdict = _invoke("check", "alpha", "--max-imbalance", "2", "--db", two_runs, "--csv")
    assert verdict.exit_code == 0 and verdict.stdout.startswith("threshold,limit,measured,status")


# --- tables that fit ----------------------------------------------------------------------------

def test_cell_prints_numbers_and_booleans_one_way():
    assert [cell(v) for v in (None, True, False, 12345, 0.1234, 12345.6, 2.5e-5, 3e7, float("nan"), float("inf"))] == \
        ["—", "yes", "no", "12,345", "0.123", "12,346", "2.5e-05", "3e+07", "nan", "∞"]


def _body_lines(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("┡"))
    end = next(i for i, line in enumerate(lines) if line.startswith("└"))
    return lines[start + 1:end]


@pytest.mark.parametrize("width", [80, 120])
def test_analyze_tables_fit_the_width_without_wrapping_a_cell(two_runs, monkeypatch, width):
    buffer = io.StringIO()
    monkeypatch.setattr(common, "console", Console(file=buffer, width=width, color_system=None))
    result = _invoke("analyze", "--db", two_runs, "--only", "lengths,longtail,imbalance,drift")
    assert result.exit_code == 0, result.output
    text = buffer.getvalue()
    assert text.count("┡") == 4
    assert max(len(line) for line in text.splitlines()) <= width
    # One line per row: no cell broke onto a second line.
    for block in text.split("┏")[1:]:
        body = _body_lines("┏" + block)
        assert all(line.startswith("│") for line in body)
    lengths = _body_lines(text.split("┏")[1])
    assert len(lengths) == 6  # 2 runs × prompt, response, total


@pytest.mark.parametrize("width", [80, 120])
def test_every_kept_number_appears_whole(width):
    columns = ["run", "kind", *[f"statistic_{i}" for i in range(12)]]
    rows = [("run-with-a-long-name", "response", *[123456.789 * (i + 1) for i in range(12)])]
    buffer = io.StringIO()
    print_table(Console(file=buffer, width=width, color_system=None), columns, rows, set(columns[2:]),
                identity=["run", "kind"])
    text = buffer.getvalue()
    fitted = fit_columns(columns, rows, width, ["run", "kind"])
    assert 2 < len(fitted.columns) < len(columns)
    [line] = _body_lines(text)
    for value in fitted.rows[0]:
        assert value in line
    assert f"{len(fitted.left_out)} more column(s)" in text


def test_compare_is_one_narrow_table_per_analysis(two_runs, monkeypatch):
    buffer = io.StringIO()
    monkeypatch.setattr(common, "console", Console(file=buffer, width=80, color_system=None))
    result = _invoke("compare", "alpha", "beta", "--db", two_runs, "--only", "lengths,imbalance")
    assert result.exit_code == 0, result.output
    text = buffer.getvalue()
    assert text.count("┡") == 2 and max(len(line) for line in text.splitlines()) <= 80
    assert "mean_tokens [kind=response]" in text  # keys stay as written, not read as markup


def test_wide_prints_every_column_whole(two_runs, monkeypatch):
    buffer = io.StringIO()
    monkeypatch.setattr(common, "console", Console(file=buffer, width=80, color_system=None))
    result = _invoke("analyze", "--db", two_runs, "--only", "lengths", "--wide")
    assert result.exit_code == 0, result.output
    text = buffer.getvalue()
    assert "more column" not in text and "spearman" in text and "kurtosis" in text
    assert max(len(line) for line in text.splitlines()) > 80
    assert len(_body_lines(text)) == 6


def test_a_columns_floats_share_the_decimals_of_its_median_value():
    # Median 5,078 (between 501.688 and 9,654.957): 4 significant digits there is no decimal.
    assert column_cells([501.688, 10234.0, 143.41, 9654.957, None]) == ["502", "10,234", "143", "9,655", "—"]
    # Median 755 (between 501.688 and 1,010.38): 1 decimal.
    assert column_cells([501.688, 10234.0, 143.41, 1010.38]) == ["501.7", "10,234.0", "143.4", "1,010.4"]
    # Median 16.16: 2 decimals; 0.2999 would keep 2 significant digits at 2 decimals, so it is shown on its own.
    assert column_cells([425.489, 7.13, 16.14, 16.18, 0.2999]) == ["425.49", "7.13", "16.14", "16.18", "0.3"]
    # At 3 decimals (the most) small values keep the column's decimals; zeros too; below 0.001 stays scientific.
    assert column_cells([0.128, 0.03, 0.0, 0.00058]) == ["0.128", "0.030", "0.000", "0.00058"]
    # Thousands: 12.34 would be "12", so it keeps its own digits; nan, ∞ and integers are as `cell` writes them.
    assert column_cells([5000.0, 4000.0, 12.34, float("nan"), float("inf")]) == ["5,000", "4,000", "12.34", "nan", "∞"]
    assert column_cells([1, 22, 333]) == ["1", "22", "333"] and column_cells(["a", None]) == ["a", "—"]
    assert column_cells([-0.0, 881.008, 519.971]) == ["0.0", "881.0", "520.0"]
    # Whole numbers held as floats (counts in a frame of floats) print as whole numbers.
    assert column_cells([6.0, 5.0, -1.0, None]) == ["6", "5", "-1", "—"]
    # Values already rounded (to 1 decimal here) get no decimals they do not have.
    assert column_cells([2.7, 1.5, 0.0]) == ["2.7", "1.5", "0.0"]
    assert column_cells([2.75, 1.5]) == ["2.75", "1.50"]


def test_a_narrow_table_lines_up_each_columns_decimals():
    rows = [("a", 881.008), ("b", 519.971), ("c", 503.04)]
    fitted = fit_columns(["run", "step_s"], rows, 80, ["run"])
    assert [row[1] for row in fitted.rows] == ["881.0", "520.0", "503.0"]
    # compare's rows are quantities (one metric of two runs and their delta): a row's numbers share decimals.
    rows = [("count", 2304.0, 640.0, -1664.0), ("cv", 0.454, 0.616, 0.162), ("mean", 143.41, 501.688, 358.278)]
    fitted = fit_columns(["metric", "a", "b", "delta"], rows, 80, ["metric"], shared_decimals="row")
    assert fitted.rows == [["count", "2,304", "640", "-1,664"], ["cv", "0.454", "0.616", "0.162"],
                           ["mean", "143.4", "501.7", "358.3"]]


def test_a_list_item_wraps_under_its_first_word_and_keeps_numbers_with_units():
    text = "batches with more tokens than usual slowed 2 steps by 68 s, under 0.1% of the run [kind=x]"
    # A width at which plain wrapping would end a line with "68" and start the next with "s,".
    width = next(w for w in range(30, 90) if any(line.endswith(" 68") for line in textwrap.wrap(
        text, w, initial_indent="- ", subsequent_indent="  ")))
    buffer = io.StringIO()
    print_item(Console(file=buffer, width=width, color_system=None), text)
    lines = buffer.getvalue().splitlines()
    assert len(lines) > 1 and lines[0].startswith("- batches") and all(line.startswith("  ") for line in lines[1:])
    assert max(len(line) for line in lines) <= width
    assert " ".join(line[2:] for line in lines) == text  # nothing lost; markup-like text kept as written
    assert not any(line.endswith(" 68") for line in lines)


def test_a_narrow_runs_table_keeps_the_step_range_before_the_formats(two_runs, monkeypatch):
    buffer = io.StringIO()
    monkeypatch.setattr(common, "console", Console(file=buffer, width=100, color_system=None))
    result = _invoke("runs", "--db", two_runs)
    assert result.exit_code == 0, result.output
    header = " ".join(line for line in buffer.getvalue().splitlines() if line.startswith("┃"))
    assert "last" in header and "steps" in header
    assert "formats" not in header and buffer.getvalue().rstrip().endswith("formats")


def test_errors_says_when_nothing_was_rejected_and_how_many_it_left_out(two_runs, tmp_path, monkeypatch):
    from polytrace_cli.commands import store as store_commands

    buffer = io.StringIO()
    for module in (common, store_commands):
        monkeypatch.setattr(module, "console", Console(file=buffer, width=100, color_system=None))
    assert _invoke("errors", "--db", two_runs).exit_code == 0
    assert buffer.getvalue().strip() == "no rejected lines in the store"
    dirty = tmp_path / "a-folder-with-a-rather-long-name" / "dirty"
    dirty.mkdir(parents=True)
    (dirty / "packed_lengths_step_0.jsonl").write_text(GROUP % (0, 0, 0, 10, "[5, 6, 7]") + "not json\n{\"step\": 0\nxx\n")
    assert _invoke("ingest", dirty, "--db", two_runs, "--run", "dirty").exit_code == 0
    buffer.truncate(0), buffer.seek(0)
    assert _invoke("errors", "--db", two_runs, "--limit", "2").exit_code == 0
    text = buffer.getvalue()
    rows = _body_lines(text)
    assert len(rows) == 2  # one line per rejected line: the raw text's line break does not open a second
    assert all("…" in row and "packed_lengths_step_0.jsonl" in row for row in rows)  # the path keeps its file name
    assert "2 of 3 rejected lines in the store shown" in text
    assert len(json.loads(_invoke("errors", "dirty", "--db", two_runs, "--json").stdout)) == 3


def test_ingest_of_a_folder_without_files_is_one_error_line(tmp_path):
    (tmp_path / "empty").mkdir()
    result = _invoke("ingest", tmp_path / "empty", "--db", tmp_path / "s.duckdb")
    assert result.exit_code == 1
    assert "0 file(s)" not in result.output and "no files found under the given paths" in result.output


def test_ingest_of_a_missing_path_is_its_error_line_not_a_table_row(tmp_path):
    result = _invoke("ingest", tmp_path / "missing", _write_run(tmp_path / "alpha"), "--db", tmp_path / "s.duckdb")
    assert result.exit_code == 1
    assert "missing: no such file or directory" in result.output
    table_rows = [line for line in result.output.splitlines() if line.startswith("│")]
    assert len(table_rows) == 3 and not any("missing" in row for row in table_rows)  # the three files read
    assert "3 file(s)" in result.output
    alone = _invoke("ingest", tmp_path / "missing", "--db", tmp_path / "s.duckdb")
    assert alone.exit_code == 1 and "│" not in alone.output and "file(s)," not in alone.output


def test_an_on_off_flag_is_one_flag_unless_its_default_comes_from_elsewhere():
    import typer.main

    group = typer.main.get_command(app)
    paired = {(name, param.name) for name, command in group.commands.items() for param in command.params
              if getattr(param, "secondary_opts", None)}
    # synth's --multiturn/--no-multiturn overrides its preset either way; every other switch is off until given.
    assert paired == {("synth", "multiturn")}


def test_query_shows_people_the_first_rows_and_scripts_every_row(two_runs, monkeypatch):
    from polytrace_cli.commands import store as store_commands

    buffer = io.StringIO()
    for module in (common, store_commands):
        monkeypatch.setattr(module, "console", Console(file=buffer, width=100, color_system=None))
    many = f"SELECT range AS i FROM range({store_commands.TABLE_ROWS + 5})"
    assert _invoke("query", many, "--db", two_runs).exit_code == 0
    text = buffer.getvalue()
    assert len(_body_lines(text)) == store_commands.TABLE_ROWS
    assert f"the first {store_commands.TABLE_ROWS:,} rows; more follow" in text
    as_csv = _invoke("query", many, "--db", two_runs, "--csv")
    assert len(as_csv.stdout.splitlines()) == store_commands.TABLE_ROWS + 6  # header and every row
    buffer.truncate(0), buffer.seek(0)
    assert _invoke("query", "EXPLAIN SELECT * FROM runs", "--db", two_runs).exit_code == 0
    assert "┏" not in buffer.getvalue() and "SCAN" in buffer.getvalue().upper()  # the plan as drawn


def test_rm_leaves_no_row_of_the_runs_files_in_any_table(two_runs, tmp_path):
    """A console log brings rows to tables keyed by file alone (ignored and rejected lines, step
    flags, step facts): none of them may outlive the run's files."""
    from polytrace_cli.ingest.base import file_owned_tables

    log = tmp_path / "gamma" / "train.log"
    log.parent.mkdir()
    text = (PROJECT_ROOT / "tests" / "fixtures" / "verl" / "console_v08" / "train.log").read_text()
    log.write_text(text + "step:x - actor/pg_loss:0.1\n")  # one line rejected
    assert _invoke("ingest", log, "--db", two_runs, "--run", "gamma").exit_code == 0
    con = open_store(two_runs, read_only=True)
    files = [row[0] for row in con.execute("SELECT file_id FROM files JOIN runs USING (run_id) WHERE name = 'gamma'").fetchall()]
    tables = file_owned_tables(con)
    held = {table: con.execute(f'SELECT count(*) FROM "{table}" WHERE file_id IN (SELECT unnest(?))', [files]).fetchall()[0][0]
            for table in tables}
    con.close()
    assert held["step_metrics"] and held["ignored_lines"] and held["ingest_errors"]
    assert _invoke("rm", "gamma", "--db", two_runs).exit_code == 0
    con = open_store(two_runs, read_only=True)
    left = {table: con.execute(f'SELECT count(*) FROM "{table}" WHERE file_id IN (SELECT unnest(?))', [files]).fetchall()[0][0]
            for table in tables}
    con.close()
    assert left == dict.fromkeys(tables, 0)
