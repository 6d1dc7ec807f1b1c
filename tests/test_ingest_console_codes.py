"""Every console rejection carries an error code, and steps and values a column cannot hold are
rejected line by line (file, line, code), never stored, never NULL, never ending the file."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from polytrace_cli.cli import app
from polytrace_cli.ingest.driver import ingest_paths


def _ingest_one(store, path: Path):
    [report] = ingest_paths(store, [path])
    assert report.status == "ingested", report.message
    assert report.lines == report.stored + report.ignored + report.rejected
    return report


def _errors(store) -> list[tuple]:
    return store.execute("SELECT line_no, code, reason FROM ingest_errors ORDER BY line_no").fetchall()


def test_dirty_verl_console_log_gives_every_rejection_a_code(store, tmp_path):
    log = tmp_path / "train.log"
    log.write_bytes(
        b"step:1 - timing_s/step:10.0 - actor/loss:0.5\n"     # 1 stored
        b"hello \x00 world\n"                                  # 2 NUL byte: encoding-error
        b"caf\xe9 au lait\n"                                   # 3 not UTF-8: encoding-error
        b"step:abc - actor/loss:0.4\n"                         # 4 step is not a number: unparsable-line
        b"step:2 - actor/loss:0.4 - broken\n"                  # 5 a piece is not key:value: unparsable-line
        b"step:2147483648 - actor/loss:0.3\n"                  # 6 out-of-range
        b"step:-2147483649 - actor/loss:0.3\n"                 # 7 out-of-range
        b"step:1e20 - actor/loss:0.3\n"                        # 8 out-of-range
        b"step:2.5 - actor/loss:0.3\n"                         # 9 type-error
        b"step:2 - actor/loss:1e400 - timing_s/step:11.0\n"    # 10 a value no double holds: out-of-range
        b"step:3 - actor/loss:inf - timing_s/step:12.0\n"      # 11 stored: a printed infinity is one
        b"step:2147483647 - actor/loss:0.2\n"                  # 12 stored: the largest step
    )
    report = _ingest_one(store, log)
    assert (report.lines, report.stored, report.ignored, report.rejected) == (12, 3, 0, 9)
    assert [(line, code) for line, code, _ in _errors(store)] == [
        (2, "encoding-error"), (3, "encoding-error"), (4, "unparsable-line"), (5, "unparsable-line"),
        (6, "out-of-range"), (7, "out-of-range"), (8, "out-of-range"), (9, "type-error"), (10, "out-of-range")]
    reasons = {line: reason for line, _, reason in _errors(store)}
    assert reasons[6] == "step 2147483648 is out of range (-2147483648..2147483647)"
    assert reasons[9] == "step 2.5 is not a whole number"
    assert reasons[10] == "key actor/loss: value 1e400 is out of range for a double"
    assert store.execute("SELECT count(*) FROM ingest_errors WHERE code IS NULL").fetchall() == [(0,)]
    assert store.execute("SELECT DISTINCT step FROM step_metrics ORDER BY step").fetchall() == [
        (1,), (3,), (2147483647,)]
    assert store.execute("SELECT value FROM step_metrics WHERE step = 3 AND key = 'actor/loss'").fetchall() == [
        (float("inf"),)]


@pytest.mark.parametrize("printed, step, code", [
    ("2147483647", 2147483647, None),
    ("-2147483648", -2147483648, None),
    ("3.0", 3, None),
    ("3e0", 3, None),
    ("2147483648", None, "out-of-range"),
    ("-2147483649", None, "out-of-range"),
    ("1e20", None, "out-of-range"),
    ("99999999999999999999999999", None, "out-of-range"),
    ("2.5", None, "type-error"),
    ("1e-3", None, "type-error"),
])
def test_verl_console_step_follows_the_step_rule_of_every_format(store, tmp_path, printed, step, code):
    log = tmp_path / "train.log"
    log.write_text(f"step:1 - a:1\nstep:{printed} - a:2\nstep:2147483647 - a:3\n")
    report = _ingest_one(store, log)
    assert [(line, got) for line, got, _ in _errors(store)] == ([] if code is None else [(2, code)])
    stored = store.execute("SELECT line_no, step FROM step_metrics ORDER BY line_no").fetchall()
    assert stored == [(1, 1)] + ([(2, step)] if code is None else []) + [(3, 2147483647)]
    assert report.stored == 3 - (code is not None)


def test_dirty_openrlhf_console_log_gives_every_rejection_a_code(store, tmp_path):
    log = tmp_path / "train.log"
    huge = "1" + "0" * 400
    log.write_bytes("\n".join([
        "✨ Global step 1: {'policy_loss': 0.5, 'timing/step_total': 10.0}",     # 1 stored
        "✨ Global step 2: {'policy_loss': 0.5,",                                # 2 unparsable-line
        "✨ Global step 99999999999: {'policy_loss': 0.4}",                      # 3 out-of-range
        "✨ Global step 2.5: {'policy_loss': 0.4}",                              # 4 type-error
        f"✨ Global step 2: {{'policy_loss': {huge}}}",                          # 5 out-of-range (an int)
        "✨ Global step 2: {'policy_loss': 1e400}",                              # 6 out-of-range
        "✨ Global step 2: {'policy_loss': inf, 'reward': np.float64(-inf)}",    # 7 stored
        "✨ Evaluation completed in 0:00:05, global_step 4294967296, eval_metrics: {'pass1': 0.5}",  # 8
    ]).encode() + b"\n\xff\xfe log line\nsome \x00 text\n")                      # 9, 10 encoding-error
    report = _ingest_one(store, log)
    assert (report.lines, report.stored, report.ignored, report.rejected) == (10, 2, 0, 8)
    assert [(line, code) for line, code, _ in _errors(store)] == [
        (2, "unparsable-line"), (3, "out-of-range"), (4, "type-error"), (5, "out-of-range"), (6, "out-of-range"),
        (8, "out-of-range"), (9, "encoding-error"), (10, "encoding-error")]
    assert store.execute("SELECT count(*) FROM ingest_errors WHERE code IS NULL").fetchall() == [(0,)]
    assert store.execute("SELECT step, key, value FROM step_metrics ORDER BY line_no, key").fetchall() == [
        (1, "policy_loss", 0.5), (1, "timing/step_total", 10.0),
        (2, "policy_loss", float("inf")), (2, "reward", float("-inf"))]


def test_out_of_range_step_end_to_end_exits_cleanly(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("step:1 - a:1\nstep:2147483648 - a:2\nstep:2 - a:3\n")
    db = tmp_path / "store.duckdb"
    result = CliRunner().invoke(app, ["ingest", str(log), "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    strict = CliRunner().invoke(app, ["ingest", str(log), "--db", str(tmp_path / "strict.duckdb"), "--strict"])
    assert strict.exit_code != 0 and "Traceback" not in strict.output


def _meta(store) -> dict:
    import json

    return json.loads(store.execute("SELECT meta FROM runs").fetchall()[0][0])


def test_undecided_step_time_inclusion_is_stored_as_null_and_never_overwrites_a_decision(store, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    # No testing or checkpoint timer at all: neither can be decided.
    undecided = run / "a.log"
    undecided.write_text("".join(f"step:{s} - timing_s/gen:10.0 - timing_s/step:10.5\n" for s in range(1, 4)))
    _ingest_one(store, undecided)
    meta = _meta(store)
    assert meta["step_time_includes_testing"] is None and meta["step_time_includes_checkpoint"] is None
    assert {"step_time_includes_testing", "step_time_includes_checkpoint"} <= meta.keys()
    # A second log of the same run with testing outside the step time decides testing: False.
    decided = run / "b.log"
    decided.write_text("".join(
        f"step:{s} - timing_s/gen:10.0 - timing_s/testing:8.0 - timing_s/step:10.5\n" for s in range(4, 7)))
    _ingest_one(store, decided)
    meta = _meta(store)
    assert meta["step_time_includes_testing"] is False and meta["step_time_includes_checkpoint"] is None
    # Re-reading the undecided log (grown, or changed) does not turn the decision back into null.
    undecided.write_text(undecided.read_text() + "step:7 - timing_s/gen:10.0 - timing_s/step:10.5\n")
    assert [r.status for r in ingest_paths(store, [undecided])] == ["appended"]
    assert _meta(store)["step_time_includes_testing"] is False
    undecided.write_text(undecided.read_text().replace("step:1 ", "step:0 "))
    assert [r.status for r in ingest_paths(store, [undecided])] == ["replaced"]
    assert _meta(store)["step_time_includes_testing"] is False
