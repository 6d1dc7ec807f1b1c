"""`polytrace whatif --backtest`: hand-computed baselines on tiny logs, and the model's accuracy on
held-out steps of logs written from a known model (test_model's generator)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from polytrace_cli.cli import app
from polytrace_cli.errors import PolytraceError
from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.simulate import accuracy, backtest_run
from test_model import TRUE, _stage_seconds, write_known_log

runner = CliRunner()


def _write_steps(path: Path, rows: list[dict[str, float]]) -> Path:
    """A verl console log with one line per step holding the given timers (step numbers from 1)."""
    lines = ["(TaskRunner pid=1) Training from scratch"]
    for step, row in enumerate(rows, start=1):
        lines.append(f"step:{step} - " + " - ".join(f"timing_s/{k}:{v}" for k, v in row.items()))
    path.write_text("\n".join(lines) + "\n")
    return path


def _ingest(store, path: Path, run: str = "tiny") -> str:
    reports = ingest_paths(store, [path], run_name=run)
    assert [r.status for r in reports] == ["ingested"], reports
    return run


def test_accuracy_is_the_polytrace_definition():
    # errors +10 % and −30 %: mean |error| 20 % → 80 %; a zero or missing real value is skipped
    value, count = accuracy(np.array([11.0, 7.0, 5.0, 1.0]), np.array([10.0, 10.0, 0.0, np.nan]))
    assert (value, count) == (pytest.approx(80.0), 2)
    assert accuracy(np.array([1.0]), np.array([np.nan])) == (None, 0)


def test_baselines_by_hand_on_six_steps(store, tmp_path):
    gen = [10, 12, 11, 14, 9, 13]
    step = [20, 24, 22, 28, 18, 26]
    path = _write_steps(tmp_path / "train.log", [{"gen": g, "step": s} for g, s in zip(gen, step)])
    result = backtest_run(store, _ingest(store, path))
    assert (result.train_steps, result.test_steps, result.first_test_step) == (3, 3, 4)
    # Fitted on steps 2 and 3 (step 1 is warm-up): the median baseline is median(12, 11) = 11.5
    gen_median = 100 * (1 - (2.5 / 14 + 2.5 / 9 + 1.5 / 13) / 3)
    # previous step's value: 11 for step 4, 14 for step 5, 9 for step 6
    gen_previous = 100 * (1 - (3 / 14 + 5 / 9 + 4 / 13) / 3)
    stage = result.stages["gen"]
    assert stage.steps == 3
    assert stage.median_baseline == pytest.approx(gen_median)
    assert stage.previous_baseline == pytest.approx(gen_previous)
    # With two fit steps the model of generation is their median too (no feature is logged)
    assert stage.accuracy == pytest.approx(gen_median)
    # step: median(24, 22) = 23 and previous 22, 28, 18; the model: gen 11.5 + rest median(12, 11)
    step_median = 100 * (1 - (5 / 28 + 5 / 18 + 3 / 26) / 3)
    assert result.step.median_baseline == pytest.approx(step_median)
    assert result.step.previous_baseline == pytest.approx(100 * (1 - (6 / 28 + 10 / 18 + 8 / 26) / 3))
    assert result.step.accuracy == pytest.approx(step_median)
    overall = result.to_dict()["overall"]
    assert overall["accuracy"] == pytest.approx(gen_median) and overall["stages"] == 1


def test_held_out_validation_is_predicted_at_the_training_median(store, tmp_path):
    rows = [{"gen": 10.0, "step": 20.0} for _ in range(8)]
    rows[1] = {"gen": 10.0, "testing": 60.0, "step": 80.0}    # step 2, training half
    rows[5] = {"gen": 10.0, "testing": 50.0, "step": 70.0}    # step 6, held out
    result = backtest_run(store, _ingest(store, _write_steps(tmp_path / "train.log", rows)))
    testing = result.stages["testing"]
    assert testing.steps == 1 and testing.accuracy == pytest.approx(80.0)
    # step 6 predicted 20 + 60 = 80 against 70; the other three held-out steps exactly
    assert result.step.accuracy == pytest.approx(100 * (1 - (10 / 70) / 4))
    # the fair median is told the same schedule: median wall 20 of the fitted steps + 60 on step 6
    assert result.step.median_baseline == pytest.approx(result.step.accuracy)
    assert result.step.recent_baseline == pytest.approx(result.step.accuracy)
    assert result.overall["accuracy"] == pytest.approx((100 + 80) / 2)


def test_too_few_steps_is_a_clear_error(store, tmp_path):
    path = _write_steps(tmp_path / "train.log", [{"gen": 1, "step": 2}] * 3)
    with pytest.raises(PolytraceError, match="at least 4 steps"):
        backtest_run(store, _ingest(store, path))


def test_backtest_on_a_known_model_reaches_the_noise_floor(store, tmp_path):
    log = write_known_log(tmp_path / "train.log", steps=240, seed=11, validation_every=10, checkpoint_every=40,
                          noise=0.02)
    result = backtest_run(store, _ingest(store, log.path, "known"))
    held = [s for s in range(1, 241) if s >= result.first_test_step]
    # The accuracy the true model itself gets on the held-out steps (noise only).
    true_gen = np.array([_stage_seconds(log.workload[s])["gen"] for s in held])
    real_gen = np.array([round(log.seconds[s]["gen"], 6) for s in held])
    floor, _ = accuracy(true_gen, real_gen)
    gen = result.stages["gen"]
    assert gen.accuracy >= floor - 0.5
    assert gen.extra["in_range_accuracy"] >= 95.0 and gen.extra["in_range_steps"] > 100
    assert result.step.accuracy >= 97.0 and result.overall["accuracy"] >= 95.0
    assert set(result.stages) == {*TRUE, "testing", "save_checkpoint"}
    for name, stage in result.stages.items():
        assert stage.accuracy >= stage.median_baseline - 1e-9, name
    assert result.step.accuracy >= result.step.median_baseline
    # stages whose seconds follow the workload are far better than a median
    assert gen.accuracy > gen.median_baseline + 5 and result.stages["update_actor"].accuracy > 90


def test_cli_backtest_json_and_table(store, tmp_path, db_path):
    log = write_known_log(tmp_path / "train.log", steps=40, seed=2)
    _ingest(store, log.path, "known")
    store.close()
    result = runner.invoke(app, ["whatif", "known", "--backtest", "--json", "--db", str(db_path)])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert set(document) >= {"stages", "step", "overall"}
    assert set(document["stages"]["gen"]) >= {"accuracy", "median_baseline", "previous_baseline"}
    assert document["split"] == {"train_steps": 20, "test_steps": 20, "first_test_step": 21}
    table = runner.invoke(app, ["whatif", "known", "--backtest", "--db", str(db_path)])
    assert table.exit_code == 0
    for word in ("gen", "update_actor", "step", "overall", "accuracy", "median", "previous", "baseline"):
        assert word in table.stdout, word


def test_cli_errors_are_one_line(store, tmp_path, db_path):
    _ingest(store, _write_steps(tmp_path / "train.log", [{"gen": 1, "step": 2}] * 3))
    store.close()
    for args, message in ((["tiny", "--backtest"], "at least 4 steps"), (["tiny"], "either --backtest"),
                          (["nope", "--backtest"], "no run named"),
                          (["tiny", "--policy", "partial-rollout"], "needs a value")):
        result = runner.invoke(app, ["whatif", *args, "--db", str(db_path)])
        assert result.exit_code == 2, args
        assert message in result.stderr and "Traceback" not in result.output, args
        assert len(result.stderr.strip().splitlines()) == 1


def test_a_stage_worse_than_its_median_is_named(store, tmp_path):
    # gen follows response_tokens in the training half, then stops following it: the fitted line
    # extrapolates and loses to the median, which the notes must say
    rows = []
    for step in range(1, 21):
        mean = 500 + 50 * (step % 7)
        gen = 10 + 0.02 * mean if step <= 10 else 20.0
        rows.append(f"step:{step} - timing_s/gen:{gen} - timing_s/step:{gen + 5} - response_length/mean:{mean} - "
                    f"prompt_length/mean:100 - perf/total_num_tokens:{100 * (mean + 100)}")
    path = tmp_path / "train.log"
    path.write_text("\n".join(rows) + "\n")
    result = backtest_run(store, _ingest(store, path))
    gen = result.stages["gen"]
    assert gen.accuracy < gen.median_baseline
    assert any("less accurate than the better of the median and recent baselines on: gen" in note
               for note in result.notes)


@pytest.mark.realdata
def test_real_traces_without_step_times_get_a_clear_error(tmp_path):
    from conftest import need_real_data

    traces = need_real_data("polytrace", "rllm")
    db = tmp_path / "real.duckdb"
    assert runner.invoke(app, ["ingest", str(traces), "--db", str(db)]).exit_code == 0
    for args in (["--backtest"], ["--policy", "balance"]):
        result = runner.invoke(app, ["whatif", "rllm", *args, "--db", str(db)])
        assert result.exit_code == 2 and "Traceback" not in result.output
        assert "step time" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_recent_and_walk_forward_baselines_by_hand(store, tmp_path):
    # gen = the step number, step time = gen + 10: 24 steps, the first 12 the training half, step 1 warm-up
    rows = [{"gen": float(step), "step": float(step + 10)} for step in range(1, 25)]
    result = backtest_run(store, _ingest(store, _write_steps(tmp_path / "train.log", rows)), walk_forward=True,
                          refit_every=1)
    held = np.arange(13, 25, dtype=float)

    def by_hand(predicted):
        return 100 * (1 - np.mean(np.abs(predicted - held) / held))

    gen = result.stages["gen"]
    # fixed split: median of steps 2..12 = 7, recent = median of the last ten fitted (3..12) = 7.5
    assert gen.median_baseline == pytest.approx(by_hand(np.full(12, 7.0)))
    assert gen.recent_baseline == pytest.approx(by_hand(np.full(12, 7.5)))
    assert gen.margin == pytest.approx(gen.accuracy - gen.recent_baseline)
    # walk-forward before step i: median of steps 2..i−1 = (i + 1) / 2, recent = median of i−10..i−1 = i − 5.5,
    # previous = i − 1
    walk = result.walk_forward.stages["gen"]
    assert walk.median_baseline == pytest.approx(by_hand((held + 1) / 2))
    assert walk.recent_baseline == pytest.approx(by_hand(held - 5.5))
    assert walk.previous_baseline == pytest.approx(by_hand(held - 1))
    # the step row's fair baselines: the wall times are gen + 10
    step_held = held + 10

    def step_by_hand(predicted):
        return 100 * (1 - np.mean(np.abs(predicted - step_held) / step_held))

    assert result.step.median_baseline == pytest.approx(step_by_hand(np.full(12, 17.0)))
    assert result.walk_forward.step.recent_baseline == pytest.approx(step_by_hand(held + 4.5))
    # no workload feature is logged and 11 fitted steps are too few to cross-validate: the median
    assert gen.method == "median" and gen.accuracy == pytest.approx(gen.median_baseline)


def test_a_stage_nothing_explains_is_predicted_by_its_recent_level_not_a_slope(store, tmp_path):
    # gen creeps up 1 % a step with no workload logged: the recent level, never a fitted slope
    rows = [{"gen": 10.0 * 1.01 ** step, "step": 10.0 * 1.01 ** step + 5} for step in range(1, 61)]
    result = backtest_run(store, _ingest(store, _write_steps(tmp_path / "train.log", rows)))
    gen = result.stages["gen"]
    # a level: the last ten steps' median, or the median since the last level shift
    assert gen.method in ("recent", "shifted") and gen.margin >= -0.3
    assert gen.accuracy > gen.median_baseline + 5
