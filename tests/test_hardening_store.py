"""Stores that are not what --db expects get one clear line; reports draw and write names as text."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from polytrace_cli.cli import app
from polytrace_cli.store import open_store
from test_hardening_lake_query import one_line_error as _one_line_error

runner = CliRunner()


def _invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("store")
    result = _invoke("synth", "--task", "math", "--out", root / "logs" / "alpha", "--num-steps", 2, "--batch", 2,
                     "--n", 2, "--dp-ranks", 2, "--seed", 5)
    assert result.exit_code == 0, result.output
    assert _invoke("ingest", root / "logs" / "alpha", "--db", root / "store.duckdb").exit_code == 0
    return root / "store.duckdb"


def test_a_fifo_as_db_is_refused_at_once(tmp_path):
    fifo = tmp_path / "pipe.duckdb"
    os.mkfifo(fifo)
    done = subprocess.run([sys.executable, "-m", "polytrace_cli.cli", "runs", "--db", str(fifo)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "is not a regular file" in done.stderr and "Traceback" not in done.stderr


def test_a_sqlite_file_is_named_as_such_and_no_extension_is_fetched(tmp_path):
    path = tmp_path / "lite.db"
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE a (x)")
    _one_line_error(_invoke("runs", "--db", path), "is a SQLite database, not a polytrace store")
    _one_line_error(_invoke("ingest", tmp_path, "--db", path), "is a SQLite database")


def test_every_store_connection_turns_extension_autoloading_off(store, tmp_path):
    settings = "SELECT current_setting('autoinstall_known_extensions'), current_setting('autoload_known_extensions')"
    for con in (open_store(store, read_only=True), open_store(tmp_path / "new.duckdb")):
        assert con.execute(settings).fetchall() == [(False, False)]
        con.close()


def test_a_foreign_duckdb_with_a_ledger_table_is_not_a_store(tmp_path):
    path = tmp_path / "other.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE schema_migrations (version INTEGER, name VARCHAR)")
    con.execute("INSERT INTO schema_migrations VALUES (1, 'theirs')")
    con.close()
    _one_line_error(_invoke("runs", "--db", path), "not a polytrace store")
    _one_line_error(_invoke("ingest", tmp_path, "--db", path), "not a polytrace store", "refusing to change it")
    assert duckdb.connect(str(path), read_only=True).execute("SELECT count(*) FROM schema_migrations").fetchall() \
        == [(1,)]


def test_a_store_cut_in_half_says_it_is_cut_short(store, tmp_path):
    half = tmp_path / "half.duckdb"
    shutil.copy(store, half)
    os.truncate(half, half.stat().st_size // 2)
    _one_line_error(_invoke("runs", "--db", half), "cut short", "restore it from a copy")


def test_a_junk_wal_is_named_and_kept(store, tmp_path):
    copy = tmp_path / "copy.duckdb"
    shutil.copy(store, copy)
    wal = Path(f"{copy}.wal")
    wal.write_bytes(os.urandom(3000).replace(b"d", b"x"))
    before = wal.read_bytes()
    _one_line_error(_invoke("runs", "--db", copy), "is not a DuckDB write-ahead log", "move it")
    _one_line_error(_invoke("rm", "alpha", "--db", copy), "is not a DuckDB write-ahead log")
    assert wal.read_bytes() == before


def test_a_folder_as_db_is_named(tmp_path):
    _one_line_error(_invoke("runs", "--db", tmp_path), "is a folder, neither a store file nor a lake")


# --- 9: output

def test_a_run_name_with_dollars_and_markup_is_drawn_and_written_as_text(tmp_path):
    logs = tmp_path / "logs"
    assert _invoke("synth", "--task", "math", "--out", logs, "--num-steps", 3, "--batch", 2, "--n", 2,
                   "--dp-ranks", 2).exit_code == 0
    db = tmp_path / "s.duckdb"
    name = "cost $x^{ $y <img src=x onerror=alert(1)>"
    assert _invoke("ingest", logs, "--db", db, "--run", name).exit_code == 0
    result = _invoke("report", "--db", db, "--out", tmp_path / "report", "--name", "r")
    assert result.exit_code == 0, result.output
    markdown = (tmp_path / "report" / "r" / "summary.md").read_text()
    assert re.search(r"(?<!\\)<img", markdown) is None
    assert r"\<img src=x onerror=alert(1)\>" in markdown
    summary = json.loads((tmp_path / "report" / "r" / "summary.json").read_text())
    assert all(figure["failed"] is None for figure in summary["figures"])


def test_a_store_killed_before_its_first_commit_is_an_empty_store(tmp_path):
    """What an ingest killed while creating the store leaves (an older polytrace wrote the ledger
    before the tables): readers say the store is empty, the next ingest fills it."""
    path = tmp_path / "s.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR NOT NULL,"
                " applied_at TIMESTAMP DEFAULT current_timestamp)")
    con.close()
    _one_line_error(_invoke("runs", "--db", path), "an empty store", "polytrace ingest")
    logs = tmp_path / "alpha"
    assert _invoke("synth", "--task", "math", "--out", logs, "--num-steps", 2, "--batch", 2, "--n", 2).exit_code == 0
    assert _invoke("ingest", logs, "--db", path).exit_code == 0
    assert [run["run"] for run in json.loads(_invoke("runs", "--db", path, "--json").stdout)] == ["alpha"]


def test_an_ingest_killed_before_deciding_its_runs_is_made_whole_by_the_next_ingest(store, tmp_path):
    """A kill after the files are committed, before the end-of-ingest decision, leaves runs without
    their semantics record; ingesting the same logs again (every file unchanged) adds them back, so
    the store equals a clean one."""
    killed = tmp_path / "killed.duckdb"
    shutil.copy(store, killed)
    clean = json.loads(_invoke("runs", "--db", store, "--json").stdout)
    con = duckdb.connect(str(killed))
    con.execute("DELETE FROM run_semantics")
    con.close()
    result = _invoke("ingest", store.parent / "logs" / "alpha", "--db", killed, "--json")
    assert result.exit_code == 0 and {r["status"] for r in json.loads(result.stdout)} == {"unchanged"}
    con = duckdb.connect(str(killed), read_only=True)
    assert con.execute("SELECT count(*) FROM run_semantics").fetchall() == [(1,)]
    con.close()
    assert json.loads(_invoke("runs", "--db", killed, "--json").stdout) == clean
