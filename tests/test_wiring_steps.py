"""`polytrace steps`: expected_step_s and top_cause from explain's decomposition, on a verl console
log generated with causes injected at known steps."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from polytrace_cli.cli import app

runner = CliRunner()
INJECTED = {33: "dp_imbalance", 45: "weight_sync", 57: "unexplained"}
SIZES = {33: "1.8", 45: "25", 57: "2.0"}
VALIDATE_EVERY = 20


def _ok(*args) -> str:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.fixture(scope="module")
def verl_store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wiring_steps")
    injections = [arg for step, cause in INJECTED.items() for arg in ("--inject", f"{step}:{cause}:{SIZES[step]}")]
    _ok("synth", "--task", "math", "--format", "verl-console", "--out", tmp / "logs", "--num-steps", 80,
        "--batch", 128, "--n", 8, "--dp-ranks", 8, "--max-response-len", 8192, "--seed", 7,
        "--validate-every", VALIDATE_EVERY, *injections)
    db = tmp / "store.duckdb"
    _ok("ingest", tmp / "logs", "--run", "verl", "--db", db)
    return db


def test_injected_steps_name_their_cause(verl_store):
    rows = {row["step"]: row for row in json.loads(_ok("steps", "verl", "--json", "--db", verl_store))}
    for step, cause in INJECTED.items():
        assert rows[step]["top_cause"] == cause
    for step in range(VALIDATE_EVERY, 81, VALIDATE_EVERY):
        assert rows[step]["top_cause"] == "validation"
    # Ordinary training steps are not slow: no cause is named for them.
    ordinary = [row for step, row in rows.items()
                if step not in INJECTED and step % VALIDATE_EVERY and step > 5]
    assert len(ordinary) > 50
    assert all(row["top_cause"] is None for row in ordinary)


def test_expected_is_the_model_at_the_steps_workload(verl_store):
    """step_s − expected_step_s is what the workload does not explain: the step's unexplained,
    weight-sync, warm-up, validation and checkpoint seconds in explain's decomposition."""
    rows = {row["step"]: row for row in json.loads(_ok("steps", "verl", "--json", "--db", verl_store))}
    timed = [row for row in rows.values() if row["step_s"] is not None]
    assert all(row["expected_step_s"] is not None for row in timed)
    outside_model = {"unexplained", "weight_sync", "warmup", "validation", "checkpoint"}
    for step in (*INJECTED, 20, 30):
        detail = json.loads(_ok("explain", "verl", "--step", step, "--json", "--db", verl_store))["steps"][0]
        residual = sum(c["seconds"] for c in detail["causes"] if c["cause"] in outside_model)
        assert rows[step]["step_s"] - rows[step]["expected_step_s"] == pytest.approx(residual, abs=1e-6)
    # The injected slow generation doubles gen: the step is far above its own model.
    assert rows[57]["step_s"] - rows[57]["expected_step_s"] > 0.3 * rows[57]["expected_step_s"]


def test_a_step_range_keeps_the_whole_runs_model(verl_store):
    whole = {row["step"]: row for row in json.loads(_ok("steps", "verl", "--json", "--db", verl_store))}
    part = json.loads(_ok("steps", "verl", "--steps", "50:60", "--json", "--db", verl_store))
    assert [row["step"] for row in part] == list(range(50, 61))
    for row in part:
        assert row["expected_step_s"] == whole[row["step"]]["expected_step_s"]
        assert row["top_cause"] == whole[row["step"]]["top_cause"]


def test_runs_without_timings_leave_the_columns_empty(tmp_path):
    _ok("synth", "--task", "math", "--out", tmp_path / "traces", "--num-steps", 3, "--batch", 8, "--n", 2,
        "--dp-ranks", 2, "--seed", 1)
    db = tmp_path / "store.duckdb"
    _ok("ingest", tmp_path / "traces", "--run", "traces", "--db", db)
    rows = json.loads(_ok("steps", "traces", "--json", "--db", db))
    assert len(rows) == 3
    assert all(row["expected_step_s"] is None and row["top_cause"] is None for row in rows)
