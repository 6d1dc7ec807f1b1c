"""Nothing an ingest writes goes outside the store's own folder: the copies it reads instead of its inputs
(decompressed, rewritten for a byte order mark or CR line ends, a grown log's appended part, a trace's
pieces, a file whose name is not UTF-8) are made in the store's scratch folder and removed afterwards,
and what a killed ingest left there is removed at the next open for writing.

The system's temporary folder is pointed at a folder that does not exist (inside an empty one): a file
made there even for a moment fails the ingest, and the folder appearing would show it."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from polytrace_cli.cli import app
from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.ingest.files import walk
from polytrace_cli.store import open_store
from polytrace_cli.scratch import clear_scratch, scratch_folder, scratch_root


def _verl(steps, start: int = 1) -> bytes:
    return "".join(json.dumps({"step": s, "data": {"timing_s/step": 10.0 + s}}) + "\n"
                   for s in range(start, start + steps)).encode()


@pytest.fixture
def no_temp_folder(tmp_path, monkeypatch) -> Path:
    """The system's temporary folder, as Python and native libraries see it, set to a folder that does
    not exist inside the empty folder returned."""
    empty = tmp_path / "system-temp"
    empty.mkdir()
    missing = empty / "temp"
    monkeypatch.setenv("TMPDIR", str(missing))
    monkeypatch.setattr(tempfile, "tempdir", str(missing))
    return empty


def _inputs(logs: Path) -> dict[str, int]:
    """Inputs each read from a copy, and the steps each holds."""
    logs.mkdir()
    zstandard = pytest.importorskip("zstandard")
    (logs / "a.jsonl.gz").write_bytes(gzip.compress(_verl(3)))
    (logs / "b.jsonl.bz2").write_bytes(bz2.compress(_verl(4)))
    (logs / "c.jsonl.xz").write_bytes(lzma.compress(_verl(5)))
    (logs / "d.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(_verl(6)))
    (logs / "e.jsonl").write_bytes(b"\xef\xbb\xbf" + _verl(2))  # a byte order mark: read from a rewritten copy
    (logs / os.fsdecode(b"f-\xff.jsonl")).write_bytes(_verl(7))  # a name that is not UTF-8: linked under one
    events = [{"ph": "X", "name": "actor_update", "ts": 10 * i, "dur": 5, "pid": 1, "tid": 1} for i in range(3)]
    (logs / "trace.json").write_text(json.dumps({"traceEvents": events}))
    return {"a.jsonl.gz": 3, "b.jsonl.bz2": 4, "c.jsonl.xz": 5, "d.jsonl.zst": 6, "e.jsonl": 2}


def test_an_ingest_of_copied_inputs_writes_nothing_outside_the_store_folder(tmp_path, no_temp_folder,
                                                                             fresh_store):
    logs = tmp_path / "logs"
    steps = _inputs(logs)
    place = tmp_path / "place"
    place.mkdir()
    db = fresh_store(place / "store.duckdb")
    con = open_store(db)
    try:
        reports = {Path(os.fsencode(r.path).decode("utf-8", "replace")).name: r for r in ingest_paths(con, [logs])}
        for name, count in steps.items():
            assert (reports[name].status, reports[name].stored) == ("ingested", count), reports[name]
        assert [r.status for r in reports.values()].count("ingested") == len(reports) == 7, reports
        assert con.execute("SELECT count(*) FROM spans").fetchall() == [(3,)]
        # A log that grew is read from a copy of its appended lines; one being written, of its complete lines.
        with open(logs / "e.jsonl", "ab") as handle:
            handle.write(_verl(2, start=3))
        [grown] = ingest_paths(con, [logs / "e.jsonl"])
        with open(logs / "e.jsonl", "ab") as handle:
            handle.write(_verl(1, start=5) + b'{"step": 6, "da')
        [written] = ingest_paths(con, [logs / "e.jsonl"], complete_lines=True)
        assert (grown.status, written.status) == ("replaced", "replaced")  # a rewritten copy is read whole
        assert con.execute("SELECT max(step) FROM step_metrics m JOIN files f USING (file_id)"
                           " WHERE f.path LIKE '%e.jsonl'").fetchall() == [(5,)]
    finally:
        con.close()
    assert list(no_temp_folder.iterdir()) == []
    assert sorted(p.name for p in place.iterdir()) == ["store.duckdb"]


def test_appended_reads_of_a_plain_log_write_nothing_outside_the_store_folder(tmp_path, no_temp_folder, store,
                                                                              db_path):
    log = tmp_path / "train.jsonl"
    log.write_bytes(_verl(3))
    ingest_paths(store, [log])
    log.write_bytes(_verl(5))
    [grown] = ingest_paths(store, [log])
    log.write_bytes(_verl(6) + b'{"step": 7')
    [written] = ingest_paths(store, [log], complete_lines=True)
    assert (grown.status, grown.stored, written.status, written.stored) == ("appended", 2, "appended", 1)
    assert list(no_temp_folder.iterdir()) == []
    assert not scratch_root(db_path).exists()


def test_the_command_line_ingest_of_compressed_logs_leaves_nothing_outside(tmp_path, no_temp_folder):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "train.jsonl.gz").write_bytes(gzip.compress(_verl(4)))
    db = tmp_path / "db" / "store.duckdb"
    db.parent.mkdir()
    result = CliRunner().invoke(app, ["ingest", str(logs), "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert list(no_temp_folder.iterdir()) == []
    assert sorted(p.name for p in db.parent.iterdir()) == ["store.duckdb"]


def test_a_scratch_folder_a_killed_ingest_left_is_removed_at_the_next_write_open(db_path, fresh_store):
    fresh_store(db_path)
    left = scratch_root(db_path) / "999999999-read-x" / "logs"
    left.mkdir(parents=True)
    (left / "train.log").write_bytes(b"x" * 1000)
    open_store(db_path, read_only=True).close()  # a reader leaves it: it may not write beside the store
    assert left.exists()
    open_store(db_path).close()
    assert not scratch_root(db_path).exists()


def test_clear_scratch_keeps_this_process_s_own_folders(db_path):
    with scratch_folder(db_path, "read") as mine:
        (mine / "part").write_text("being read")
        other = scratch_root(db_path) / "1-read-abc"
        other.mkdir()
        clear_scratch(db_path)
        assert (mine / "part").exists() and not other.exists()
    assert not scratch_root(db_path).exists()


def test_a_walk_of_the_folder_holding_the_store_leaves_its_scratch_folder_out(tmp_path):
    (tmp_path / "store.duckdb").write_bytes(b"")
    copy = scratch_root(tmp_path / "store.duckdb") / "42-read-x" / "logs"
    copy.mkdir(parents=True)
    (copy / "train.jsonl").write_bytes(_verl(1))
    (tmp_path / "train.jsonl").write_bytes(_verl(1))
    # A folder named like a scratch folder with no store beside it is an input folder like any other.
    (tmp_path / "other.scratch").mkdir()
    (tmp_path / "other.scratch" / "x.jsonl").write_bytes(_verl(1))
    assert [path.relative_to(tmp_path).as_posix() for path, _, _ in walk([tmp_path])] == [
        "other.scratch/x.jsonl", "train.jsonl"]
