"""`polytrace check`: thresholds against hand-computed metrics, pass/FAIL/not measurable, exit codes."""

from __future__ import annotations

import json

import polars as pl
import pytest
from typer.testing import CliRunner

from polytrace_cli.check import FAIL, NOT_MEASURABLE, PASS, THRESHOLDS, failed, measured_value, verdict
from polytrace_cli.cli import app
from polytrace_cli.store import open_store

runner = CliRunner()


@pytest.fixture
def checked_store(db_path):
    """Run 'r': one step on two DP ranks and four DAPO batches.

    rank 0 samples (prompt, response): (10, 90), (10, 110) -> load 220
    rank 1 samples: (20, 180), (20, 200) -> load 420
    λ = 420 / mean(220, 420) = 420 / 320 = 1.3125.
    DAPO: kept/prompt_count = 2/4 and 3/4 -> kept share Σkept/Σprompts = 5/8 = 0.625.
    """
    con = open_store(db_path)
    con.execute("INSERT INTO runs (run_id, name, task) VALUES (1, 'r', 'math')")
    con.executemany(
        "INSERT INTO sample_rows (run_id, file_id, step, rank, dp_rank, tp_rank, prompt_idx, sample_idx, prompt_len, response_len)"
        " VALUES (1, 0, 0, ?, ?, 0, ?, 0, ?, ?)",
        [(0, 0, 0, 10, 90), (0, 0, 1, 10, 110), (1, 1, 0, 20, 180), (1, 1, 1, 20, 200)],
    )
    con.executemany(
        "INSERT INTO filter_batches (run_id, file_id, workload_step, trainer_step, gen_batch_index, prompt_count, kept, used)"
        " VALUES (1, 0, ?, ?, 0, 4, ?, ?)",
        [(0, 1, 2, 2), (1, 1, 3, 2)],
    )
    con.close()
    return db_path


def invoke(db, *args):
    return runner.invoke(app, ["check", "r", "--db", str(db), *args])


def test_imbalance_pass_and_fail_exit_codes(checked_store):
    passed = invoke(checked_store, "--max-imbalance", "1.32")
    assert passed.exit_code == 0, passed.output
    assert "pass" in passed.output and "1.312" in passed.output and "check passed" in passed.output
    failed_run = invoke(checked_store, "--max-imbalance", "1.3")
    assert failed_run.exit_code == 1
    assert "FAIL" in failed_run.output and "check failed" in failed_run.output


def test_min_kept_share_json(checked_store):
    result = invoke(checked_store, "--min-kept-share", "0.7", "--max-imbalance", "2", "--json")
    assert result.exit_code == 1
    report = json.loads(result.output)
    assert report["passed"] is False
    checks = {c["threshold"]: c for c in report["checks"]}
    assert checks["min_kept_share"]["measured"] == pytest.approx(5 / 8)
    assert checks["min_kept_share"]["status"] == FAIL
    assert checks["max_imbalance"]["measured"] == pytest.approx(420 / 320)
    assert checks["max_imbalance"]["status"] == PASS


def test_unmeasurable_threshold_passes_unless_required(checked_store):
    """The run has no tool calls and no step timings: those thresholds cannot be measured."""
    result = invoke(checked_store, "--max-tool-p99-s", "5", "--max-step-cv", "0.1", "--json")
    assert result.exit_code == 0, result.output
    statuses = {c["threshold"]: c["status"] for c in json.loads(result.output)["checks"]}
    assert statuses == {"max_tool_p99_s": NOT_MEASURABLE, "max_step_cv": NOT_MEASURABLE}
    required = invoke(checked_store, "--max-tool-p99-s", "5", "--require-all")
    assert required.exit_code == 1
    assert "not measurable" in required.output


def test_length_thresholds(checked_store):
    """Responses 90, 110, 180, 200: p50 = 145, p99 = 180 + 0.97·20 = 199.4; no cap, so no clip ratio."""
    result = invoke(checked_store, "--max-p99-p50", "1.3", "--max-clip-ratio", "0.1", "--json")
    checks = {c["threshold"]: c for c in json.loads(result.output)["checks"]}
    assert checks["max_p99_p50"]["measured"] == pytest.approx(199.4 / 145)
    assert checks["max_p99_p50"]["status"] == FAIL
    assert checks["max_clip_ratio"]["status"] == NOT_MEASURABLE
    assert result.exit_code == 1


def test_user_errors_are_one_line(checked_store):
    no_threshold = invoke(checked_store)
    assert no_threshold.exit_code == 2 and "at least one threshold" in no_threshold.output
    unknown = runner.invoke(app, ["check", "nope", "--db", str(checked_store), "--max-imbalance", "1"])
    assert unknown.exit_code == 2 and "no run named nope" in unknown.output
    assert "Traceback" not in unknown.output + no_threshold.output


def test_measured_value_takes_the_worst_matching_row():
    summary = pl.DataFrame({"run": ["a", "a", "a", "b"], "tool": ["search", "code", "all", "search"],
                            "p99_s": [2.0, 7.5, 7.0, 100.0]})
    assert measured_value(summary, THRESHOLDS["max_tool_p99_s"], "a") == 7.5
    kept = pl.DataFrame({"run": ["a"], "kept_share": [None]}, schema={"run": pl.String, "kept_share": pl.Float64})
    assert measured_value(kept, THRESHOLDS["min_kept_share"], "a") is None
    lengths = pl.DataFrame({"run": ["a", "a"], "kind": ["prompt", "response"], "clip_ratio": [0.9, 0.05]})
    assert measured_value(lengths, THRESHOLDS["max_clip_ratio"], "a") == 0.05


def test_verdict_directions():
    upper, lower = THRESHOLDS["max_imbalance"], THRESHOLDS["min_kept_share"]
    assert verdict(1.2, 1.2, upper).status == PASS
    assert verdict(1.2, 1.21, upper).status == FAIL
    assert verdict(0.5, 0.49, lower).status == FAIL
    assert verdict(0.5, None, lower).status == NOT_MEASURABLE
    assert not failed([verdict(0.5, None, lower)])
    assert failed([verdict(0.5, None, lower)], require_all=True)
