"""`polytrace lake`: the store as a hive-partitioned Parquet lake, read back through `--db LAKE`."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from conftest import copy_store
from polytrace_cli.cli import app
from polytrace_cli.store import open_store
from polytrace_cli.store.lake import open_lake, partition_name, store_tables, write_lake
from polytrace_cli.semantics.step_facts import DERIVED_TABLES

runner = CliRunner()
FIXTURES = Path(__file__).parent / "fixtures"


def _invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def _ok(*args):
    result = _invoke(*args)
    assert result.exit_code == 0, result.output
    return result


def _synth(folder: Path, task: str, seed: int) -> Path:
    _ok("synth", "--task", task, "--out", folder, "--num-steps", 3, "--batch", 4, "--n", 4, "--dp-ranks", 2,
        "--seed", seed)
    return folder


def _build_three_runs(root: Path, db: Path) -> Path:
    """A store of three runs: two synthetic PolyTrace workloads (math, code) under root/logs and a verl
    console log whose run has quarantined lines and step flags (rows only reachable through file_id)."""
    _ok("ingest", _synth(root / "logs" / "alpha", "math", 1), "--db", db, "--task", "math")
    _ok("ingest", _synth(root / "logs" / "beta run", "code", 2), "--db", db, "--task", "code")
    _ok("ingest", FIXTURES / "verl" / "console_v05", "--db", db, "--run", "verl/console", "--task", "math")
    return db


@pytest.fixture(scope="module")
def three_runs_once(tmp_path_factory) -> Path:
    """The three-run store, built once for the module; its logs are under its folder's logs/."""
    root = tmp_path_factory.mktemp("three-runs")
    return _build_three_runs(root, root / "store.duckdb")


@pytest.fixture
def three_runs(three_runs_once, db_path):
    """A copy of the three-run store for one test (its logs stay where the store read them)."""
    return copy_store(three_runs_once, db_path)


def _counts(con, tables):
    return {t: con.execute(f'SELECT count(*) FROM "{t}"').fetchall()[0][0] for t in tables}


def test_lake_round_trips_every_table(three_runs, tmp_path):
    lake = tmp_path / "lake"
    _ok("lake", lake, "--db", three_runs)
    con = open_store(three_runs, read_only=True)
    tables = store_tables(con)
    partitioned = [t.name for t in tables if t.partitioned]
    assert {"runs", "files", "ingest_errors", "ignored_lines", "sample_groups", "step_metrics"} <= set(partitioned)
    store_counts = _counts(con, [t.name for t in tables])
    # Per run and table, as a hive-partitioned reader (DuckDB here; Spark and Trino alike) sees it.
    per_run_store = {}
    for table in partitioned:
        link = ("run_id" if any(c == "run_id" for c, _ in next(t for t in tables if t.name == table).columns)
                else "file_id")
        sql = (f"SELECT r.name, count(*) FROM {table} x JOIN runs r USING (run_id) GROUP BY 1" if link == "run_id"
               else f"SELECT r.name, count(*) FROM {table} x JOIN files f USING (file_id) "
                    f"JOIN runs r ON r.run_id = f.run_id GROUP BY 1")
        per_run_store[table] = dict(con.execute(sql).fetchall())
    con.close()

    reader = duckdb.connect()
    for table in partitioned:
        files = list((lake / table).glob("*/*.parquet"))
        if not files:
            assert store_counts[table] == 0
            continue
        rows = reader.execute(
            f"SELECT run, count(*) FROM read_parquet('{lake / table}/*/*.parquet', hive_partitioning = true) "
            "GROUP BY run").fetchall()
        # The percent-encoded partition values decode to the run names.
        assert dict(rows) == per_run_store[table], table
    assert reader.execute(f"SELECT count(*) FROM '{lake}/metric_aliases/data.parquet'").fetchall()[0][0] \
        == store_counts["metric_aliases"]
    # Tables reached only through file_id land under their run.
    assert (lake / "ingest_errors" / partition_name("verl/console") / "data.parquet").exists()
    assert partition_name("verl/console") == "run=verl%2Fconsole"
    assert (lake / "runs" / "run=beta%20run" / "data.parquet").exists()

    lake_con = open_lake(lake)
    assert _counts(lake_con, list(store_counts)) == store_counts
    lake_con.close()


