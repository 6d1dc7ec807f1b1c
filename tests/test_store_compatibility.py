"""A store written by the previous version of polytrace opens as it is (no upgrade) and holds what today's code
stores from the same inputs: the same runs, files rows (formats, parser versions, accounting), steps and
semantics. The store was written by `tests/fixtures/stores/make_store.py` (see its docstring)."""

from __future__ import annotations

import gzip
import importlib.util
import shutil
from pathlib import Path

import pytest

from polytrace_cli import Store

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "stores"


def _make_store_module():
    spec = importlib.util.spec_from_file_location("make_store", FIXTURES / "make_store.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FILES_SQL = """SELECT r.name, regexp_extract(f.path, '[^/]+$'), f.sha256, f.bytes, f.format, f.format_version,
                      f.parser_version, f.read_options, f.lines, f.stored, f.ignored, f.rejected, f.rows,
                      f.complete_bytes, f.resume_state IS NULL
               FROM files f JOIN runs r USING (run_id) ORDER BY 1, 2"""
CONTENT_SQL = {
    "runs": "SELECT name, framework, task, model, meta FROM runs ORDER BY name",
    "files": FILES_SQL,
    "steps": "SELECT r.name, s.* EXCLUDE (run_id) FROM steps s JOIN runs r USING (run_id) ORDER BY ALL",
    "samples": "SELECT r.name, count(*), sum(response_len) FROM samples s JOIN runs r USING (run_id) GROUP BY 1 ORDER BY 1",
    "semantics": "SELECT r.name, s.* EXCLUDE (run_id, decided_at) FROM run_semantics s JOIN runs r USING (run_id) ORDER BY 1",
    "errors": "SELECT count(*) FROM ingest_errors",
    "ignored": "SELECT rule, sum(lines) FROM ignored_lines GROUP BY 1 ORDER BY 1",
}


def _content(db: Path) -> dict[str, list[tuple]]:
    with Store.open(db, read_only=True, upgrade=False) as store:
        return {name: store.connection.execute(sql).fetchall() for name, sql in CONTENT_SQL.items()}


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("compatibility")
    previous = folder / "previous.duckdb"
    with gzip.open(FIXTURES / "previous_version.duckdb.gz", "rb") as source, open(previous, "wb") as target:
        shutil.copyfileobj(source, target)
    today = folder / "today.duckdb"
    _make_store_module().write_store(today)
    return previous, today


def test_a_store_of_the_previous_version_opens_without_an_upgrade(stores):
    previous, _ = stores
    # upgrade=False refuses an older schema or a steps view generated from other metric names.
    content = _content(previous)
    assert [row[0] for row in content["runs"]] == ["math", "verl-console", "verl-jsonl"]
    assert all(count for _, count, _ in content["samples"])


def test_todays_code_stores_what_the_previous_version_stored(stores):
    previous, today = stores
    before, after = _content(previous), _content(today)
    assert before["files"] and before["steps"]
    assert after == before
