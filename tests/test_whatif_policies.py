"""`polytrace whatif --policy`: each policy on logs written from a known model (test_model's
generator), savings against the truth the generator knows, and pipelines computed by hand."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from polytrace_cli.cli import app
from polytrace_cli.errors import PolytraceError
from polytrace_cli.ingest.runner import ingest_paths
from polytrace_cli.simulate import parse_policy, whatif_run
from polytrace_cli.simulate.lengths import fitted_lengths
from test_model import TRUE, write_known_log

runner = CliRunner()
STEPS = 160


@pytest.fixture
def known(store, tmp_path):
    log = write_known_log(tmp_path / "train.log", steps=STEPS, seed=21, validation_every=10, checkpoint_every=40,
                          noise=0.02, inject={70: "dp_imbalance", 90: "dp_imbalance"})
    reports = ingest_paths(store, [log.path], run_name="known")
    assert [r.status for r in reports] == ["ingested"]
    return log


def _scenario(result, policy):
    [scenario] = [s for s in result.scenarios if s.policy == policy]
    return scenario


def _logged(log, key):
    return sum(round(seconds.get(key, 0.0), 6) for seconds in log.seconds.values())


def test_balance_saving_matches_the_generator(store, known):
    result = whatif_run(store, "known", ["balance"])
    slope = sum(terms.get("busiest_rank_tokens", 0.0) for terms in TRUE.values())
    truth = slope * sum(w["busiest_rank_tokens"] - w["mean_rank_tokens"] for w in known.workload.values())
    scenario = _scenario(result, "balance")
    assert scenario.saving_s == pytest.approx(truth, rel=0.03)
    # generation waits for the longest response: balancing token sums does not shorten it
    assert scenario.stages["gen"] == pytest.approx(result.stages["gen"])
    assert scenario.stages["update_actor"] < result.stages["update_actor"]


def test_no_validation_is_exact(store, known):
    result = whatif_run(store, "known", ["no-validation"])
    scenario = _scenario(result, "no-validation")
    assert scenario.saving_s == pytest.approx(_logged(known, "testing"), abs=1e-6)
    assert scenario.stages["testing"] == 0.0
    assert result.baseline_s == pytest.approx(result.actual_s, rel=0.01)


def test_validation_and_checkpoint_schedules(store, known):
    result = whatif_run(store, "known", ["validate-every=20", "checkpoint-every=80", "checkpoint-every=20"])
    testing = [round(known.seconds[s]["testing"], 6) for s in range(10, STEPS + 1, 10)]
    checkpoints = [round(known.seconds[s]["save_checkpoint"], 6) for s in range(40, STEPS + 1, 40)]
    # steps 20, 40, ..., 160 validate (160 is also the last step): 8 at the logged median
    expected = _logged(known, "testing") - 8 * float(np.median(testing))
    assert _scenario(result, "validate-every=20").saving_s == pytest.approx(expected, abs=1e-6)
    # checkpoints at 80 and 160 instead of 40, 80, 120, 160; at 20, 40, ..., 160 (8) instead of 4
    median = float(np.median(checkpoints))
    assert _scenario(result, "checkpoint-every=80").saving_s == pytest.approx(sum(checkpoints) - 2 * median)
    assert _scenario(result, "checkpoint-every=20").saving_s == pytest.approx(sum(checkpoints) - 8 * median)


def test_response_cap_and_partial_rollout(store, known):
    result = whatif_run(store, "known", ["max-response-len=100000", "max-response-len=4000",
                                         "max-response-len=2000", "partial-rollout=1", "partial-rollout=0.8"])
    # a cap above every response, and a rollout that waits for all of them, change nothing
    assert _scenario(result, "max-response-len=100000").saving_s == pytest.approx(0.0, abs=1e-6)
    assert _scenario(result, "partial-rollout=1").saving_s == pytest.approx(0.0, abs=1e-6)
    cap4k, cap2k = _scenario(result, "max-response-len=4000"), _scenario(result, "max-response-len=2000")
    assert 0 < cap4k.saving_s < cap2k.saving_s and "fitted per step" in cap4k.note
    # generation saves at least b_tail · Σ (r_max − cap) for the longest responses cut
    b_tail = TRUE["gen"]["r_max"]
    cut = sum(max(w["r_max"] - 4000, 0.0) for w in known.workload.values())
    assert result.stages["gen"] - cap4k.stages["gen"] >= 0.95 * b_tail * cut
    partial = _scenario(result, "partial-rollout=0.8")
    assert partial.saving_s > 0 and partial.stages["gen"] < result.stages["gen"]


def test_fitted_lengths_reproduce_the_logged_aggregates():
    import polars as pl

    frame = pl.DataFrame({"n_responses": [512.0, 256.0], "r_max": [8000.0, 4096.0],
                          "response_tokens": [512 * 1000.0, 256 * 900.0]})
    unclipped, clipped = fitted_lengths(frame, np.array([1000.0, 900.0]), np.array([0.0, 0.05]), 4096.0)
    assert unclipped.size == 512 and unclipped.max() == 8000.0 and unclipped.sum() == pytest.approx(512_000)
    # 5 % of the clipped step's responses sit at the cap
    assert clipped.max() == 4096.0 and np.mean(clipped >= 4096.0 - 1e-6) == pytest.approx(0.05, abs=0.01)


def _constant_log(path: Path, steps: int) -> Path:
    lines = ["(TaskRunner pid=1) Training from scratch"]
    lines += [f"step:{s} - timing_s/gen:10.0 - timing_s/update_actor:6.0 - timing_s/step:16.5"
              for s in range(1, steps + 1)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_one_step_off_pipeline_by_hand(store, tmp_path):
    ingest_paths(store, [_constant_log(tmp_path / "train.log", 6)], run_name="flat")
    result = whatif_run(store, "flat", ["one-step-off", "balance"])
    # replay: 6 × (10 + 6 + 0.5) = 99; pipelined: gen_1 + 5 · max(10, 6) + train_6 + 6 · 0.5 = 69
    assert result.baseline_s == pytest.approx(99.0)
    pipelined = _scenario(result, "one-step-off")
    assert pipelined.predicted_s == pytest.approx(69.0) and pipelined.saving_s == pytest.approx(30.0)
    assert pipelined.stages["overlap"] == pytest.approx(-30.0)
    # no per-rank token sums are logged: balance says so instead of printing a number
    balance = _scenario(result, "balance")
    assert balance.predicted_s is None and balance.saving_s is None and "imbalance is unknown" in balance.note


def test_one_step_off_split_scales_throughput_not_latency(store, known):
    result = whatif_run(store, "known", ["one-step-off=0.5"])
    scenario = _scenario(result, "one-step-off=0.5")
    b_vol = TRUE["gen"]["response_tokens"]
    extra = b_vol * sum(w["response_tokens"] for w in known.workload.values())
    # generation on half the GPUs: its volume term doubles, its longest-response term does not
    assert scenario.stages["gen"] - result.stages["gen"] == pytest.approx(extra, rel=0.05)
    assert scenario.stages["overlap"] < 0


@pytest.mark.parametrize("text", ["bogus", "validate-every=0", "validate-every=2.5", "partial-rollout=0",
                                  "one-step-off=1", "max-response-len"])
def test_bad_policies_are_rejected(text):
    with pytest.raises(PolytraceError):
        parse_policy(text)


def test_policy_text_round_trips():
    assert [parse_policy(t).text for t in ("balance", "validate-every=5", "partial-rollout=0.9", "one-step-off")] \
        == ["balance", "validate-every=5", "partial-rollout=0.9", "one-step-off"]


def test_cli_policy_json(store, known, db_path):
    store.close()
    result = runner.invoke(app, ["whatif", "known", "--policy", "balance", "--policy", "no-validation", "--json",
                                 "--db", str(db_path)])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [s["policy"] for s in document["scenarios"]] == ["balance", "no-validation"]
    for scenario in document["scenarios"]:
        assert scenario["saving_s"] == pytest.approx(document["baseline_s"] - scenario["predicted_s"])
        assert scenario["saving_share"] == pytest.approx(scenario["saving_s"] / document["baseline_s"])
        assert sum(scenario["stages"].values()) == pytest.approx(scenario["predicted_s"])
    table = runner.invoke(app, ["whatif", "known", "--policy", "balance", "--db", str(db_path)])
    assert table.exit_code == 0 and "balance" in table.stdout
