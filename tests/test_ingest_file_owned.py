"""Which tables hold rows that belong to one file: read from the schema, not listed by hand."""

from __future__ import annotations

from polytrace_cli.ingest.base import file_owned_tables
from polytrace_cli.ingest.ledger import delete_file_rows

KNOWN_FILE_OWNED = {
    "sample_rows", "sample_groups", "turns", "tool_calls", "rank_timings", "filter_batches",
    "step_metrics", "step_flags", "ingest_errors", "ignored_lines",
}


def test_the_schema_tables_with_a_file_id_are_file_owned(store):
    tables = set(file_owned_tables(store))
    assert KNOWN_FILE_OWNED <= tables
    assert "files" not in tables  # deleted last, by delete_file_rows itself
    assert "samples" not in tables  # a view over sample_rows and sample_groups
    assert "runs" not in tables


def test_a_new_table_with_a_file_id_is_included_and_cleared(store):
    store.execute("CREATE TABLE gpu_samples (file_id INTEGER NOT NULL, watts DOUBLE)")
    store.execute("CREATE TABLE run_notes (run_id INTEGER, note VARCHAR)")
    store.execute("CREATE VIEW gpu_view AS SELECT * FROM gpu_samples")
    tables = file_owned_tables(store)
    assert "gpu_samples" in tables
    assert "run_notes" not in tables and "gpu_view" not in tables

    store.execute("INSERT INTO gpu_samples VALUES (7, 300.0), (7, 310.0), (8, 250.0)")
    delete_file_rows(store, 7)
    assert store.execute("SELECT file_id, watts FROM gpu_samples").fetchall() == [(8, 250.0)]
