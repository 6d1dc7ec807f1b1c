"""One bad line is one rejected line, one bad file one reported file, and no log is skipped quietly.

Every input is written at test time; `hostile_inputs` holds the damaged files with their known
truth, which `benchmarks/crash_harness.py` runs in many seeded variants.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from hostile_inputs import CASES, Case
from polytrace_cli.cli import app

runner = CliRunner()


def _invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def _query(db: Path, sql: str) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def _errors(db: Path) -> list[tuple]:
    return _query(db, "SELECT line_no, code FROM ingest_errors ORDER BY line_no")


def _stored(db: Path) -> int:
    return _query(db, "SELECT coalesce(sum(stored), 0) FROM files")[0][0]


def _verl_lines(steps, start: int = 1) -> str:
    return "".join(json.dumps({"step": s, "data": {"timing_s/step": 10.0 + s}}) + "\n"
                   for s in range(start, start + steps))


@pytest.mark.parametrize("writer", CASES, ids=lambda w: w.__name__)
def test_hostile_inputs_keep_every_good_line(writer, tmp_path):
    """One seeded variant of each damaged input: no traceback, every good line stored, every file
    that had to be read stored, no infinity stored, stdout holds only the JSON."""
    case: Case = writer(tmp_path / "in", random.Random(7))
    db = tmp_path / "store.duckdb"
    result = runner.invoke(app, ["ingest", *map(str, case.paths), "--db", str(db), "--json"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    json.loads(result.stdout)
    assert _stored(db) == case.stored
    paths = {row[0] for row in _query(db, "SELECT path FROM files")}
    assert all(str(p.resolve()) in paths for p in case.must_read)
    assert _query(db, "SELECT count(*) FROM step_metrics WHERE isinf(value)")[0][0] == 0


# --- 3: sniffing past the first block; every file not read is reported, a log not read fails

def test_console_log_whose_first_metric_line_is_past_64_kb_is_read(tmp_path):
    run = tmp_path / "wandb" / "run-20250101_000000-x" / "files"
    run.mkdir(parents=True)
    noise = "".join(f"(WorkerDict pid=1{i % 9}) loading shard {i} ...\n" for i in range(3000))
    steps = "".join(f"step:{s} - timing_s/gen:{s}.5 - timing_s/step:{s + 30}.25\n" for s in range(1, 302))
    (run / "output.log").write_text(noise + steps)
    assert len(noise.encode()) > 64 * 1024
    db = tmp_path / "s.duckdb"
    result = _invoke("ingest", tmp_path / "wandb", "--db", db)
    assert result.exit_code == 0, result.output
    assert _query(db, "SELECT count(DISTINCT step), min(step), max(step) FROM step_metrics") == [(301, 1, 301)]


@pytest.mark.parametrize("first", [
    b"WARNING: the first line is a warning\n",
    b"Traceback (most recent call last):\n  File \"train.py\", line 3\nRuntimeError: boom\n",
    b"\x00\x00\x00\x00\n",
    b'{"step": 1e400, "data": {"timing_s/step": 1.0}}\n',
], ids=["warning", "traceback", "nul", "1e400"])
def test_verl_jsonl_whose_first_line_is_not_a_record_is_read(first, tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "metrics.jsonl").write_bytes(first + _verl_lines(5).encode())
    db = tmp_path / "s.duckdb"
    result = _invoke("ingest", folder, "--db", db)
    assert result.exit_code == 0, result.output
    assert _query(db, "SELECT count(DISTINCT step) FROM step_metrics")[0][0] == 5
    rejected = len(first.splitlines())
    assert _query(db, "SELECT lines, stored, rejected FROM files") == [(5 + rejected, 5, rejected)]
    if b"1e400" in first:
        assert _errors(db) == [(1, "out-of-range")]


def test_a_walked_log_of_unknown_format_fails_the_ingest_and_says_why(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "metrics.jsonl").write_text(_verl_lines(3))
    (folder / "stdout.log").write_text("nothing here that any format knows\n" * 5000)
    (folder / "requirements.txt").write_text("torch\n")
    db = tmp_path / "s.duckdb"
    result = _invoke("ingest", folder, "--db", db)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert "skipped: " in result.output and "stdout.log: log of unknown format" in result.output
    assert "requirements.txt: unknown format" in result.output
    assert "1 log file(s) were not read" in result.output
    # The log that was read is stored all the same.
    assert _query(db, "SELECT count(DISTINCT step) FROM step_metrics")[0][0] == 3
    reports = json.loads(_invoke("ingest", folder, "--db", db, "--json").stdout)
    skipped = {Path(r["path"]).name: r["message"] for r in reports if r["status"] == "skipped"}
    assert skipped == {"stdout.log": "log of unknown format: no line of a known format in its first 32 MB",
                       "requirements.txt": "unknown format"}


def test_a_folder_that_cannot_be_listed_is_reported_and_fails_the_ingest(tmp_path):
    folder = tmp_path / "logs"
    (folder / "run").mkdir(parents=True)
    (folder / "run" / "metrics.jsonl").write_text(_verl_lines(2))
    # A folder nested past PATH_MAX cannot be listed by its path, whoever runs the test.
    fd = os.open(folder, os.O_RDONLY)
    try:
        for _ in range(20):
            os.mkdir("d" * 250, dir_fd=fd)
            inner = os.open("d" * 250, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)
    db = tmp_path / "s.duckdb"
    result = _invoke("ingest", folder, "--db", db)
    assert result.exit_code == 1, result.output
    assert "cannot read folder" in result.output and "Traceback" not in result.output
    assert _query(db, "SELECT count(*) FROM files")[0][0] == 1


# --- 4, 5: one bad line is one rejected line; line ends and byte order marks

def test_a_json_line_nested_too_deep_is_one_rejected_line(tmp_path):
    folder = tmp_path / "trace"
    folder.mkdir()
    good = json.dumps({"step": 1, "rank": 0, "dp_rank": 0, "tp_rank": 0, "local_index": 0, "input": 5,
                       "output": [3, 4], "n_sampling": 2, "validate": False})
    deep = '{"step": 1, "input": 5, "output": ' + "[" * 100_000 + "]" * 100_000 + "}"
    (folder / "packed_lengths_step_1.jsonl").write_text(f"{good}\n{deep}\n{good}\n")
    db = tmp_path / "s.duckdb"
    result = _invoke("ingest", folder / "packed_lengths_step_1.jsonl", "--db", db)
    assert result.exit_code == 0, result.output
    assert _errors(db) == [(2, "invalid-json")]
    assert _query(db, "SELECT lines, stored, rejected FROM files") == [(3, 2, 1)]
    assert _query(db, "SELECT count(*) FROM runs")[0][0] == 1


def test_packed_input_of_1e400_is_out_of_range(tmp_path):
    path = tmp_path / "t" / "packed_lengths_step_1.jsonl"
    path.parent.mkdir()
    path.write_text('{"step": 1, "input": 1e400, "output": [3]}\n{"step": 1, "input": 4, "output": [3]}\n')
    db = tmp_path / "s.duckdb"
    assert _invoke("ingest", path, "--db", db).exit_code == 0
    assert _errors(db) == [(1, "out-of-range")]


def test_verl_numbers_too_large_for_a_double_are_rejected_not_stored_as_infinity(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    path.parent.mkdir()
    lines = [json.dumps({"step": 1, "data": {"a": 1.5}}), '{"step": 2, "data": {"a": -1e400}}',
             '{"step": 3, "data": {"a": 1' + "0" * 400 + "}}", '{"step": 4, "data": {"a": Infinity}}']
    path.write_text("\n".join(lines) + "\n")
    db = tmp_path / "s.duckdb"
    assert _invoke("ingest", path, "--db", db).exit_code == 0
    assert _errors(db) == [(2, "out-of-range"), (3, "out-of-range")]
    # A bare Infinity is the writer's own spelling and stays infinite.
    assert _query(db, "SELECT step, value FROM step_metrics ORDER BY step") == [(1, 1.5), (4, float("inf"))]


@pytest.mark.parametrize("damage, line, code", [
    (b'"9","4\x002","1"', 3, "unparsable-line"),
    (b'"9","4\xff2","1"', 3, "encoding-error"),
    (b'"9","4"2","1"', 3, "unparsable-line"),
], ids=["nul", "bad-utf8", "stray-quote"])
def test_one_bad_csv_line_is_one_rejected_line(damage, line, code, tmp_path):
    rows = [b'"Step","r - a","r - b"', b'"1","1.5","2"', damage, *(f'"{s}","{s}.5","3"'.encode() for s in range(2, 17))]
    path = tmp_path / "export.csv"
    path.write_bytes(b"\n".join(rows) + b"\n")
    db = tmp_path / "s.duckdb"
    result = _invoke("ingest", path, "--db", db)
    assert result.exit_code == 0, result.output
    assert _errors(db) == [(line, code)]
    assert _query(db, "SELECT lines, stored, rejected FROM files") == [(18, 16, 1)]
    assert _query(db, "SELECT count(DISTINCT step) FROM step_metrics")[0][0] == 16


def test_a_csv_whose_last_line_is_cut_keeps_every_whole_row(tmp_path):
    path = tmp_path / "export.csv"
    path.write_bytes(b'"Step","a"\n' + b"".join(f'"{s}","{s}.5"\n'.encode() for s in range(1, 17)) + b'"17","4')
    db = tmp_path / "s.duckdb"
    assert _invoke("ingest", path, "--db", db).exit_code == 0
    assert _errors(db) == [(18, "unparsable-line")]
    assert _query(db, "SELECT count(DISTINCT step) FROM step_metrics")[0][0] == 16


@pytest.mark.parametrize("name, body, key", [
    ("export.csv", '"Step","a"\r"1","1.5"\r"2","2.5"\r', "a"),
    ("metrics.jsonl", '{"step": 1, "data": {"a": 1.5}}\r{"step": 2, "data": {"a": 2.5}}\r', "a"),
], ids=["csv", "jsonl"])
def test_cr_only_line_ends_split_lines(name, body, key, tmp_path):
    path = tmp_path / "run" / name
    path.parent.mkdir()
    path.write_bytes(body.encode())
    db = tmp_path / "s.duckdb"
    result = _invoke("ingest", path, "--db", db)
    assert result.exit_code == 0, result.output
    assert _query(db, f"SELECT step, value FROM step_metrics WHERE key = '{key}' ORDER BY step") == [(1, 1.5), (2, 2.5)]
    assert _query(db, "SELECT rejected FROM files") == [(0,)]


def test_json_documents_with_a_byte_order_mark_are_read(tmp_path):
    bom = b"\xef\xbb\xbf"
    run = tmp_path / "run" / "files"
    (run / "media" / "table" / "val").mkdir(parents=True)
    (run / "wandb-summary.json").write_bytes(bom + json.dumps({"_step": 4, "_runtime": 9.5}).encode())
    table = {"columns": ["step", "input", "output"], "data": [[1, "p", "answer"], [2, "q", "other answer"]]}
    (run / "media" / "table" / "val" / "generations_2_ab.table.json").write_bytes(bom + json.dumps(table).encode())
    dataset = tmp_path / "dataset" / "math.json"
    dataset.parent.mkdir()
    dataset.write_bytes(bom + json.dumps({"1": {"input": [3, 4], "output": [5, 6]}}).encode())
    db = tmp_path / "s.duckdb"
    result = _invoke("ingest", run / "wandb-summary.json", run / "media", dataset, "--db", db, "--json")
    assert result.exit_code == 0, result.output
    reports = {Path(r["path"]).name: r for r in json.loads(result.stdout)}
    assert {name: (r["status"], r["rejected"]) for name, r in reports.items()} == {
        "wandb-summary.json": ("ingested", 0), "generations_2_ab.table.json": ("ingested", 0),
        "math.json": ("ingested", 0)}
    assert _query(db, "SELECT count(*) FROM samples WHERE step = 1 AND validate")[0][0] == 1


def test_a_wandb_table_with_a_byte_that_is_not_utf8_rejects_that_row_only(tmp_path):
    table = {"columns": ["step", "input", "output"], "data": [[s, f"p{s}", f"answer {s}"] for s in (1, 2, 3)]}
    path = tmp_path / "files" / "media" / "table" / "val" / "generations_3_ab.table.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(json.dumps(table).encode().replace(b"answer 2", b"answer \xff2"))
    db = tmp_path / "s.duckdb"
    result = _invoke("ingest", path, "--db", db)
    assert result.exit_code == 0, result.output
    assert _errors(db) == [(2, "encoding-error")]
    assert _query(db, "SELECT step FROM samples ORDER BY step") == [(1,), (3,)]


# --- 7: runs without files

def test_a_run_left_without_files_is_removed_at_the_next_write(tmp_path):
    from polytrace_cli.store import open_store

    db = tmp_path / "s.duckdb"
    con = open_store(db)
    # What a kill between creating a run and committing its first file leaves behind.
    con.execute("INSERT INTO runs (run_id, name, source_dir, meta) VALUES (nextval('run_id_seq'), 'orphan', '/x', '{}')")
    con.close()
    # A read command does not show it (the store is tidied before it is read) ...
    assert json.loads(_invoke("runs", "--db", db, "--json").stdout) == []
    con = open_store(db)
    con.execute("INSERT INTO runs (run_id, name, source_dir, meta) VALUES (nextval('run_id_seq'), 'orphan', '/x', '{}')")
    con.close()
    # ... and an ingest removes it too.
    path = tmp_path / "run" / "metrics.jsonl"
    path.parent.mkdir()
    path.write_text(_verl_lines(2))
    assert _invoke("ingest", path, "--db", db).exit_code == 0
    assert _query(db, "SELECT name FROM runs") == [("run",)]


def test_a_file_that_fails_whole_leaves_no_run(tmp_path):
    path = tmp_path / "lonely" / "wandb-summary.json"
    path.parent.mkdir()
    path.write_text("[" * 100_000 + "]" * 100_000)
    db = tmp_path / "s.duckdb"
    result = _invoke("ingest", path, "--db", db)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "nested too deep" in result.output
    assert _query(db, "SELECT count(*) FROM runs")[0][0] == 0


def test_a_file_rejected_whole_after_it_was_stored_leaves_no_run_fact_behind(tmp_path):
    """A run of two logs, the second (last in fold order) giving the larger max_response_length; the second
    is then replaced by a damaged gzip and rejected whole. Its rows go, and so must what it told the run:
    the store equals a fresh ingest of the folder as it is now."""
    import gzip

    from conftest import whole_store

    def log(max_length: int) -> str:
        return "".join([f"(TaskRunner pid=1) {{'data': {{'max_response_length': {max_length}}}}}\n"] +
                       [f"(TaskRunner pid=1) step:{s} - timing_s/gen:{10 + s} - timing_s/step:{20 + s} - "
                        f"response_length/mean:{100 * s}\n" for s in (1, 2, 3)])

    folder = tmp_path / "logs" / "r"
    folder.mkdir(parents=True)
    (folder / "a.log").write_text(log(4096))
    (folder / "b.log.gz").write_bytes(gzip.compress(log(8192).encode()))
    grown, fresh = tmp_path / "grown.duckdb", tmp_path / "fresh.duckdb"
    assert _invoke("ingest", folder, "--run", "r", "--db", grown).exit_code == 0
    assert json.loads(_query(grown, "SELECT meta FROM runs")[0][0])["max_response_len"] == 8192
    (folder / "b.log.gz").write_bytes(b"\x1f\x8b\x08\x00" + b"\x00" * 40)  # a gzip header, then nothing sound
    for db in (grown, fresh):
        result = _invoke("ingest", folder, "--run", "r", "--db", db)
        assert result.exit_code == 1 and "b.log.gz" in result.output
    assert json.loads(_query(grown, "SELECT meta FROM runs")[0][0])["max_response_len"] == 4096
    stores = []
    for db in (grown, fresh):
        con = duckdb.connect(str(db), read_only=True)
        try:
            stores.append(whole_store(con))
        finally:
            con.close()
    assert stores[0] == stores[1]
