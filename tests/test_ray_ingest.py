"""`polytrace ingest --engine ray`: the Ray ingest stores exactly what the local ingest stores."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from polytrace_cli.cli import app
from polytrace_cli.ingest.base import file_owned_tables

try:
    import ray
except ModuleNotFoundError:
    if os.environ.get("CI"):
        raise  # CI installs the dev extra, which holds Ray: a missing Ray there is a failure
    pytest.skip("Ray is not installed (pip install 'polytrace[ray]')", allow_module_level=True)
runner = CliRunner()
FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """One local Ray for the module; the engine joins it instead of starting its own."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()


def _ok(*args):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    """Several small runs of every kind: synthetic PolyTrace workloads (packed, multi-turn, DAPO,
    reward timings), verl console logs with quarantined lines, a verl JSONL log, rollout dumps,
    OpenRLHF, a wandb run folder (config, summary, tables), a run whose summary is not JSON
    (rejected whole, and its run holds nothing else), a summary that is not JSON beside a verl log
    (rejected whole, stored under that log's run) and a file of unknown format (skipped)."""
    root = tmp_path_factory.mktemp("ray") / "logs"
    for task, seed in (("math", 1), ("code", 2), ("search", 3)):
        _ok("synth", "--task", task, "--out", root / f"synth_{task}", "--num-steps", 2, "--batch", 4, "--n", 2,
            "--dp-ranks", 2, "--seed", seed)
    for name in ("console_v05", "console_v01", "crash", "file_logger", "rollout"):
        shutil.copytree(FIXTURES / "verl" / name, root / f"verl_{name}")
    shutil.copytree(FIXTURES / "openrlhf", root / "openrlhf")
    shutil.copytree(FIXTURES / "wandb", root / "wandb_run")
    (root / "broken").mkdir()
    (root / "broken" / "wandb-summary.json").write_text("{not json\n")
    (root / "broken" / "notes.bin").write_bytes(b"\x00\x01\x02")
    (root / "verl_crash" / "wandb-summary.json").write_text("{not json\n")
    return root


def _comparable(rows: list[tuple]) -> list[tuple]:
    # NaN is stored as logged (policy_loss: nan) and never equals itself.
    return [tuple("NaN" if isinstance(v, float) and math.isnan(v) else v for v in row) for row in rows]


