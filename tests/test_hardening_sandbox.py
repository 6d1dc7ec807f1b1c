"""Paths are data and every connection that reads user data is confined: a walked folder's links out
are not followed, nothing is created outside the store's folder, a lake or a store from elsewhere
reads no other file, and `query` has a time and memory limit."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hostile_inputs import SANDBOX_ATTEMPTS, Attempt, crafted_store, folder_state, judge_attempt, outside_files
from polytrace_cli.cli import app

runner = CliRunner()


def _invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def _verl_lines(steps: int) -> str:
    return "".join(json.dumps({"step": s, "data": {"timing_s/step": 10.0 + s}}) + "\n" for s in range(1, steps + 1))


def test_a_link_out_of_a_walked_folder_is_skipped_by_name_and_a_file_linked_twice_is_read_once(tmp_path):
    """A real wandb run folder holds `logs/debug-core.log`, a link into ~/.cache: it is listed as skipped,
    never opened, and does not fail the ingest; a file reached twice through links is read once."""
    outside = tmp_path / "cache" / "core-debug.log"
    outside.parent.mkdir()
    outside.write_text(_verl_lines(3))
    run = tmp_path / "wandb" / "run-20250101_000000-abc"
    (run / "logs").mkdir(parents=True)
    (run / "files").mkdir()
    (run / "files" / "metrics.jsonl").write_text(_verl_lines(4))
    (run / "logs" / "debug-core.log").symlink_to(outside)
    (run / "logs" / "debug.log").symlink_to(run / "files" / "metrics.jsonl")
    db = tmp_path / "s.duckdb"
    result = _invoke("ingest", tmp_path / "wandb", "--db", db, "--json")
    assert result.exit_code == 0, result.output
    reports = {(Path(r["path"]).name, r["status"]): r for r in json.loads(result.stdout)}
    assert set(reports) == {("debug-core.log", "skipped"), ("metrics.jsonl", "ingested"), ("metrics.jsonl", "skipped")}
    assert reports["debug-core.log", "skipped"]["message"].startswith("a link to a file outside the folder")
    assert reports["metrics.jsonl", "skipped"]["message"].startswith("the same file as one listed before it")
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT path FROM files").fetchall() == [(str((run / "files" / "metrics.jsonl").resolve()),)]
    finally:
        con.close()


# --- stores from elsewhere, lakes and `query`

@pytest.fixture(scope="module")
def store_file(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sandbox")
    logs = root / "logs" / "alpha"
    assert _invoke("synth", "--task", "math", "--out", logs, "--num-steps", 2, "--batch", 2, "--n", 2,
                   "--seed", 4).exit_code == 0
    assert _invoke("ingest", logs, "--db", root / "store.duckdb").exit_code == 0
    return root / "store.duckdb"


def _crafted(store_file: Path, tmp_path: Path, *statements: str) -> Path:
    return crafted_store(store_file, tmp_path / "sent.duckdb", list(statements))


def _one_line_error(result, *words) -> str:
    assert result.exit_code != 0 and "Traceback" not in result.output, result.output
    message = result.output.strip().splitlines()[-1]
    assert all(word in message for word in words), message
    return message


def test_a_table_redefined_as_a_view_over_a_local_file_is_refused(store_file, tmp_path):
    secret = tmp_path / "hostname"
    secret.write_text("the-secret-host\n")
    sent = _crafted(store_file, tmp_path, "DROP TABLE ingest_errors",
                    f"CREATE VIEW ingest_errors AS SELECT 1 AS file_id, 1 AS line_no, content AS reason, content AS raw,"
                    f" 'x' AS code FROM read_text('{secret}')")
    for command in (["errors"], ["runs"], ["query", "select * from ingest_errors"]):
        result = _invoke(*command, "--db", sent)
        _one_line_error(result, "holds SQL that polytrace does not define", "view ingest_errors")
        assert "the-secret-host" not in result.output


def test_a_macro_in_a_store_is_refused(store_file, tmp_path):
    sent = _crafted(store_file, tmp_path, "CREATE MACRO coalesce(a, b) AS 42")
    _one_line_error(_invoke("runs", "--db", sent), "macro coalesce")


def test_a_store_this_process_wrote_is_checked_again_once_another_writer_changed_it(store_file, tmp_path,
                                                                                   monkeypatch):
    """A store the session wrote is opened again without the check (`Store.close` trusts what it leaves),
    until anything else writes it: in place with its modification time set back, or replaced by a copy."""
    import shutil

    import duckdb

    from polytrace_cli import Store
    from polytrace_cli.store import sandbox

    checked = []
    monkeypatch.setattr(sandbox, "foreign_objects", lambda con, check=sandbox.foreign_objects: checked.append(1)
                        or check(con))
    path = tmp_path / "own.duckdb"
    shutil.copy(store_file, path)
    with Store.open(path) as store:
        store.connection.execute("UPDATE runs SET task = 'math'")
    assert checked == [1]
    assert _invoke("runs", "--db", path).exit_code == 0
    assert checked == [1]  # opened again as this process left it: not checked again
    before = os.stat(path)
    con = duckdb.connect(str(path))
    con.execute("CREATE MACRO coalesce(a, b) AS 42")
    con.close()
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    _one_line_error(_invoke("runs", "--db", path), "macro coalesce")

    with Store.open(tmp_path / "second.duckdb") as store:
        pass
    os.replace(_crafted(store_file, tmp_path, "CREATE MACRO coalesce(a, b) AS 42"), tmp_path / "second.duckdb")
    _one_line_error(_invoke("runs", "--db", tmp_path / "second.duckdb"), "macro coalesce")


def test_polytraces_own_views_are_read_by_name_whatever_the_store_holds(store_file, tmp_path):
    secret = tmp_path / "hostname"
    secret.write_text("the-secret-host\n")
    own = json.loads(_invoke("query", "select count(*) as n from samples", "--db", store_file, "--json").stdout)
    sent = _crafted(store_file, tmp_path, "DROP VIEW samples",
                    f"CREATE VIEW samples AS SELECT content AS prompt_len FROM read_text('{secret}')")
    result = _invoke("query", "select count(*) as n from samples", "--db", sent, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == own == [{"n": 8}]
    assert "the-secret-host" not in _invoke("query", "select * from samples", "--db", sent, "--json").output
    # A writing command rebuilds the view in the store itself.
    assert _invoke("rename", "alpha", "beta", "--db", sent).exit_code == 0
    import duckdb

    con = duckdb.connect(str(sent), read_only=True)
    try:
        assert "read_text" not in con.execute("SELECT sql FROM duckdb_views() WHERE view_name = 'samples'").fetchall()[0][0]
    finally:
        con.close()


def test_query_refuses_a_store_cut_short_as_errors_does(store_file, tmp_path):
    import shutil

    half = tmp_path / "half.duckdb"
    shutil.copy(store_file, half)
    os.truncate(half, half.stat().st_size // 2)
    for command in (["query", "select 1 as one"], ["errors"]):
        _one_line_error(_invoke(*command, "--db", half), "cut short")


def test_a_query_on_a_lake_reads_nothing_under_the_working_folders_tmp(store_file, tmp_path, monkeypatch):
    lake = tmp_path / "lake"
    assert _invoke("lake", lake, "--db", store_file).exit_code == 0
    (tmp_path / ".tmp").mkdir()
    (tmp_path / ".tmp" / "secret.txt").write_text("the-secret\n")
    monkeypatch.chdir(tmp_path)
    result = _invoke("query", "select * from read_text('.tmp/secret.txt')", "--db", lake)
    assert result.exit_code != 0 and "the-secret" not in result.output


def test_a_query_past_its_time_limit_is_stopped_with_one_line(store_file):
    endless = "with recursive r(n) as (select 1 union all select n + 1 from r) select count(*) from r"
    _one_line_error(_invoke("query", endless, "--db", store_file, "--time-limit", "0.5"), "time limit of 0.5 s")


def test_a_query_past_its_memory_limit_is_stopped_with_one_line(store_file):
    _one_line_error(_invoke("query", "select list(range) from range(50000000)", "--db", store_file, "--json",
                            "--memory-limit", "64MB"), "more memory than its limit")


# --- the sandbox attempts `crash_harness --sandbox` replays: one seeded variant of each

def _replay(attempt: Attempt) -> dict:
    before = folder_state(attempt.watched)
    result = runner.invoke(app, attempt.args)
    traceback = result.exception is not None and not isinstance(result.exception, SystemExit)
    outcome = judge_attempt(attempt, result.exit_code, result.output + ("Traceback" if traceback else ""), before)
    return {key: outcome[key] for key in ("traceback", "escaped", "accepted")}


@pytest.mark.parametrize("seed", [7, 8])
@pytest.mark.parametrize("writer", SANDBOX_ATTEMPTS, ids=lambda w: w.__name__)
def test_a_sandbox_attempt_shows_no_secret_writes_nothing_and_is_refused_in_one_line(writer, seed, store_file,
                                                                                      tmp_path, monkeypatch):
    """A crafted store, lake or `query` text aimed at the files beside it: the secret they hold is
    not printed, nothing is written beside it or in the working folder, no traceback, and an attempt
    that must be refused exits non-zero."""
    working = tmp_path / "cwd"
    working.mkdir()
    monkeypatch.chdir(working)
    attempt = writer(tmp_path / "attempt", random.Random(seed), store_file)
    attempt.watched.append(working)
    assert _replay(attempt) == {"traceback": False, "escaped": False, "accepted": False}, attempt.args


def test_the_sandbox_replay_counts_an_escape_when_the_connection_is_not_confined(store_file, tmp_path, monkeypatch):
    """The replay's judge is not blind: with the query connection's confinement switched off, reading
    the secret file beside the store through `query` is counted as an escape (and as accepted)."""
    import polytrace_cli.store.sql as sql

    outside, secret = outside_files(tmp_path, random.Random(1))
    attempt = Attempt("query outside", ["query", f"select * from read_text('{outside}/secret.txt')", "--db",
                                        str(store_file), "--json"], secret, [outside], refused=True)
    assert _replay(attempt) == {"traceback": False, "escaped": False, "accepted": False}
    monkeypatch.setattr(sql, "CONFINED_SETTINGS", ())
    assert _replay(attempt) == {"traceback": False, "escaped": True, "accepted": True}
