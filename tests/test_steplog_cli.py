"""`polytrace synth --format verl-*` and the demo's verl run, end to end through the command line."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from polytrace_cli.cli import app
from polytrace_cli.commands.workload import DEMO_SEED
from polytrace_cli.workload.presets import VERL_DEMO_RUN, verl_demo
from polytrace_cli.workload.steplog import console_text, step_table
from polytrace_cli.workload.synth import with_overrides

runner = CliRunner()
SAMPLE_LOGS = Path(__file__).resolve().parents[1] / "sample_logs"


def test_synth_writes_verl_logs_with_schedule_injections_and_truth(tmp_path):
    args = ["synth", "--task", "math", "--num-steps", "12", "--batch", "8", "--dp-ranks", "2", "--seed", "3", "--max-response-len", "40000",
            "--validate-every", "5", "--checkpoint-every", "6", "--inject", "4:long_tail", "--inject", "9:unexplained:3"]
    console = runner.invoke(app, [*args, "--format", "verl-console", "--out", str(tmp_path / "c"),
                                  "--truth", str(tmp_path / "truth.json")])
    assert console.exit_code == 0, console.output
    assert "note:" not in console.output  # both injections took effect
    log = (tmp_path / "c" / "train.log").read_text()
    assert log.count(") step:") == 13 and "timing_s/testing" in log  # step 0 validates before training
    truth = json.loads((tmp_path / "truth.json").read_text())
    by_step = {row["step"]: row for row in truth["steps"]}
    assert by_step[4]["r_max"] == 40000 and by_step[4]["cause_long_tail_s"] > 0
    assert by_step[9]["cause_unexplained_s"] == pytest.approx(by_step[9]["gen_s"] * 2 / 3)
    assert [s for s, row in by_step.items() if row["is_validation"]] == [5, 10, 12]
    assert truth["model"]["injections"] == [{"step": 4, "cause": "long_tail", "size": None},
                                            {"step": 9, "cause": "unexplained", "size": 3.0}]
    jsonl = runner.invoke(app, [*args, "--format", "verl-jsonl", "--out", str(tmp_path / "j"), "--verl-version", "0.8"])
    assert jsonl.exit_code == 0, jsonl.output
    lines = [json.loads(line) for line in (tmp_path / "j" / "metrics.jsonl").read_text().splitlines()]
    last = lines[-1]["data"]  # 0.8: the step time leaves out testing and checkpoint
    stages = sum(v for k, v in last.items() if k.startswith("timing_s/") and k not in (
        "timing_s/step", "timing_s/testing", "timing_s/save_checkpoint"))
    assert stages < last["timing_s/step"] < stages + 1.0


@pytest.mark.parametrize("extra, message", [
    (["--format", "verl-xml"], "--format takes polytrace, verl-console, verl-jsonl"),
    (["--format", "verl-console", "--inject", "3:slow"], "unknown cause 'slow'"),
    (["--format", "verl-console", "--inject", "30:long_tail"], "outside the run's steps 1..6"),
    (["--format", "verl-console", "--verl-version", "0.6"], "--verl-version takes 0.4, 0.5, 0.8"),
    (["--validate-every", "3"], "--validate-every applies to verl logs"),
    (["--resume-after", "3"], "--resume-after applies to verl logs"),
    (["--format", "verl-jsonl", "--resume-after", "6"], "--resume-after must be a step before the last"),
    (["--format", "verl-console", "--multiturn"], "single-turn"),
])
def test_synth_verl_mistakes_are_one_line_errors(tmp_path, extra, message):
    result = runner.invoke(app, ["synth", "--task", "math", "--out", str(tmp_path / "o"), *extra])
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output


def test_sample_logs_verl_run_is_what_the_generator_writes():
    """sample_logs/ holds only generated files: the committed verl log is the demo's, byte for byte."""
    committed = SAMPLE_LOGS / VERL_DEMO_RUN / "train.log"
    if not committed.exists():
        pytest.skip("sample_logs/ not generated (polytrace demo)")
    lengths, spec, model = verl_demo()
    spec = with_overrides(spec, seed=DEMO_SEED)
    assert committed.read_text(encoding="utf-8") == console_text(step_table(lengths, spec, model), spec, model)


def test_demo_ingests_the_verl_run_and_draws_the_step_time_figures(demo_run):
    result, folder = demo_run
    assert result.exit_code == 0, result.output
    con = duckdb.connect(str(folder / "logs" / "demo.duckdb"), read_only=True)
    try:
        timed = con.execute(
            "SELECT count(*), count(gen_s), count(update_actor_s), count(step_s), count(testing_s), "
            "count(save_checkpoint_s) FROM steps JOIN runs r USING (run_id) WHERE r.name = ? "
            "AND NOT is_validation_only", [VERL_DEMO_RUN]).fetchone()
    finally:
        con.close()
    assert timed == (300, 300, 300, 300, 6, 3)  # validation every 50, checkpoints every 100
    summary = json.loads((folder / "reports" / "demo" / "summary.json").read_text())
    drawn = {f["id"]: f for f in summary["figures"]}
    for figure_id in ("F4", "F5", "F11"):
        assert drawn[figure_id]["png"], drawn[figure_id]["omitted"]
        rows = next(iter(summary["figure_data"][figure_id].values()))
        assert {row["run"] for row in rows} == {VERL_DEMO_RUN}


def test_a_long_tail_at_a_step_already_at_the_cap_is_named_as_no_effect(tmp_path):
    """The math preset's longest response reaches its 20,480-token cap on every step, so a long tail
    of the cap's length adds nothing; the truth says 0 s and the command says so."""
    args = ["synth", "--task", "math", "--num-steps", "6", "--format", "verl-jsonl", "--inject", "3:long_tail",
            "--inject", "4:unexplained:2", "--out", str(tmp_path / "j"), "--truth", str(tmp_path / "truth.json")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    by_step = {row["step"]: row for row in json.loads((tmp_path / "truth.json").read_text())["steps"]}
    assert by_step[3]["r_max"] == 20480 and by_step[3]["cause_long_tail_s"] == 0
    notes = [line for line in result.output.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and notes[0].startswith("note: step 3: long_tail added no time")
