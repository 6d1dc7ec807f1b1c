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
def checked_store(db_path, fresh_store):
    """Run 'r': one step on two DP ranks and four DAPO batches.

    rank 0 samples (prompt, response): (10, 90), (10, 110) -> load 220
    rank 1 samples: (20, 180), (20, 200) -> load 420
    λ = 420 / mean(220, 420) = 420 / 320 = 1.3125.
    DAPO: kept/prompt_count = 2/4 and 3/4 -> kept share Σkept/Σprompts = 5/8 = 0.625.
    """
    con = open_store(fresh_store(db_path))
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


def test_unmeasurable_threshold_fails_unless_allowed(checked_store):
    """The run has no tool calls and no step timings: those thresholds cannot be measured."""
    result = invoke(checked_store, "--max-tool-p99-s", "5", "--max-step-cv", "0.1", "--json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.output)
    assert report["passed"] is False
    statuses = {c["threshold"]: c["status"] for c in report["checks"]}
    assert statuses == {"max_tool_p99_s": NOT_MEASURABLE, "max_step_cv": NOT_MEASURABLE}
    reasons = {c["threshold"]: c["reason"] for c in report["checks"]}
    assert reasons == {"max_tool_p99_s": "no tools data for the run",
                       "max_step_cv": "no stage step row in the stages summary"}
    table = invoke(checked_store, "--max-tool-p99-s", "5")
    assert table.exit_code == 1
    assert "not measurable" in table.output and "no tools data for the run" in table.output
    allowed = invoke(checked_store, "--max-tool-p99-s", "5", "--allow-unmeasurable")
    assert allowed.exit_code == 0, allowed.output
    assert "check passed" in allowed.output
    assert invoke(checked_store, "--max-tool-p99-s", "5", "--require-all").exit_code == 2


def test_a_step_range_without_data_fails_the_gate(checked_store):
    """The run's samples are at step 0 and its DAPO batches at workload steps 0 and 1."""
    assert invoke(checked_store, "--max-imbalance", "2", "--steps", "0").exit_code == 0
    empty = invoke(checked_store, "--max-imbalance", "2", "--allow-unmeasurable", "--steps", "5:9")
    assert empty.exit_code == 1
    assert "no data in steps 5:9" in empty.output and "Traceback" not in empty.output


@pytest.mark.parametrize("steps", ["9:5", "", "x:3"])
def test_a_reversed_or_empty_step_range_is_a_user_error(checked_store, steps):
    result = invoke(checked_store, "--max-imbalance", "2", "--steps", steps)
    assert result.exit_code == 2
    assert "--steps" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("limit", ["nan", "inf", "-0.5"])
def test_thresholds_must_be_finite_and_not_negative(checked_store, limit):
    result = invoke(checked_store, "--max-imbalance", limit)
    assert result.exit_code == 2
    assert "--max-imbalance must be a finite number >= 0" in result.output


def test_each_threshold_reads_a_column_its_analysis_returns(checked_store):
    from polytrace_cli.analyze.registry import all_analyses

    con = open_store(checked_store, read_only=True)
    try:
        for threshold in THRESHOLDS.values():
            columns = all_analyses()[threshold.analysis].summary(con, [1]).columns
            assert threshold.column in columns, threshold.option
            assert set(threshold.where) <= set(columns), threshold.option
    finally:
        con.close()


def test_a_summary_without_the_column_breaks_the_gate_instead_of_passing():
    renamed = pl.DataFrame({"run": ["a"], "lambda": [9.0]})
    with pytest.raises(RuntimeError, match="mean_lambda"):
        measured_value(renamed, THRESHOLDS["max_imbalance"], "a")


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
    assert failed([verdict(0.5, None, lower)])
    assert not failed([verdict(0.5, None, lower)], allow_unmeasurable=True)
