"""The store: creation, migration ledger, refusing newer stores, clear open errors."""

from __future__ import annotations

import os
import subprocess
import sys

import duckdb
import pytest

from polytrace_cli.errors import StoreError
from polytrace_cli.store import SCHEMA_VERSION, open_store, schema_version


def test_new_store_has_every_migration_and_core_tables(store):
    assert schema_version(store) == SCHEMA_VERSION
    tables = {row[0] for row in store.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    for name in ("runs", "files", "ingest_errors", "step_metrics", "samples", "turns", "tool_calls",
                 "rank_timings", "filter_batches", "steps", "schema_migrations"):
        assert name in tables


def test_reopening_applies_nothing_twice(db_path):
    open_store(db_path).close()
    con = open_store(db_path)
    assert con.execute("SELECT count(*) FROM schema_migrations").fetchall()[0][0] == SCHEMA_VERSION
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
    open_store(db_path).close()
    con = duckdb.connect(str(db_path))
    con.execute(f"DELETE FROM schema_migrations WHERE version = {SCHEMA_VERSION}")
    if SCHEMA_VERSION == 1:
        # Simulate a store made before any schema: drop everything file 001 creates.
        for (name, kind) in con.execute(
            "SELECT table_name, table_type FROM information_schema.tables WHERE table_name != 'schema_migrations'"
        ).fetchall():
            con.execute(f"DROP {'VIEW' if kind == 'VIEW' else 'TABLE'} {name} CASCADE")
        con.execute("DROP SEQUENCE run_id_seq")
        con.execute("DROP SEQUENCE file_id_seq")
    con.close()
    reader = open_store(db_path, read_only=True)
    assert schema_version(reader) == SCHEMA_VERSION
    reader.close()


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
