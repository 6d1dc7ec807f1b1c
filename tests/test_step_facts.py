"""A run's steps read from its step facts are the `steps` view's rows, however the facts were kept."""

from __future__ import annotations

import math
from pathlib import Path

import duckdb
import pytest

from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.store import open_store
from polytrace_cli.semantics import step_facts
from polytrace_cli.semantics import record as semantics
from polytrace_cli.store.catalog import STEP_COLUMNS

FIXTURES = Path(__file__).parent / "fixtures"
# Every fixture folder: console logs of each framework, verl's file logger, wandb, and the runs the
# semantics tests decide (those without step metrics too, whose facts and view are both empty).
FOLDERS = sorted(p for p in FIXTURES.glob("*/*") if p.is_dir() and p.name != "__pycache__") + [
    FIXTURES / "openrlhf", FIXTURES / "trl", FIXTURES / "wandb"]
COLUMNS = ["segment", "step", *STEP_COLUMNS, "is_validation_only", "has_testing", "has_checkpoint"]


def comparable(rows: list[tuple]) -> list[tuple]:
    return sorted(tuple("NaN" if isinstance(v, float) and math.isnan(v) else v for v in row) for row in rows)


def from_view(con: duckdb.DuckDBPyConnection, run_id: int) -> list[tuple]:
    return comparable(con.execute(f"SELECT {', '.join(COLUMNS)} FROM steps WHERE run_id = ?", [run_id]).fetchall())


def from_facts(con: duckdb.DuckDBPyConnection, run_id: int) -> list[tuple]:
    assert step_facts.refresh(con, run_id)
    every = comparable(con.execute(step_facts.run_steps_sql(list(STEP_COLUMNS)), [run_id]).fetchall())
    # With only the names the run's facts hold aggregated (the others NULL, no testing or checkpoint): the same.
    present = step_facts.present_names(con, run_id, list(STEP_COLUMNS))
    assert comparable(con.execute(step_facts.run_steps_sql(list(STEP_COLUMNS), present=present),
                                  [run_id]).fetchall()) == every
    return every


def run_ids(con: duckdb.DuckDBPyConnection) -> list[int]:
    return [row[0] for row in con.execute("SELECT DISTINCT run_id FROM step_metrics ORDER BY 1").fetchall()]


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_the_steps_of_every_fixture_run_read_from_facts_are_the_views(tmp_path, folder):
    con = open_store(tmp_path / "s.duckdb")
    ingest_paths(con, [folder])
    runs = [row[0] for row in con.execute("SELECT run_id FROM runs ORDER BY 1").fetchall()]
    assert runs
    for run_id in runs:  # a run without step metrics has no rows either way
        assert from_facts(con, run_id) == from_view(con, run_id)
    con.close()


@pytest.fixture()
def two_files(tmp_path) -> tuple[duckdb.DuckDBPyConnection, Path]:
    """One run of two files giving the same steps (verl's console log and its file logger)."""
    con = open_store(tmp_path / "s.duckdb")
    ingest_paths(con, [FIXTURES / "verl" / "console_v08", FIXTURES / "verl" / "file_logger"], run_name="both")
    return con, tmp_path


def test_facts_of_two_files_of_one_run_combine_as_the_view_does(two_files):
    con, _ = two_files
    (run_id,) = run_ids(con)
    assert con.execute("SELECT count(DISTINCT file_id) FROM step_facts").fetchall()[0][0] == 2
    assert from_facts(con, run_id) == from_view(con, run_id)
    con.close()


def test_facts_taken_with_another_catalog_or_cut_short_are_taken_again(two_files):
    con, _ = two_files
    (run_id,) = run_ids(con)
    expected = from_view(con, run_id)
    kept = sorted(con.execute("SELECT * FROM step_facts").fetchall(), key=repr)
    con.execute("UPDATE step_facts_files SET catalog = 'an older catalog'")
    con.execute("UPDATE step_facts SET value = -1")
    assert from_facts(con, run_id) == expected
    first = con.execute("SELECT min(file_id) FROM step_facts_files").fetchall()[0][0]
    con.execute("DELETE FROM step_facts_files WHERE file_id = ?", [first])  # a refresh stopped midway
    con.execute("UPDATE step_facts SET value = -1 WHERE file_id = ?", [first])
    assert from_facts(con, run_id) == expected
    assert sorted(con.execute("SELECT * FROM step_facts").fetchall(), key=repr) == kept
    con.close()


