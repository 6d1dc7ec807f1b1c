"""drift: slope and CI on constructed series, step-aggregate runs, real traces against numpy."""

from __future__ import annotations

import json

import numpy as np
import pytest

from polytrace_cli.analyze import drift
from polytrace_cli.analyze.common import StepRange
from polytrace_cli.ingest.driver import ingest_paths
from tests.conftest import need_real_data
from tests.test_analyze_lengths import add_run, add_samples, add_step_metrics, ids_of


def test_exact_linear_series_has_its_slope_and_zero_width_interval(store):
    run = add_run(store, "linear")
    for step in range(5):  # means 100, 110, ..., 140: slope 10 tokens/step exactly
        add_samples(store, run, step=step, prompts=[1, 1], responses=[95 + 10 * step, 105 + 10 * step])
    s = drift.summary(store, [run], StepRange()).row(0, named=True)
    assert s["slope_tokens_per_step"] == pytest.approx(10.0)
    assert s["intercept_tokens"] == pytest.approx(100.0)
    assert s["slope_ci_low"] == pytest.approx(10.0) and s["slope_ci_high"] == pytest.approx(10.0)
    assert s["r_squared"] == pytest.approx(1.0)
    assert s["spearman_rho"] == pytest.approx(1.0)
    assert s["mean_tokens"] == pytest.approx(120.0)
    assert s["relative_slope_per_step"] == pytest.approx(10 / 120)
    assert (s["steps"], s["basis"]) == (5, "samples")


def test_noisy_series_interval_by_hand(store):
    run = add_run(store, "noisy")
    means = [0.0, 2.0, 1.0, 3.0]  # x = 0..3: b = 0.8, residuals -0.3, 0.9, -0.9, 0.3
    for step, m in enumerate(means):
        add_samples(store, run, step=step, prompts=[1], responses=[m])
    s = drift.summary(store, [run], StepRange(), min_trend_steps=2).row(0, named=True)
    assert s["slope_tokens_per_step"] == pytest.approx(0.8)
    sse = 0.09 + 0.81 + 0.81 + 0.09
    se = (sse / 2 / 5.0) ** 0.5  # Sxx = 5
    half = 4.302652729911275 * se  # t(0.975, df=2)
    assert s["slope_ci_low"] == pytest.approx(0.8 - half) and s["slope_ci_high"] == pytest.approx(0.8 + half)
    assert s["spearman_rho"] == pytest.approx(0.8)


def test_per_step_p99_and_two_step_run_has_no_interval(store):
    run = add_run(store, "two")
    add_samples(store, run, step=0, prompts=[1] * 101, responses=list(range(101)))
    add_samples(store, run, step=1, prompts=[1], responses=[500])
    per_step = drift.per_step(store, [run])
    assert per_step["p99_tokens"].to_list() == pytest.approx([99.0, 500.0])
    s = drift.summary(store, [run], StepRange(), min_trend_steps=2).row(0, named=True)
    assert s["slope_tokens_per_step"] == pytest.approx(450.0)
    assert s["slope_ci_low"] is None and s["spearman_p"] is None


def test_step_aggregate_run_uses_logged_means(store):
    run = add_run(store, "console")
    for step, mean in [(1, 100), (2, 150), (3, 200)]:
        add_step_metrics(store, run, step, {"response_length/mean": mean, "timing_s/step": 10})
    per_step = drift.per_step(store, [run])
    assert set(per_step["basis"]) == {"step_aggregates"} and per_step["p99_tokens"].is_null().all()
    s = drift.summary(store, [run], StepRange(), min_trend_steps=2).row(0, named=True)
    assert s["slope_tokens_per_step"] == pytest.approx(50.0) and s["basis"] == "step_aggregates"


def test_run_without_lengths_gives_empty_frame(store):
    run = add_run(store, "nothing")
    out = drift.summary(store, [run], StepRange())
    assert out.height == 0 and "slope_tokens_per_step" in out.columns


def test_real_verl_per_step_mean_and_p99(store):
    folder = need_real_data("polytrace", "verl")
    ingest_paths(store, [folder])
    expected: dict[int, list[int]] = {}
    for path in folder.rglob("packed_lengths_step_*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if not record.get("validate"):
                expected.setdefault(record["step"], []).extend(record["output"])
    per_step = drift.per_step(store, [ids_of(store, "verl")])
    assert per_step["step"].to_list() == sorted(expected)
    for row in per_step.iter_rows(named=True):
        assert row["mean_tokens"] == pytest.approx(np.mean(expected[row["step"]]))
        assert row["p99_tokens"] == pytest.approx(np.percentile(expected[row["step"]], 99))
    steps = sorted(expected)
    slope = np.polyfit(steps, [np.mean(expected[s]) for s in steps], 1)[0]
    s = drift.summary(store, [ids_of(store, "verl")], StepRange()).row(0, named=True)
    assert s["slope_tokens_per_step"] == pytest.approx(slope)


def test_trend_is_withheld_below_five_steps_and_gaps_are_counted(store):
    """Steps 0 and 5 only (Search-R1's shape): no slope from two points, and the note says why and that
    steps 1–4 are missing; five steps with data give the slope again."""
    run = add_run(store, "sparse")
    add_samples(store, run, step=0, prompts=[1], responses=[800])
    add_samples(store, run, step=5, prompts=[1], responses=[100])
    s = drift.summary(store, [run], StepRange()).row(0, named=True)
    assert drift.MIN_TREND_STEPS == 5
    assert s["slope_tokens_per_step"] is None and s["r_squared"] is None and s["relative_slope_per_step"] is None
    assert (s["steps"], s["missing_steps"]) == (2, 4)
    assert s["note"] == "trend withheld: 2 steps with data, at least 5 needed; 4 of steps 0–5 have no data"
    for step in (1, 2, 3):
        add_samples(store, run, step=step, prompts=[1], responses=[800 - 100 * step])
    s = drift.summary(store, [run], StepRange()).row(0, named=True)
    assert s["steps"] == 5 and s["missing_steps"] == 1 and s["note"] == "1 of steps 0–5 have no data"
    assert s["slope_tokens_per_step"] is not None
