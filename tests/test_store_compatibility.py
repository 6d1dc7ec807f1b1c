"""A store written by the previous version of polytrace opens with today's code, upgraded to today's schema,
keeping what it held, and holds what today's code stores from the same inputs: the same runs, files rows
(accounting), samples, rejected and ignored lines, and steps. The store was written by
`tests/fixtures/stores/make_store.py` (see its docstring)."""

from __future__ import annotations

import gzip
import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from polytrace_cli import Store

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "stores"


def _make_store_module():
    spec = importlib.util.spec_from_file_location("make_store", FIXTURES / "make_store.py")
    module = importlib.util.module_from_spec(spec)
    # Compiled without a __pycache__ folder among the fixtures.
    writes, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = writes
    return module


# What a schema upgrade must keep as it was, and what today's code must store again from the same inputs:
# the runs, the files' bytes and accounting, the samples, the rejected and ignored lines, and the steps
# view's columns of the previous version (later versions add columns and semantics fields; readers whose
# parsing changed bump their parser version, so those are left out of the comparison).
FILES_SQL = """SELECT r.name, regexp_extract(f.path, '[^/]+$'), f.sha256, f.bytes, f.format, f.lines, f.stored,
                      f.ignored, f.rejected, f.rows, f.complete_bytes
               FROM files f JOIN runs r USING (run_id) ORDER BY 1, 2"""
CONTENT_SQL = {
    "runs": "SELECT name, framework, task, model FROM runs ORDER BY name",
    "files": FILES_SQL,
    "samples": "SELECT r.name, count(*), sum(response_len) FROM samples s JOIN runs r USING (run_id) GROUP BY 1 ORDER BY 1",
    "errors": "SELECT count(*) FROM ingest_errors",
    "ignored": "SELECT rule, sum(lines) FROM ignored_lines GROUP BY 1 ORDER BY 1",
}


def _steps_sql(columns: list[str]) -> str:
    return f"SELECT r.name, {', '.join('s.' + c for c in columns)} FROM steps s JOIN runs r USING (run_id) ORDER BY ALL"


def _raw_content(db: Path) -> tuple[dict[str, list[tuple]], list[str]]:
    """The previous store read as it lies on disk, with DuckDB alone (no upgrade): its content and the
    columns of its steps view."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        columns = [row[0] for row in con.execute("DESCRIBE steps").fetchall() if row[0] not in ("run_id", "flags")]
        content = {name: con.execute(sql).fetchall() for name, sql in CONTENT_SQL.items()}
        content["steps"] = con.execute(_steps_sql(columns)).fetchall()
        return content, columns
    finally:
        con.close()


def _content(db: Path, steps_columns: list[str]) -> dict[str, list[tuple]]:
    with Store.open(db) as store:
        content = {name: store.connection.execute(sql).fetchall() for name, sql in CONTENT_SQL.items()}
        content["steps"] = store.connection.execute(_steps_sql(steps_columns)).fetchall()
        return content


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("compatibility")
    previous = folder / "previous.duckdb"
    with gzip.open(FIXTURES / "previous_version.duckdb.gz", "rb") as source, open(previous, "wb") as target:
        shutil.copyfileobj(source, target)
    today = folder / "today.duckdb"
    _make_store_module().write_store(today)
    return previous, today


def test_a_store_of_the_previous_version_is_upgraded_keeping_what_it_held(stores):
    previous, _ = stores
    before, columns = _raw_content(previous)
    assert [row[0] for row in before["runs"]] == ["math", "verl-console", "verl-jsonl"]
    assert all(count for _, count, _ in before["samples"]) and before["steps"]
    after = _content(previous, columns)  # opening it upgrades it to today's schema
    assert after == before


def test_todays_code_stores_what_the_previous_version_stored(stores):
    previous, today = stores
    _, columns = _raw_content(previous)
    assert _content(today, columns) == _content(previous, columns)
