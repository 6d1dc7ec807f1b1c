"""The store: creation, migration ledger, refusing newer stores, clear open errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from pathlib import Path

import duckdb
import pytest

from polytrace_cli.errors import StoreError
from polytrace_cli.store import SCHEMA_VERSION, open_store, schema_version
from polytrace_cli.store.migrations import available_migrations, migrate


def test_new_store_has_every_migration_and_core_tables(store):
    assert schema_version(store) == SCHEMA_VERSION
    tables = {row[0] for row in store.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    for name in ("runs", "files", "ingest_errors", "step_metrics", "samples", "turns", "tool_calls",
                 "rank_timings", "filter_batches", "steps", "schema_migrations"):
        assert name in tables


def test_reopening_applies_nothing_twice(db_path):
    open_store(db_path).close()
    con = open_store(db_path)
    assert con.execute("SELECT count(*) FROM schema_migrations").fetchall()[0][0] == len(available_migrations())
    con.close()


def test_newer_store_is_refused(db_path):
    open_store(db_path).close()
    con = duckdb.connect(str(db_path))
    con.execute("INSERT INTO schema_migrations (version, name) VALUES (999, 'future')")
    con.close()
    with pytest.raises(StoreError, match="newer than this polytrace"):
        open_store(db_path)
    with pytest.raises(StoreError, match="newer than this polytrace"):
        open_store(db_path, read_only=True)


def test_older_store_is_upgraded_even_when_opened_for_reading(db_path):
    # A version-3 store: `samples` was still a table there, holding one response.
    con = duckdb.connect(str(db_path))
    assert migrate(con, "old store", up_to=3) == [1, 2, 3]
    con.execute("INSERT INTO samples (run_id, file_id, step, prompt_idx, sample_idx, response_len) VALUES (1, 1, 7, 0, 0, 42)")
    con.close()
    reader = open_store(db_path, read_only=True)
    assert schema_version(reader) == SCHEMA_VERSION
    assert reader.execute("SELECT step, response_len FROM samples").fetchall() == [(7, 42)]
    assert reader.execute("SELECT count(*) FROM sample_rows").fetchall()[0][0] == 1
    reader.close()


def test_sample_groups_read_as_one_sample_per_response(store):
    store.execute("INSERT INTO sample_rows (run_id, file_id, step, prompt_idx, sample_idx, response_len, turns)"
                  " VALUES (1, 1, 0, 5, 0, 11, 2)")
    store.execute("INSERT INTO sample_groups (run_id, file_id, step, dp_rank, prompt_idx, prompt_len, validate,"
                  " response_lens) VALUES (2, 2, 3, 1, 4, 100, false, [30, 10, 20]), (2, 2, 3, 1, 5, 50, false, [])")
    rows = store.execute(
        "SELECT run_id, step, dp_rank, prompt_idx, sample_idx, prompt_len, response_len, turns, length_estimated"
        " FROM samples ORDER BY run_id, prompt_idx, sample_idx"
    ).fetchall()
    assert rows == [
        (1, 0, None, 5, 0, None, 11, 2, False),
        (2, 3, 1, 4, 0, 100, 30, None, False),
        (2, 3, 1, 4, 1, 100, 10, None, False),
        (2, 3, 1, 4, 2, 100, 20, None, False),
    ]


def test_missing_store_for_reading_says_what_to_run(db_path):
    with pytest.raises(StoreError, match="polytrace ingest"):
        open_store(db_path, read_only=True)


def test_locked_store_names_the_problem(db_path):
    open_store(db_path).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import duckdb,time; c=duckdb.connect({str(db_path)!r}); print('ok', flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ok"
        with pytest.raises(StoreError, match="locked by another process"):
            open_store(db_path)
    finally:
        holder.kill()
        holder.wait()


def test_unwritable_folder_is_a_clear_error(tmp_path):
    # /sys refuses new files even to root, which chmod-based tests cannot promise.
    target = "/sys/store.duckdb" if os.geteuid() == 0 else None
    if target is None:
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o500)
        target = folder / "store.duckdb"
    with pytest.raises(StoreError, match="not writable"):
        open_store(target)


def _damage(path, start: int = 12288) -> None:
    # Past DuckDB's three header blocks every block carries a checksum; overwrite them all.
    size = path.stat().st_size
    with open(path, "r+b") as handle:
        handle.seek(start)
        handle.write(b"\xff" * (size - start))


def test_a_damaged_store_is_called_damaged_not_locked(db_path):
    con = open_store(db_path)
    con.execute("CHECKPOINT")
    con.close()
    _damage(db_path)
    for read_only in (True, False):
        with pytest.raises(StoreError) as caught:
            open_store(db_path, read_only=read_only).execute("SELECT count(*) FROM runs").fetchall()
        message = str(caught.value)
        assert "damaged" in message and "locked" not in message


def test_a_damaged_store_met_by_a_command_is_one_line(tmp_path):
    from typer.testing import CliRunner

    from polytrace_cli.cli import app

    db = tmp_path / "s.duckdb"
    open_store(db).close()
    _damage(db)
    result = CliRunner().invoke(app, ["runs", "--db", str(db)])
    assert result.exit_code == 2
    assert "damaged" in result.output and "locked" not in result.output and "Traceback" not in result.output


def test_a_duckdb_file_that_is_not_a_store_is_refused_and_left_as_it_was(tmp_path):
    other = tmp_path / "other.duckdb"
    con = duckdb.connect(str(other))
    con.execute("CREATE TABLE measurements (a INTEGER)")
    con.close()
    for read_only in (False, True):
        with pytest.raises(StoreError, match="not a polytrace store"):
            open_store(other, read_only=read_only)
    con = duckdb.connect(str(other), read_only=True)
    assert con.execute("SELECT table_name FROM information_schema.tables").fetchall() == [("measurements",)]
    con.close()


def test_a_text_file_is_not_a_store(tmp_path):
    text = tmp_path / "notes.duckdb"
    text.write_text("hello\n")
    with pytest.raises(StoreError, match="not a DuckDB database file"):
        open_store(text)
    assert text.read_text() == "hello\n"


def test_a_zero_byte_file_is_no_store_for_readers_and_a_new_store_for_writers(db_path):
    db_path.write_bytes(b"")
    with pytest.raises(StoreError, match="an empty file at"):
        open_store(db_path, read_only=True)
    open_store(db_path).close()
    assert schema_version(duckdb.connect(str(db_path), read_only=True)) == SCHEMA_VERSION


def _small_disk(folder: Path, size: str):
    """Mount a tmpfs of `size` on `folder` (skipping the test where mounting is not allowed); returns
    the unmount."""
    folder.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
    if done.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    return lambda: subprocess.run(["umount", str(folder)], capture_output=True)


def fill_disk(folder: Path) -> None:
    """Write zeros into `folder` until its file system is full."""
    with open(folder / "filler", "wb") as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError:
            pass


@pytest.fixture
def full_disk(tmp_path):
    """A 1 MB tmpfs, filled; skipped where mounting is not allowed."""
    mount = tmp_path / "small"
    unmount = _small_disk(mount, "1m")
    try:
        fill_disk(mount)
        yield mount
    finally:
        unmount()


def test_an_ingest_that_fills_the_disk_names_the_full_disk(tmp_path):
    """The store is written until the disk is full: the message says so (never a failed rollback), and
    the run being read is not left behind."""
    from typer.testing import CliRunner

    from polytrace_cli.cli import app

    runner = CliRunner()
    disk = tmp_path / "disk"
    unmount = _small_disk(disk, "4m")
    try:
        for name, steps, batch in (("small", 2, 2), ("big", 20, 32)):
            synth = ["synth", "--task", "math", "--out", str(tmp_path / name), "--num-steps", str(steps),
                     "--batch", str(batch), "--n", "4"]
            assert runner.invoke(app, synth).exit_code == 0
        assert runner.invoke(app, ["ingest", str(tmp_path / "small"), "--db", str(disk / "s.duckdb")]).exit_code == 0
        fill_disk(disk)
        result = runner.invoke(app, ["ingest", str(tmp_path / "big"), "--db", str(disk / "s.duckdb")])
        assert result.exit_code == 2 and "Traceback" not in result.output
        message = result.output.strip().splitlines()[-1]
        assert "is full" in message and "free space" in message and "rollback" not in message
        (disk / "filler").unlink()
        runs = runner.invoke(app, ["runs", "--db", str(disk / "s.duckdb"), "--json"])
        assert [run["run"] for run in json.loads(runs.stdout)] == ["small"]
    finally:
        unmount()


def test_a_full_disk_is_named_and_leaves_no_empty_store(full_disk):
    db = full_disk / "new.duckdb"
    with pytest.raises(StoreError, match="is full"):
        open_store(db)
    assert not db.exists() and not (full_disk / "new.duckdb.wal").exists()


def test_a_reader_that_may_not_upgrade_an_older_store_says_so(db_path):
    con = duckdb.connect(str(db_path))
    migrate(con, "old store", up_to=3)
    con.close()
    with pytest.raises(StoreError, match="older store"):
        open_store(db_path, read_only=True, upgrade=False)
    assert schema_version(duckdb.connect(str(db_path), read_only=True)) == 3  # left as it was


def test_the_command_lines_report_upgrades_an_older_store(tmp_path):
    """`polytrace report` forks a second process that opens the store too: on an older store it bows
    out and the command upgrades the store and writes the page alone."""
    import os
    import subprocess
    import sys

    from conftest import PROJECT_ROOT
    from polytrace_cli.ingest.driver import ingest_paths

    db = tmp_path / "old.duckdb"
    con = duckdb.connect(str(db))
    migrate(con, "old store", up_to=3)
    con.close()
    con = open_store(db)  # upgraded, then filled
    trace = tmp_path / "run" / "packed_lengths_step_0.jsonl"
    trace.parent.mkdir()
    trace.write_text('{"step": 0, "rank": 0, "dp_rank": 0, "tp_rank": 0, "local_index": 0, "input": 5, '
                     '"output": [1, 2], "n_sampling": 2, "validate": false}\n')
    ingest_paths(con, [trace])
    con.execute("DELETE FROM schema_migrations WHERE version = (SELECT max(version) FROM schema_migrations)")
    con.close()
    before_last = sorted(m.version for m in available_migrations())[-2]
    assert schema_version(duckdb.connect(str(db), read_only=True)) == before_last
    completed = subprocess.run([sys.executable, "-m", "polytrace_cli.cli", "report", "--db", str(db), "--out",
                                str(tmp_path / "reports")], capture_output=True, text=True, timeout=300,
                               env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
    assert completed.returncode == 0, completed.stderr
    assert Path(completed.stdout.strip().splitlines()[-1]).exists()
    assert schema_version(duckdb.connect(str(db), read_only=True)) == SCHEMA_VERSION


def test_a_store_from_before_file_run_meta_keeps_its_runs_meta_as_the_first_fold(tmp_path):
    """Upgrading keeps each run's meta as one row without a file, folded before the files read later: a
    file read into the run adds its facts, and a fact only the old meta had stays."""
    from polytrace_cli.ingest.driver import ingest_paths

    db = tmp_path / "old.duckdb"
    con = duckdb.connect(str(db))
    migrate(con, "old store", up_to=13)
    con.execute("INSERT INTO runs (run_id, name, source_dir, meta) VALUES (1, 'r', '/nowhere',"
                " '{\"model\": \"old-model\", \"kept\": 1}'), (2, 'empty', '/elsewhere', '{}')")
    con.close()
    con = open_store(db)
    assert con.execute("SELECT file_id, run_id, meta FROM file_run_meta").fetchall() == \
        [(None, 1, '{"model": "old-model", "kept": 1}')]
    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    log.write_text("step:1 - timing_s/step:12.5 - response_length/mean:300.0\n")
    ingest_paths(con, [log], run_name="r")
    log.write_text("step:1 - timing_s/step:12.5 - response_length/mean:300.0\nstep:2 - timing_s/step:11.0\n")
    ingest_paths(con, [log], run_name="r")
    meta = json.loads(con.execute("SELECT meta FROM runs WHERE name = 'r'").fetchall()[0][0])
    con.close()
    assert meta["kept"] == 1 and meta["model"] == "old-model" and meta["framework"] == "verl"