def test_manifest_lists_every_file_with_its_hash(three_runs, tmp_path):
    lake = tmp_path / "lake"
    _ok("lake", lake, "--db", three_runs)
    manifest = json.loads((lake / "manifest.json").read_text())
    con = open_store(three_runs, read_only=True)
    assert manifest["schema_version"] == con.execute("SELECT max(version) FROM schema_migrations").fetchall()[0][0]
    con.close()
    assert sorted(manifest["runs"]) == ["alpha", "beta run", "verl/console"]
    assert all(len(entry["fingerprint"]) == 64 for entry in manifest["runs"].values())
    on_disk = sorted(p.relative_to(lake).as_posix() for p in lake.rglob("*.parquet"))
    assert sorted(entry["path"] for entry in manifest["files"]) == on_disk
    import hashlib
    for entry in manifest["files"]:
        assert hashlib.sha256((lake / entry["path"]).read_bytes()).hexdigest() == entry["sha256"]
    assert {"samples", "steps"} <= set(manifest["views"])


def test_lake_has_the_store_tables_and_views_with_their_columns(three_runs, tmp_path):
    lake = tmp_path / "lake"
    _ok("lake", lake, "--db", three_runs)
    columns_sql = ("SELECT table_name, column_name, data_type FROM information_schema.columns "
                   "WHERE table_schema = 'main' ORDER BY table_name, ordinal_position")
    con = open_store(three_runs, read_only=True)
    expected = con.execute(columns_sql).fetchall()
    con.close()
    derived = {row for row in expected if row[0] in DERIVED_TABLES}
    assert {table for table, _, _ in derived} == set(DERIVED_TABLES)  # kept in the store, not written
    lake_con = open_lake(lake)
    assert lake_con.execute(columns_sql).fetchall() == [row for row in expected if row not in derived]
    lake_con.close()


def _close(a, b):
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    return a == b


def test_read_commands_give_the_same_numbers_on_the_lake(three_runs, tmp_path):
    lake = tmp_path / "lake"
    _ok("lake", lake, "--db", three_runs)
    from_store = json.loads(_ok("analyze", "--json", "--db", three_runs).output)
    from_lake = json.loads(_ok("analyze", "--json", "--db", lake).output)
    assert from_store.keys() == from_lake.keys()
    assert sum(len(rows) for rows in from_store.values()) > 10
    # Sums over rows read in another order may differ in the last bits.
    for name in from_store:
        assert _close(from_store[name], from_lake[name]), name
    assert _ok("runs", "--json", "--db", lake).output == _ok("runs", "--json", "--db", three_runs).output
    sql = "select run_id, count(*) as n, sum(response_len) as t from samples group by 1 order by 1"
    assert _ok("query", sql, "--json", "--db", lake).output == _ok("query", sql, "--json", "--db", three_runs).output
    report = _ok("report", "alpha", "--db", lake, "--out", tmp_path / "report")
    assert (tmp_path / "report" / "alpha" / "index.html").exists(), report.output