def test_a_file_read_again_or_removed_leaves_no_facts_behind(two_files):
    con, tmp_path = two_files
    (run_id,) = run_ids(con)
    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    log.write_bytes((FIXTURES / "verl" / "console_v05" / "train.log").read_bytes())
    ingest_paths(con, [log], run_name="both")
    files = {row[0] for row in con.execute("SELECT file_id FROM files").fetchall()}
    assert from_facts(con, run_id) == from_view(con, run_id)
    log.write_bytes(log.read_bytes()[: len(log.read_bytes()) // 2])  # shrunk: read again whole, a new file id
    ingest_paths(con, [log], run_name="both")
    assert from_facts(con, run_id) == from_view(con, run_id)
    now = {row[0] for row in con.execute("SELECT file_id FROM files").fetchall()}
    assert now != files
    for table in ("step_facts", "step_facts_files"):
        assert {row[0] for row in con.execute(f"SELECT DISTINCT file_id FROM {table}").fetchall()} <= now
    con.close()


def test_a_read_only_store_is_decided_from_the_view(two_files):
    con, tmp_path = two_files
    (run_id,) = run_ids(con)
    written = semantics.decide(con, run_id)
    con.close()
    reader = open_store(tmp_path / "s.duckdb", read_only=True)
    assert not step_facts.refresh(reader, run_id)
    assert semantics.decide(reader, run_id) == written
    reader.close()


def kept_steps(con: duckdb.DuckDBPyConnection, run_id: int) -> list[tuple]:
    """The run's steps as the kept table holds them, with the view's columns."""
    columns = list(STEP_COLUMNS)
    table = step_facts.run_steps_table(con, run_id, columns)
    listed = ", ".join(["segment", "step", *columns, "is_validation_only", "has_testing", "has_checkpoint"])
    return comparable(con.execute(f"SELECT {listed} FROM {table}").fetchall())


def test_the_kept_steps_of_a_run_follow_its_files_as_they_grow_and_change(two_files):
    """Kept once read, the run's steps are read again for the steps of new pairs only (a log that grew,
    a file added), and whole after any other change; each time they are the view's."""
    con, tmp_path = two_files
    (run_id,) = run_ids(con)
    assert kept_steps(con, run_id) == from_view(con, run_id)
    # Steps 2 and 4 are printed as two lines each, the log growing between them; step 3 is also a step
    # of the other files.
    lines = [b"step:1 - timing_s/gen:1.0 - timing_s/step:2.0\n", b"step:2 - timing_s/gen:1.5\n",
             b"step:2 - timing_s/step:3.0 - timing_s/testing:0.5\n", b"step:3 - timing_s/gen:0.5 - timing_s/step:1.0\n",
             b"step:4 - timing_s/gen:2.5 - timing_s/step:4.0\n", b"step:4 - val-core/acc:0.5\n"]
    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    statuses = []
    for end in range(2, len(lines) + 1):  # a file added, then grown line by line
        log.write_bytes(b"".join(lines[:end]))
        (report,) = ingest_paths(con, [log], run_name="both", format_name="verl-console", complete_lines=True)
        statuses.append(report.status)
        assert kept_steps(con, run_id) == from_view(con, run_id), end
    assert statuses == ["ingested"] + ["appended"] * (len(lines) - 2)
    made = con.execute("SELECT facts FROM step_facts_run_steps_made_from").fetchall()[0][0]
    con.execute("UPDATE step_facts_files SET catalog = 'an older catalog'")  # the facts are taken again
    assert kept_steps(con, run_id) == from_view(con, run_id)
    log.write_bytes(b"".join(lines[: len(lines) // 2]))  # shrunk: a new file id, the old one's pairs gone
    ingest_paths(con, [log], run_name="both", format_name="verl-console", complete_lines=True)
    assert kept_steps(con, run_id) == from_view(con, run_id)
    assert con.execute("SELECT facts FROM step_facts_run_steps_made_from").fetchall()[0][0] != made
    con.close()


def test_kept_steps_changed_in_a_transaction_rolled_back_are_as_before(two_files):
    con, _ = two_files
    (run_id,) = run_ids(con)
    expected = kept_steps(con, run_id)
    con.execute("BEGIN TRANSACTION")
    con.execute("DELETE FROM step_metrics WHERE step = (SELECT max(step) FROM step_metrics)")
    assert kept_steps(con, run_id) != expected  # read again whole: a file lost pairs
    con.execute("ROLLBACK")
    assert kept_steps(con, run_id) == expected == from_view(con, run_id)
    con.close()