def _snapshot(db: Path) -> dict[str, list]:
    """Every file-owned table, `files` and `runs`, ids and timings replaced by run names and paths."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        out = {}
        for table in file_owned_tables(con):
            columns = [row[0] for row in con.execute(
                "SELECT column_name FROM duckdb_columns() WHERE table_name = ?", [table]).fetchall()]
            dropped = ", ".join(c for c in ("file_id", "run_id") if c in columns)
            out[table] = con.execute(
                f"SELECT r.name, f.path, t.* EXCLUDE ({dropped}) FROM {table} t JOIN files f USING (file_id) "
                "JOIN runs r ON r.run_id = f.run_id ORDER BY ALL").fetchall()
        out["files"] = con.execute(
            "SELECT r.name, f.* EXCLUDE (file_id, run_id, seconds, ingested_at) FROM files f JOIN runs r USING (run_id) "
            "ORDER BY ALL").fetchall()
        out["runs"] = con.execute("SELECT * EXCLUDE (run_id, created_at) FROM runs ORDER BY ALL").fetchall()
        return {table: _comparable(rows) for table, rows in out.items()}
    finally:
        con.close()


def test_ray_and_local_ingest_store_identical_tables(logs, tmp_path):
    local, on_ray = tmp_path / "local.duckdb", tmp_path / "ray.duckdb"
    local_run = runner.invoke(app, ["ingest", str(logs), "--db", str(local), "--json"])
    ray_run = runner.invoke(app, ["ingest", str(logs), "--db", str(on_ray), "--json", "--engine", "ray"])
    # The broken summary fails the command the same way on both engines.
    assert local_run.exit_code == ray_run.exit_code == 1
    local_reports, ray_reports = json.loads(local_run.stdout), json.loads(ray_run.stdout)
    keys = ("path", "status", "format", "run", "bytes", "lines", "stored", "ignored", "rejected", "rows")
    assert [{k: r[k] for k in keys} for r in ray_reports] == [{k: r[k] for k in keys} for r in local_reports]
    statuses = {r["status"] for r in ray_reports}
    assert {"ingested", "rejected", "skipped"} <= statuses

    expected, got = _snapshot(local), _snapshot(on_ray)
    assert set(got) == set(expected)
    for table in expected:
        assert got[table] == expected[table], table
    # The comparison covers every kind of row, and the rejected file's quarantine row.
    non_empty = {table for table, rows in expected.items() if rows}
    assert {"sample_groups", "sample_rows", "turns", "tool_calls", "step_metrics", "step_flags", "ingest_errors",
            "rank_timings", "filter_batches"} <= non_empty
    # A whole-file rejection is stored under a run that holds other files (line_no NULL: the whole
    # file); one whose run holds nothing else creates no run and is only reported.
    assert any(row[0] == "verl_crash" and row[1].endswith("wandb-summary.json") and row[2] is None
               for row in expected["ingest_errors"])
    assert not any(row[0] == "broken" for row in expected["runs"])
    broken = [r for r in ray_reports if "/broken/" in r["path"] and r["status"] == "rejected"]
    assert broken and all(r["run"] is None and r["notes"] for r in broken)
    assert any(row[3] for row in expected["runs"])  # the wandb config named a model


def test_ray_ingest_skips_unchanged_files_and_replaces_changed_ones(logs, tmp_path):
    folder = tmp_path / "logs"
    shutil.copytree(logs / "synth_math", folder / "synth_math")
    shutil.copytree(logs / "verl_console_v05", folder / "verl_console_v05")
    local, on_ray = tmp_path / "local.duckdb", tmp_path / "ray.duckdb"
    _ok("ingest", folder, "--db", local)
    _ok("ingest", folder, "--db", on_ray, "--engine", "ray")
    again = json.loads(_ok("ingest", folder, "--db", on_ray, "--engine", "ray", "--json").stdout)
    assert {r["status"] for r in again} == {"unchanged"}

    log = folder / "verl_console_v05" / "train.log"
    log.write_text(log.read_text() + log.read_text().splitlines()[-1] + "\n")
    _ok("ingest", folder, "--db", local)
    replaced = json.loads(_ok("ingest", folder, "--db", on_ray, "--engine", "ray", "--json").stdout)
    assert [r["status"] for r in replaced if r["path"].endswith("train.log")] == ["replaced"]
    assert _snapshot(on_ray) == _snapshot(local)


def test_ray_option_errors_are_one_line(tmp_path, monkeypatch):
    result = runner.invoke(app, ["ingest", str(FIXTURES / "openrlhf"), "--db", str(tmp_path / "s.duckdb"),
                                 "--engine", "spark"])
    assert result.exit_code != 0 and "--engine takes local or ray" in result.output
    result = runner.invoke(app, ["ingest", str(FIXTURES / "openrlhf"), "--db", str(tmp_path / "s.duckdb"),
                                 "--ray-address", "auto"])
    assert result.exit_code != 0 and "go with --engine ray" in result.output
    result = runner.invoke(app, ["ingest", str(FIXTURES / "openrlhf"), "--db", str(tmp_path / "s.duckdb"),
                                 "--engine", "ray", "--ray-address", "auto", "--workers", "2"])
    assert result.exit_code != 0 and "--workers sizes a local Ray" in result.output
    result = runner.invoke(app, ["ingest", str(FIXTURES / "openrlhf"), "--db", str(tmp_path / "s.duckdb"),
                                 "--engine", "ray", "--ray-address", "127.0.0.1:1"])
    assert result.exit_code != 0 and "cannot reach the Ray cluster at 127.0.0.1:1" in result.output
    assert not (tmp_path / "s.duckdb").exists()
    # Without Ray installed (an import that fails), --engine ray says how to get it.
    monkeypatch.setitem(sys.modules, "ray", None)
    result = runner.invoke(app, ["ingest", str(FIXTURES / "openrlhf"), "--db", str(tmp_path / "s.duckdb"),
                                 "--engine", "ray"])
    assert result.exit_code != 0
    assert "--engine ray needs Ray: pip install 'polytrace[ray]'" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "s.duckdb").exists()


def test_ray_stores_what_the_local_ingest_stores_in_batches(tmp_path, monkeypatch):
    """Consecutive small step files, which the local ingest reads in all-or-nothing batches, and the
    same files parsed one by one as Ray tasks end in the same store."""
    from polytrace_cli.ingest import batch as batching

    folder = tmp_path / "logs"
    _ok("synth", "--task", "math", "--out", folder / "steps", "--num-steps", 12, "--batch", 4, "--n", 2,
        "--dp-ranks", 2, "--seed", 4)
    step_files = sorted((folder / "steps").glob("packed_lengths_step_*.jsonl"))
    assert len(step_files) == 12
    batched = []
    store_batch = batching._store_batch

    def counting_store_batch(con, members, *args):
        batched.append(len(members))
        return store_batch(con, members, *args)

    monkeypatch.setattr(batching, "_store_batch", counting_store_batch)
    local, on_ray = tmp_path / "local.duckdb", tmp_path / "ray.duckdb"
    local_reports = json.loads(_ok("ingest", folder, "--db", local, "--json").stdout)
    assert sum(batched) >= 12  # every step file went in through a batch
    batched.clear()
    ray_reports = json.loads(_ok("ingest", folder, "--db", on_ray, "--json", "--engine", "ray").stdout)
    assert not batched
    keys = ("path", "status", "format", "run", "bytes", "lines", "stored", "ignored", "rejected", "rows")
    assert [{k: r[k] for k in keys} for r in ray_reports] == [{k: r[k] for k in keys} for r in local_reports]
    expected = _snapshot(local)
    assert len(expected["files"]) == len(local_reports) and len(expected["sample_groups"]) == 12 * 4
    assert _snapshot(on_ray) == expected


def test_an_error_in_the_ray_driver_is_one_line_and_exits_non_zero(tmp_path, monkeypatch):
    from polytrace_cli.ingest import ray_engine

    def failing_commit(*args):
        raise RuntimeError("disk said no\nsecond line of detail")

    monkeypatch.setattr(ray_engine, "commit", failing_commit)
    result = runner.invoke(app, ["ingest", str(FIXTURES / "openrlhf"), "--db", str(tmp_path / "s.duckdb"),
                                 "--engine", "ray"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert lines == ["error: the Ray ingest failed: RuntimeError: disk said no"], result.output
    assert not isinstance(result.exception, RuntimeError)


def test_damaged_files_store_under_ray_what_they_store_locally(tmp_path):
    """CR-only and BOM texts, a CSV with a bad line, a log whose records start past its first block:
    the Ray ingest finishes and stores what the local ingest stores."""
    import random
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from hostile_inputs import CASES

    folder = tmp_path / "logs"
    for index, writer in enumerate(CASES):
        writer(folder / f"case{index}", random.Random(index))
    (folder / "cr" / "export.csv").parent.mkdir(parents=True)
    (folder / "cr" / "export.csv").write_bytes(b'"Step","a"\r"1","1.5"\r"2","2.5"\r')
    local, on_ray = tmp_path / "local.duckdb", tmp_path / "ray.duckdb"
    local_run = runner.invoke(app, ["ingest", str(folder), "--db", str(local), "--json"])
    ray_run = runner.invoke(app, ["ingest", str(folder), "--db", str(on_ray), "--json", "--engine", "ray"])
    assert local_run.exit_code == ray_run.exit_code == 0, ray_run.output
    assert _snapshot(on_ray) == _snapshot(local)
    assert len(json.loads(ray_run.stdout)) == len(json.loads(local_run.stdout))


def test_what_is_written_to_stdout_during_a_ray_session_goes_to_stderr(capfd):
    from polytrace_cli.ingest.ray_engine import RaySettings, ray_session

    with ray_session(RaySettings()):
        os.write(1, b"(raylet) a worker died\n")
    os.write(1, b"[]\n")
    out, err = capfd.readouterr()
    assert out == "[]\n"
    assert "a worker died" in err