def test_writing_into_a_lake_is_a_one_line_error(three_runs, tmp_path):
    lake = tmp_path / "lake"
    _ok("lake", lake, "--db", three_runs)
    result = _invoke("ingest", FIXTURES / "verl" / "console_v03", "--db", lake)
    assert result.exit_code != 0
    assert "read-only" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_rerunning_rewrites_only_the_changed_run(tmp_path, db_path):
    three_runs = _build_three_runs(tmp_path, db_path)  # its own logs: the test adds a file to alpha's
    lake = tmp_path / "lake"
    first = write_lake(open_store(three_runs, read_only=True), lake)
    assert sorted(first.written) == ["alpha", "beta run", "verl/console"]
    before = {p: (p.stat().st_mtime_ns, p.stat().st_ino) for p in lake.rglob("*.parquet") if "run=" in str(p)}

    again = json.loads(_ok("lake", lake, "--db", three_runs, "--json").output)
    assert again["written"] == [] and sorted(again["unchanged"]) == ["alpha", "beta run", "verl/console"]

    # One more file for run alpha: only alpha's partitions are rewritten.
    extra = tmp_path / "extra"
    _synth(extra, "math", 7)
    shutil.copy(extra / "packed_lengths_step_0.jsonl", tmp_path / "logs" / "alpha" / "packed_lengths_step_9.jsonl")
    _ok("ingest", tmp_path / "logs" / "alpha", "--db", three_runs)
    third = json.loads(_ok("lake", lake, "--db", three_runs, "--json").output)
    assert third["written"] == ["alpha"] and sorted(third["unchanged"]) == ["beta run", "verl/console"]
    after = {p: (p.stat().st_mtime_ns, p.stat().st_ino) for p in lake.rglob("*.parquet") if "run=" in str(p)}
    changed = {p for p in set(before) | set(after) if before.get(p) != after.get(p)}
    assert changed and all("run=alpha" in str(p) for p in changed)
    lake_con = open_lake(lake)
    store_con = open_store(three_runs, read_only=True)
    sql = "SELECT run_id, count(*) FROM samples GROUP BY 1 ORDER BY 1"
    assert lake_con.execute(sql).fetchall() == store_con.execute(sql).fetchall()
    lake_con.close()
    store_con.close()


def test_runs_gone_from_the_store_are_kept_unless_pruned(three_runs, three_runs_once, tmp_path):
    lake = tmp_path / "lake"
    _ok("lake", lake, "--db", three_runs)
    smaller = tmp_path / "smaller.duckdb"
    _ok("ingest", three_runs_once.parent / "logs" / "alpha", "--db", smaller, "--task", "math")
    kept = _invoke("lake", lake, "--db", smaller)
    assert kept.exit_code == 0
    assert "kept 2 run(s) no longer in the store: beta run, verl/console (--prune removes them)" in kept.output
    assert (lake / "runs" / "run=beta%20run").exists()
    pruned = json.loads(_ok("lake", lake, "--db", smaller, "--prune", "--json").output)
    assert sorted(pruned["removed"]) == ["beta run", "verl/console"]
    assert not list(lake.rglob("run=beta%20run")) and not list(lake.rglob("run=verl%2Fconsole"))
    assert json.loads(_ok("runs", "--json", "--db", lake).output)[0]["run"] == "alpha"
    assert len(json.loads(_ok("runs", "--json", "--db", lake).output)) == 1


def test_named_runs_only(three_runs, tmp_path):
    lake = tmp_path / "lake"
    result = json.loads(_ok("lake", lake, "alpha", "--db", three_runs, "--json").output)
    assert result["written"] == ["alpha"]
    assert [row["run"] for row in json.loads(_ok("runs", "--json", "--db", lake).output)] == ["alpha"]
    unknown = _invoke("lake", lake, "nope", "--db", three_runs)
    assert unknown.exit_code != 0 and "no run named nope" in unknown.output


def test_bad_lake_targets_are_one_line_errors(three_runs, tmp_path):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    result = _invoke("lake", busy, "--db", three_runs)
    assert result.exit_code != 0 and "holds no lake manifest" in result.output
    lake = tmp_path / "lake"
    _ok("lake", lake, "--db", three_runs)
    next(lake.glob("sample_groups/*/*.parquet")).unlink()
    missing = _invoke("runs", "--db", lake)
    assert missing.exit_code != 0 and "lacks" in missing.output and "Traceback" not in missing.output


def test_the_python_interface_reads_a_lake_read_only(three_runs, tmp_path):
    from polytrace_cli import Store
    from polytrace_cli.errors import StoreError

    lake = tmp_path / "lake"
    _ok("lake", lake, "--db", three_runs)
    with Store.open(three_runs, read_only=True) as store, Store.open(lake, read_only=True) as from_lake:
        assert from_lake.runs().equals(store.runs())
    with pytest.raises(StoreError, match="read-only"):
        Store.open(lake)
