"""The step-time forecaster: level shifts and drift where the truth is known, the choice by
cross-validation, walk-forward, and the next-step forecast a live monitor calls."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

import schema_check
from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.model import fit_forecaster, fit_model, forecast_next, read_workload, training_mask
from polytrace_cli.model.forecast import RECENT_STEPS, fit_line, level_shift
from polytrace_cli.simulate import backtest_run
from polytrace_cli.simulate.backtest import accuracy
from polytrace_cli.workload.presets import preset
from polytrace_cli.workload.steplog import StepTimeModel, write_step_log
from polytrace_cli.workload.synth import with_overrides


def _write(store, tmp_path, name: str, truth: StepTimeModel, *, steps: int = 120, drift: float = 0.0,
           seed: int = 7) -> pl.DataFrame:
    lengths, base = preset("math")
    spec = with_overrides(base, steps=steps, batch=16, n=8, dp_ranks=4, max_response_len=8192, drift=drift, seed=seed)
    written = write_step_log(lengths, spec, truth, tmp_path / name)
    assert [r.status for r in ingest_paths(store, written.files, run_name=name)] == ["ingested"]
    return written.frame


def test_level_shift_is_found_where_it_is_and_not_in_noise():
    rng = np.random.default_rng(0)
    noise = rng.normal(0.0, 0.05, 60)
    shifted = noise + np.where(np.arange(60) >= 37, 0.6, 0.0)
    assert level_shift(shifted, typical=5.0) == 37
    assert level_shift(noise, typical=5.0) is None
    # a jump below 2 % of the stage's level is not a shift, however clean
    assert level_shift(np.where(np.arange(60) >= 30, 0.05, 0.0), typical=5.0) is None


def test_fit_line_recovers_a_known_line_and_follows_its_weights():
    x = np.linspace(1000, 9000, 40)[:, None]
    y = 2.0 + 0.003 * x[:, 0]
    fit = fit_line("gen", x, ("r_max",), y)
    assert fit.intercept == pytest.approx(2.0, rel=1e-6) and fit.coefficients["r_max"] == pytest.approx(0.003, rel=1e-6)
    # the old half follows another slope; with zero weight on it the recent line comes back exactly
    old = 2.0 + 0.001 * x[:20, 0]
    weights = np.r_[np.zeros(20), np.ones(20)]
    fit = fit_line("gen", x, ("r_max",), np.r_[old, y[20:]], weights)
    assert fit.coefficients["r_max"] == pytest.approx(0.003, rel=1e-6)


def test_a_level_shift_in_the_training_half_is_fitted_after_it(store, tmp_path):
    # generation takes 15 s more from step 40 on, for no workload reason
    truth = StepTimeModel(noise_sigma=0.02, level_shifts=((40, "gen", 15.0),))
    _write(store, tmp_path, "shift", truth)
    frame = read_workload(store, "shift")
    result = backtest_run(store, "shift")
    forecaster = fit_forecaster(frame.head(result.train_steps), training_mask(frame.head(result.train_steps)))
    choice = forecaster.choices["gen"]
    assert choice.method == "shifted" and choice.shift_step == 40
    gen = result.stages["gen"]
    # the old line, fitted across the shift, is off by half the shift on every held-out step
    assert gen.accuracy >= 96.0 and gen.accuracy > gen.median_baseline + 3
    assert any("level shift at step 40" in note for note in result.notes)


def _fixed_form_accuracy(frame: pl.DataFrame, n_train: int, stage: str) -> float:
    mask = training_mask(frame) & pl.Series(np.arange(frame.height) < n_train)
    predicted = fit_model(frame, mask).predict(frame)[f"{stage}_s"].to_numpy()
    real = frame[f"{stage}_s"].to_numpy()
    return accuracy(predicted[n_train:], real[n_train:])[0]


def test_a_drifting_cost_is_followed_where_the_fixed_line_extrapolates_wrong(store, tmp_path):
    # update_actor's cost per token grows 40 % over the run while the responses get shorter
    truth = StepTimeModel(noise_sigma=0.02, cost_drift=(("update_actor", 1.4),))
    _write(store, tmp_path, "drift", truth, steps=160, drift=-0.004)
    frame = read_workload(store, "drift").filter(pl.col("step_s").is_not_null())
    result = backtest_run(store, "drift")
    actor = result.stages["update_actor"]
    assert actor.method == "trend"
    assert actor.accuracy > _fixed_form_accuracy(frame, result.train_steps, "update_actor") + 1.0
    assert actor.margin >= -0.3


def test_a_stage_the_workload_does_not_explain_falls_back_to_its_level_and_says_so(store, tmp_path):
    # reward: no per-response cost, so n_responses (fixed batch) explains nothing
    truth = StepTimeModel(noise_sigma=0.03, b_reward=0.0)
    _write(store, tmp_path, "flat", truth)
    result = backtest_run(store, "flat")
    for stage in ("reward", "adv", "update_weights"):
        assert result.stages[stage].method in ("median", "recent"), stage
    assert any("predicted by a baseline" in note and "reward" in note for note in result.notes)


def test_walk_forward_adapts_to_a_shift_the_fixed_split_cannot_see(store, tmp_path):
    # the shift lands in the held-out half: the fixed split cannot know it, walk-forward learns it
    truth = StepTimeModel(noise_sigma=0.02, level_shifts=((80, "gen", 20.0),))
    _write(store, tmp_path, "late", truth)
    result = backtest_run(store, "late", walk_forward=True, refit_every=5)
    walk = result.walk_forward
    assert walk is not None and walk.refit_every == 5
    assert walk.stages["gen"].steps == result.stages["gen"].steps
    assert walk.stages["gen"].accuracy > result.stages["gen"].accuracy + 3
    assert walk.step.accuracy > walk.step.median_baseline + 2
    document = result.to_dict()
    assert document["walk_forward"]["refit_every"] == 5 and "recent_baseline" in document["walk_forward"]["step"]


def test_the_next_step_forecast_is_the_truth_at_the_recent_workload(store, tmp_path):
    truth = StepTimeModel(noise_sigma=0.001, level_shifts=((30, "update_actor", 8.0),))
    _write(store, tmp_path, "live", truth, steps=60)
    frame = read_workload(store, "live").filter(pl.col("step") <= 50)
    forecast = forecast_next(frame)
    recent = frame.filter(training_mask(frame)).tail(RECENT_STEPS)
    r_max, tokens = float(recent["r_max"].median()), float(recent["response_tokens"].median())
    assert forecast["gen"] == pytest.approx(truth.a_gen + truth.b_tail * r_max + truth.b_vol * tokens, rel=0.02)
    busiest = float(recent["busiest_rank_tokens"].median())
    a, b = next((a, b) for name, a, b in truth.token_stages if name == "update_actor")
    # the shift is in the forecast: the level after step 30, not the run's median
    assert forecast["update_actor"] == pytest.approx(a + 8.0 + b * busiest, rel=0.02)
    assert forecast["step"] == pytest.approx(sum(v for k, v in forecast.items() if k != "step"))


def test_the_store_forecasts_the_next_step(store, tmp_path, db_path):
    from polytrace_cli import Store

    _write(store, tmp_path, "live", StepTimeModel(noise_sigma=0.001), steps=30)
    store.close()
    with Store.open(db_path, read_only=True) as facade:
        forecast = facade.forecast("live")
    truth = StepTimeModel()
    assert forecast["adv"] == pytest.approx(truth.a_adv, rel=0.01)
    assert forecast["update_weights"] == pytest.approx(truth.weight_sync_s, rel=0.01)


def test_cli_backtest_with_walk_forward_matches_its_schema(store, tmp_path, db_path):
    import json

    import jsonschema
    from typer.testing import CliRunner

    from polytrace_cli.cli import app

    _write(store, tmp_path, "cli", StepTimeModel(validate_every=10, level_shifts=((20, "gen", 10.0),)), steps=60)
    store.close()
    from polytrace_cli.schemas import json_schema

    schema = json_schema("whatif")
    runner = CliRunner()
    result = runner.invoke(app, ["whatif", "cli", "--backtest", "--walk-forward", "--refit-every", "3", "--json",
                                 "--db", str(db_path)])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    schema_check.validate(document, schema, cls=jsonschema.Draft202012Validator)
    assert document["walk_forward"]["refit_every"] == 3
    assert document["step"]["best_baseline"] == max(document["step"]["median_baseline"],
                                                    document["step"]["recent_baseline"])
    policies = runner.invoke(app, ["whatif", "cli", "--policy", "balance", "--policy", "one-step-off", "--json",
                                   "--db", str(db_path)])
    assert policies.exit_code == 0, policies.output
    schema_check.validate(json.loads(policies.stdout), schema, cls=jsonschema.Draft202012Validator)
    table = runner.invoke(app, ["whatif", "cli", "--backtest", "--walk-forward", "--db", str(db_path), "--wide"])
    assert table.exit_code == 0 and "walk" in table.stdout and "refitted every 1 step(s)" in table.stdout
    refit_alone = runner.invoke(app, ["whatif", "cli", "--backtest", "--refit-every", "3", "--db", str(db_path)])
    assert refit_alone.exit_code == 2 and "--refit-every goes with --walk-forward" in refit_alone.stderr
