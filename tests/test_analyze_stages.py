"""Step-time analysis on hand-built step-aggregate runs."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from polytrace_cli.analyze import stages as step_analysis
from polytrace_cli.analyze.common import StepRange
from polytrace_cli.analyze.registry import all_analyses


def _metrics(con, run_id, segment, step, values: dict):
    for key, value in values.items():
        con.execute("INSERT INTO step_metrics (run_id, segment, step, key, value, file_id) VALUES (?, ?, ?, ?, ?, 1)",
                    [run_id, segment, step, key, value])


STEP_TIMES = [10, 11, 12, 13, 40]
GEN_TIMES = [5, 6, 7, 8, 9]
MAX_LENGTHS = [100, 110, 120, 130, 140]


@pytest.fixture
def loaded(store):
    store.execute("INSERT INTO runs (run_id, name) VALUES (1, 'x'), (2, 'trace')")
    _metrics(store, 1, 0, 0, {"val-core/acc": 0.5})  # validation before training
    for step, (total, gen, length) in enumerate(zip(STEP_TIMES, GEN_TIMES, MAX_LENGTHS), start=1):
        values = {"timing_s/step": total, "timing_s/gen": gen, "timing_s/reward": 1, "timing_s/update_actor": 2,
                  "response_length/max": length, "response_length/mean": length / 2}
        if step == 5:
            values["timing_s/testing"] = 20
        _metrics(store, 1, 0, step, values)
    # A restart: segment 1 goes back to step 4.
    _metrics(store, 1, 1, 4, {"timing_s/step": 12, "timing_s/gen": 7, "timing_s/reward": 1, "timing_s/update_actor": 2})
    store.execute("INSERT INTO step_flags (run_id, segment, step, flag, file_id) VALUES (1, 0, 3, 'truncated_line', 1)")
    # Run 'trace' has samples only.
    store.execute("INSERT INTO sample_rows (run_id, file_id, step, prompt_len, response_len) VALUES (2, 1, 0, 10, 20)")
    return store


def test_per_step_unexplained_and_flags(loaded):
    detail = step_analysis.per_step(loaded, [1])
    assert detail.height == 7
    timed = detail.filter(detail["step_s"].is_not_null())
    # step − (gen + reward + update_actor [+ testing]): 10−8, 11−9, 12−10, 13−11, 40−32, 12−10
    assert timed["unexplained_s"].to_list() == [2, 2, 2, 2, 8, 2]
    flags = {(r["segment"], r["step"]): r for r in detail.to_dicts()}
    assert flags[(0, 0)]["validation_only"]
    assert flags[(0, 5)]["testing"] and not flags[(0, 4)]["testing"]
    assert flags[(0, 3)]["truncated_line"]
    assert flags[(1, 4)]["restart"] and not flags[(0, 4)]["restart"]


def test_stage_stats(loaded):
    stats = {row["stage"]: row for row in step_analysis.stage_stats(loaded, [1]).to_dicts()}
    assert list(stats) == ["gen", "reward", "update_actor", "step"]
    gen_values = GEN_TIMES + [7]
    gen = stats["gen"]
    assert gen["steps"] == 6
    assert gen["mean_s"] == pytest.approx(7.0)
    assert gen["std_s"] == pytest.approx(statistics.stdev(gen_values))
    assert gen["cv"] == pytest.approx(statistics.stdev(gen_values) / 7)
    assert gen["max_over_min"] == pytest.approx(9 / 5)
    # sorted 5,6,7,7,8,9: p95 at position 4.75 -> 8.75; p50 at 2.5 -> 7
    assert gen["p95_over_p50"] == pytest.approx(8.75 / 7)
    step_total = sum(STEP_TIMES) + 12
    assert gen["share"] == pytest.approx(sum(gen_values) / step_total)
    assert stats["update_actor"]["share"] == pytest.approx(12 / step_total)
    assert stats["step"]["share"] == pytest.approx(1.0)
    assert stats["reward"]["cv"] == 0


def test_robust_z_outliers(loaded):
    series = step_analysis.series(loaded, [1])
    # step times 10, 11, 12, 13, 40, 12: median 12, |deviations| 2, 1, 0, 1, 28, 0 -> MAD 1
    assert series["robust_z"].to_list() == pytest.approx([2 / 1.4826, 1 / 1.4826, 0, 1 / 1.4826, 28 / 1.4826, 0])
    out = step_analysis.outliers(loaded, [1])
    assert out.select("segment", "step", "reasons").rows() == [(0, 5, "testing")]
    reasons = dict(zip(zip(series["segment"], series["step"]), series["reasons"]))
    assert reasons[(0, 3)] == "truncated_line" and reasons[(1, 4)] == "restart" and reasons[(0, 1)] == ""


def test_mad_zero_flags_nothing(store):
    store.execute("INSERT INTO runs (run_id, name) VALUES (1, 'flat')")
    for step, total in enumerate([5, 5, 5, 9], start=1):
        _metrics(store, 1, 0, step, {"timing_s/step": total})
    series = step_analysis.series(store, [1])
    assert series["robust_z"].null_count() == 4 and not series["outlier"].any()


def test_correlations_and_fit(loaded):
    corr = {(r["time"], r["length"]): r for r in step_analysis.correlations(loaded, [1]).to_dicts()}
    step_max = corr[("step", "response_length_max")]
    assert step_max["n"] == 5
    assert step_max["pearson_r"] == pytest.approx(np.corrcoef(MAX_LENGTHS, STEP_TIMES)[0, 1])
    assert step_max["spearman_r"] == pytest.approx(1.0)
    assert corr[("gen", "response_length_mean")]["pearson_r"] == pytest.approx(1.0)
    fit = step_analysis.length_fit(loaded, [1])
    slope, intercept = np.polyfit(MAX_LENGTHS, STEP_TIMES, 1)
    assert fit["slope_s_per_token"][0] == pytest.approx(slope)
    assert fit["fitted_step_s"].to_list() == pytest.approx([intercept + slope * x for x in MAX_LENGTHS])


def test_summary_and_runs_without_step_metrics(loaded):
    summary = all_analyses()["stages"].summary(loaded, [1, 2], StepRange())
    step_row = summary.filter((summary["run"] == "x") & (summary["stage"] == "step")).row(0, named=True)
    assert step_row["basis"] == "step_aggregates"
    assert step_row["mean_unexplained_s"] == pytest.approx(18 / 6)
    assert step_row["outlier_steps"] == 1
    assert step_row["mean_s"] == pytest.approx((sum(STEP_TIMES) + 12) / 6)
    trace = summary.filter(summary["run"] == "trace").row(0, named=True)
    assert trace["basis"] == "no_step_metrics" and trace["mean_s"] is None
    assert step_analysis.per_step(loaded, [2]).height == 0
    assert step_analysis.series(loaded, [2]).height == 0
    assert step_analysis.length_fit(loaded, [2]).height == 0


def test_step_range(loaded):
    detail = step_analysis.per_step(loaded, [1], StepRange(2, 3))
    assert sorted(set(detail["step"].to_list())) == [2, 3]
    stats = {row["stage"]: row for row in step_analysis.stage_stats(loaded, [1], StepRange(2, 3)).to_dicts()}
    assert stats["step"]["mean_s"] == pytest.approx(11.5)
    assert not math.isnan(stats["gen"]["cv"])
