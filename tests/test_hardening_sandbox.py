"""Paths are data and every connection that reads user data is confined: a walked folder's links out
are not followed, nothing is created outside the store's folder, a lake or a store from elsewhere
reads no other file, and `query` has a time and memory limit."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

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
