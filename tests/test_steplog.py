"""The step-log generator: a known step-time model written as verl logs, read back through ingest."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import polars as pl
import pytest

from polytrace_cli.errors import PolytraceError
from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.workload.distributions import LengthModel, Marginal
from polytrace_cli.workload.steplog import (
    CAUSES, STAGES, Injection, StepTimeModel, console_text, jsonl_text, parse_injection, step_table, write_step_log,
)
from polytrace_cli.workload.synth import WorkloadSpec

CAP = 4500
LENGTHS = LengthModel(prompt=Marginal("lognorm", {"s": 0.2, "scale": 100.0}),
                      response=Marginal("lognorm", {"s": 0.5, "scale": 800.0}))
SPEC = WorkloadSpec(task="math", steps=24, batch=16, n=4, dp_ranks=4, max_response_len=CAP, drift=0.005, seed=11)
MODEL = StepTimeModel(validate_every=10, checkpoint_every=12, injections=(
    Injection(5, "long_tail"), Injection(8, "dp_imbalance", 2.5), Injection(14, "unexplained", 2.0),
    Injection(17, "token_volume", 1.5), Injection(19, "weight_sync", 30.0), Injection(21, "validation", 99.0)))
# The steps view's columns and the frame's columns they must equal.
VIEW_COLUMNS = {f"{stage}_s": f"{stage}_s" for stage in STAGES if stage != "update_weights"} | {
    "step_s": "step_s", "response_length_mean": "response_length_mean", "response_length_max": "r_max",
    "response_length_min": "response_length_min", "clip_ratio": "response_clip_ratio",
    "prompt_length_mean": "prompt_length_mean", "prompt_length_max": "prompt_length_max",
    "prompt_length_min": "prompt_length_min", "total_tokens": "total_tokens"}


def _ingest(store, folder, run):
    reports = ingest_paths(store, [folder], run_name=run, task="math")
    assert reports and not any(r.failed for r in reports), [r.message for r in reports]
    return store.sql(
        "SELECT s.* FROM steps s JOIN runs r USING (run_id) WHERE r.name = $run AND NOT s.is_validation_only ORDER BY step",
        params={"run": run}).pl()


# Generated once per worker in well under a second: the tests need not queue on one worker.
CHEAP_SHARED_FIXTURES = {"frame"}


@pytest.fixture(scope="module")
def frame() -> pl.DataFrame:
    return step_table(LENGTHS, SPEC, MODEL)


def test_the_same_seed_writes_the_same_bytes(tmp_path):
    first = write_step_log(LENGTHS, SPEC, MODEL, tmp_path / "a", ("verl-console", "verl-jsonl"), truth=tmp_path / "a.json")
    second = write_step_log(LENGTHS, SPEC, MODEL, tmp_path / "b", ("verl-console", "verl-jsonl"), truth=tmp_path / "b.json")
    for one, other in zip(first.files, second.files):
        assert one.read_bytes() == other.read_bytes()
    other_seed = write_step_log(LENGTHS, replace(SPEC, seed=12), MODEL, tmp_path / "c", ("verl-console",))
    assert other_seed.files[0].read_bytes() != first.files[0].read_bytes()


def test_stage_seconds_follow_the_model_formulas_exactly_without_noise():
    """σ = 0, no warm-up: gen = a_gen + b_tail·r_max + b_vol·response_tokens, k = a_k + b_k·busiest,
    reward = a_r + b_r·n_responses, adv = a_adv, step = Σ stages + rest (+ testing, checkpoint)."""
    model = StepTimeModel(noise_sigma=0.0, warmup_steps=0, validate_every=3, checkpoint_every=4)
    table = step_table(LENGTHS, replace(SPEC, steps=8), model)
    for row in table.iter_rows(named=True):
        assert row["gen_s"] == pytest.approx(20.0 + 0.012 * row["r_max"] + 2.0e-5 * row["response_tokens"])
        assert row["old_log_prob_s"] == pytest.approx(5.0 + 1.5e-5 * row["busiest_rank_tokens"])
        assert row["update_actor_s"] == pytest.approx(10.0 + 4.5e-5 * row["busiest_rank_tokens"])
        assert row["reward_s"] == pytest.approx(2.0 + 0.02 * 64)
        assert row["adv_s"] == pytest.approx(0.3)
        assert row["values_s"] is None and row["update_critic_s"] is None
        overheads = (row["testing_s"] or 0.0) + (row["save_checkpoint_s"] or 0.0)
        stages = sum(row[f"{s}_s"] or 0.0 for s in STAGES)
        assert row["step_s"] == pytest.approx(stages + 0.5)
        assert overheads == (120.0 if row["step"] in (3, 6) else 0.0) + (60.0 if row["step"] in (4, 8) else 0.0) \
            + (120.0 if row["step"] == 8 else 0.0)  # the last step validates and saves
        assert row["n_responses"] == 64
        assert row["mean_rank_tokens"] == row["total_tokens"] / 4
    excluded = step_table(LENGTHS, replace(SPEC, steps=8), replace(model, step_includes_overheads=False))
    row = excluded.filter(pl.col("step") == 8).row(0, named=True)
    assert row["step_s"] == pytest.approx(sum(row[f"{s}_s"] for s in STAGES if s not in ("testing", "save_checkpoint")
                                              and row[f"{s}_s"] is not None) + 0.5)


def test_warmup_slows_generation_on_the_first_steps_by_the_schedule():
    """warmup_slowdown 1.8 over 2 steps: gen × 1.8 on step 1, × 1.4 on step 2; the truth is the extra."""
    model = StepTimeModel(noise_sigma=0.0)
    table = step_table(LENGTHS, replace(SPEC, steps=4), model)
    for row in table.iter_rows(named=True):
        plain = 20.0 + 0.012 * row["r_max"] + 2.0e-5 * row["response_tokens"]
        factor = {1: 1.8, 2: 1.4}.get(row["step"], 1.0)
        assert row["gen_s"] == pytest.approx(plain * factor)
        assert row["cause_warmup_s"] == pytest.approx(plain * (factor - 1))
        assert row["cause_warmup_stage"] == ("gen" if factor > 1 else None)
        assert row["is_warmup"] == (factor > 1)


def test_injected_causes_show_where_they_were_injected(frame):
    by_step = {row["step"]: row for row in frame.iter_rows(named=True)}
    long_tail = by_step[5]
    assert long_tail["r_max"] == CAP
    assert long_tail["cause_long_tail_stage"] == "gen" and long_tail["cause_long_tail_s"] > 0
    others = frame.filter(~pl.col("step").is_in([5, 17]))
    assert others["r_max"].max() < CAP  # only the injected steps reach the cap
    imbalance = by_step[8]
    assert imbalance["busiest_rank_tokens"] / imbalance["mean_rank_tokens"] == pytest.approx(2.5, abs=0.25)
    balanced = others.filter(pl.col("step") != 8)
    typical = (balanced["busiest_rank_tokens"] / balanced["mean_rank_tokens"]).max()
    assert typical < 1.6
    assert imbalance["cause_dp_imbalance_stage"] == "update_actor" and imbalance["cause_dp_imbalance_s"] > 0
    unexplained = by_step[14]
    assert unexplained["cause_unexplained_s"] == pytest.approx(unexplained["gen_s"] / 2)
    volume = by_step[17]
    assert volume["response_tokens"] > 1.4 * others["response_tokens"].median()
    assert volume["cause_token_volume_s"] > 0
    assert by_step[19]["cause_weight_sync_s"] == 30.0 and by_step[19]["cause_weight_sync_stage"] == "update_weights"
    assert by_step[19]["update_weights_s"] > 30.0
    assert by_step[21]["testing_s"] == 99.0 and by_step[21]["cause_validation_s"] == 99.0
    # Validation on 10, 20, the injected 21 and the last step 24; checkpoints on 12 and 24.
    assert frame.filter("is_validation")["step"].to_list() == [10, 20, 21, 24]
    assert frame.filter("is_checkpoint")["step"].to_list() == [12, 24]
    assert frame.filter(pl.col("cause_checkpoint_s") > 0)["step"].to_list() == [12, 24]
    # A cause is zero and stageless wherever it was neither injected nor scheduled.
    for cause in ("long_tail", "dp_imbalance", "unexplained", "token_volume", "weight_sync"):
        hit = frame.filter(pl.col(f"cause_{cause}_s") != 0)
        assert hit.height == 1, cause
        assert frame.filter(pl.col(f"cause_{cause}_s") == 0)[f"cause_{cause}_stage"].is_null().all()


def test_long_tail_truth_is_the_tail_coefficient_times_the_jump():
    model = StepTimeModel(noise_sigma=0.0, warmup_steps=0)
    plain = step_table(LENGTHS, replace(SPEC, steps=6), model)
    tail = step_table(LENGTHS, replace(SPEC, steps=6), replace(model, injections=(Injection(4, "long_tail"),)))
    before, after = plain.row(3, named=True), tail.row(3, named=True)
    assert after["r_max"] == CAP
    assert after["cause_long_tail_s"] == pytest.approx(0.012 * (CAP - before["r_max"]))
    assert after["response_tokens"] == before["response_tokens"] + CAP - before["r_max"]


def test_console_log_ingests_to_exactly_the_generated_numbers(tmp_path, store, frame):
    folder = tmp_path / "console"
    folder.mkdir()
    (folder / "train.log").write_text(console_text(frame, SPEC, MODEL))
    steps = _ingest(store, folder, "console")
    assert steps["step"].to_list() == frame["step"].to_list()
    for view_column, truth_column in VIEW_COLUMNS.items():
        assert steps[view_column].cast(pl.Float64).to_list() == frame[truth_column].cast(pl.Float64).to_list(), view_column
    weights = store.execute("SELECT step, value FROM step_metrics WHERE key = 'timing_s/update_weights' ORDER BY step").fetchall()
    assert [v for _, v in weights] == frame["update_weights_s"].to_list()
    seqlen = dict(store.execute("SELECT step, value FROM step_metrics WHERE key = 'global_seqlen/max'").fetchall())
    assert [seqlen[s] for s in frame["step"]] == frame["busiest_rank_tokens"].cast(pl.Float64).to_list()
    # Nothing rejected; every line that is not a metric line falls under a named rule.
    assert store.execute("SELECT count(*) FROM ingest_errors").fetchone()[0] == 0
    rules = dict(store.execute("SELECT rule, sum(lines) FROM ignored_lines GROUP BY rule").fetchall())
    assert rules["tqdm"] == SPEC.steps and rules["pprint"] >= 5 and rules["warning"] >= 1
    meta = json.loads(store.execute("SELECT meta FROM runs WHERE name = 'console'").fetchone()[0])
    assert meta["n_gpus"] == 4 and meta["max_response_len"] == CAP and meta["n_sampling"] == 4


def test_validation_keys_only_on_validation_steps(tmp_path, store, frame):
    folder = tmp_path / "v"
    folder.mkdir()
    (folder / "train.log").write_text(console_text(frame, SPEC, MODEL))
    _ingest(store, folder, "v")
    with_val = [r[0] for r in store.execute(
        "SELECT DISTINCT step FROM step_metrics WHERE key LIKE 'val-core/%' ORDER BY step").fetchall()]
    assert with_val == [0, 10, 20, 21, 24]  # 0: the validation before training
    testing = [r[0] for r in store.execute("SELECT step FROM steps WHERE has_testing ORDER BY step").fetchall()]
    assert testing == [10, 20, 21, 24]
    only_val = store.execute("SELECT step FROM steps WHERE is_validation_only").fetchall()
    assert only_val == [(0,)]


def test_jsonl_and_console_ingest_to_the_same_step_metrics(tmp_path, store, frame):
    for name, text in (("console", console_text(frame, SPEC, MODEL)), ("jsonl", jsonl_text(frame, SPEC, MODEL))):
        folder = tmp_path / name
        folder.mkdir()
        (folder / ("train.log" if name == "console" else "metrics.jsonl")).write_text(text)
        ingest_paths(store, [folder], run_name=name, task="math")
    metrics = {
        name: store.execute("SELECT step, key, value FROM step_metrics JOIN runs r USING (run_id) WHERE r.name = ? "
                            "ORDER BY step, key", [name]).fetchall()
        for name in ("console", "jsonl")
    }
    assert len(metrics["console"]) > 40 * SPEC.steps
    assert metrics["console"] == metrics["jsonl"]


def test_fixed_style_is_verl_0_4_three_decimals(tmp_path, store, frame):
    text = console_text(frame, SPEC, MODEL, style="fixed")
    assert "np.float64" not in text and "(main_task pid=" in text
    folder = tmp_path / "old"
    folder.mkdir()
    (folder / "train.log").write_text(text)
    steps = _ingest(store, folder, "old")
    assert np.allclose(steps["gen_s"].to_numpy(), frame["gen_s"].to_numpy(), atol=5e-4, rtol=0)
    meta = json.loads(store.execute("SELECT meta FROM runs WHERE name = 'old'").fetchone()[0])
    assert meta["value_precision"] == 0.001 and meta["verl_version"] == "<=0.4"


def test_truth_beside_the_log_is_skipped_by_ingest(tmp_path, store, frame):
    """A truth.json left in a run's folder is neither an error nor a run of its own."""
    folder = tmp_path / "run"
    write_step_log(LENGTHS, SPEC, MODEL, folder, ("verl-console",), truth=folder / "truth.json")
    document = json.loads((folder / "truth.json").read_text())
    assert document["model"]["token_stages"]["update_actor"] == {"a": 10.0, "b": 4.5e-5}
    assert len(document["steps"]) == SPEC.steps and set(f"cause_{c}_s" for c in CAUSES) <= set(document["steps"][0])
    reports = ingest_paths(store, [folder], task="math")
    assert not any(r.failed for r in reports)
    assert store.execute("SELECT count(*) FROM runs").fetchone()[0] == 1
    assert store.execute("SELECT count(*) FROM ingest_errors").fetchone()[0] == 0
    write_step_log(LENGTHS, SPEC, MODEL, tmp_path / "csv", ("verl-jsonl",), truth=tmp_path / "truth.csv")
    assert pl.read_csv(tmp_path / "truth.csv")["step_s"].to_list() == pytest.approx(frame["step_s"].to_list())


def test_bad_schedules_and_injections_are_clear_errors():
    assert parse_injection("12:long_tail") == Injection(12, "long_tail", None)
    assert parse_injection("3:dp_imbalance:1.8") == Injection(3, "dp_imbalance", 1.8)
    for text, message in (("x:long_tail", "STEP:CAUSE"), ("4:slow", "unknown cause"), ("4:warmup:abc", "STEP:CAUSE")):
        with pytest.raises(PolytraceError, match=message):
            parse_injection(text)
    with pytest.raises(PolytraceError, match="outside the run's steps"):
        step_table(LENGTHS, SPEC, StepTimeModel(injections=(Injection(99, "long_tail"),)))
    with pytest.raises(PolytraceError, match="at least 2 DP ranks"):
        step_table(LENGTHS, replace(SPEC, dp_ranks=1), StepTimeModel(injections=(Injection(2, "dp_imbalance"),)))
    with pytest.raises(PolytraceError, match="--validate-every"):
        step_table(LENGTHS, SPEC, StepTimeModel(validate_every=0))


def test_a_resume_restarts_the_log_and_the_warmup(tmp_path, store):
    """resume_after 6: a checkpoint at 6, the job's head printed again, validation at the loaded step 6,
    and generation warm-up again on steps 7 and 8; the training steps ingest once each, exactly."""
    model = StepTimeModel(noise_sigma=0.0, validate_every=4, resume_after=6)
    spec = replace(SPEC, steps=10)
    table = step_table(LENGTHS, spec, model)
    warm = {row["step"]: row["gen_s"] / (20.0 + 0.012 * row["r_max"] + 2.0e-5 * row["response_tokens"])
            for row in table.iter_rows(named=True)}
    assert [round(warm[s], 9) for s in range(1, 11)] == [1.8, 1.4, 1, 1, 1, 1, 1.8, 1.4, 1, 1]
    assert table.filter("is_checkpoint")["step"].to_list() == [6]
    assert table.filter("is_warmup")["step"].to_list() == [1, 2, 7, 8]
    text = console_text(table, spec, model)
    assert text.count("+ python3 -m verl.trainer.main_ppo") == 2 and "SIGTERM" in text
    for name, body in (("console", text), ("jsonl", jsonl_text(table, spec, model))):
        folder = tmp_path / name
        folder.mkdir()
        (folder / ("train.log" if name == "console" else "metrics.jsonl")).write_text(body)
        ingest_paths(store, [folder], run_name=name, task="math")
        steps = store.sql("SELECT segment, step, gen_s, is_validation_only, flags FROM steps JOIN runs r USING (run_id) "
                          "WHERE r.name = $run ORDER BY segment, step", params={"run": name}).pl()
        validated = store.execute("SELECT DISTINCT step FROM step_metrics JOIN runs r USING (run_id) WHERE r.name = ? "
                                  "AND key LIKE 'val-core/%' ORDER BY step", [name]).fetchall()
        assert validated == [(0,), (4,), (6,), (8,), (10,)], name
        training = steps.filter(~pl.col("is_validation_only"))
        assert training["step"].to_list() == list(range(1, 11))
        assert training["gen_s"].to_list() == table["gen_s"].to_list()
    assert store.execute("SELECT count(*) FROM ingest_errors").fetchone()[0] == 0
    with pytest.raises(PolytraceError, match="--resume-after"):
        step_table(LENGTHS, spec, replace(model, resume_after=10))


def test_token_volume_and_imbalance_truths_are_the_model_terms_of_what_changed():
    """σ = 0: token_volume = b_tail·Δr_max + b_vol·Δresponse_tokens + Σ_k b_k·Δbusiest;
    dp_imbalance = Σ_k b_k·(busiest − busiest of the plain dispatch), with the mean rank load unchanged."""
    model = StepTimeModel(noise_sigma=0.0, warmup_steps=0)
    spec = replace(SPEC, steps=5)
    plain = step_table(LENGTHS, spec, model).row(2, named=True)
    volume = step_table(LENGTHS, spec, replace(model, injections=(Injection(3, "token_volume", 1.5),))).row(2, named=True)
    b_tokens = 1.5e-5 + 1.5e-5 + 4.5e-5
    assert volume["cause_token_volume_s"] == pytest.approx(
        0.012 * (volume["r_max"] - plain["r_max"]) + 2.0e-5 * (volume["response_tokens"] - plain["response_tokens"])
        + b_tokens * (volume["busiest_rank_tokens"] - plain["busiest_rank_tokens"]))
    assert volume["step_s"] - plain["step_s"] == pytest.approx(volume["cause_token_volume_s"])
    skewed = step_table(LENGTHS, spec, replace(model, injections=(Injection(3, "dp_imbalance", 2.0),))).row(2, named=True)
    assert skewed["mean_rank_tokens"] == plain["mean_rank_tokens"]
    assert skewed["cause_dp_imbalance_s"] == pytest.approx(
        b_tokens * (skewed["busiest_rank_tokens"] - plain["busiest_rank_tokens"]))
    assert skewed["step_s"] - plain["step_s"] == pytest.approx(skewed["cause_dp_imbalance_s"])


def test_response_scale_and_imbalance_change_every_step():
    plain = step_table(LENGTHS, replace(SPEC, max_response_len=None), replace(MODEL, injections=()))
    longer = step_table(LENGTHS, replace(SPEC, max_response_len=None), replace(MODEL, injections=(), response_scale=1.5))
    # The same draws, each response × 1.5 rounded: the sums within half a token per response.
    responses = SPEC.batch * SPEC.n
    assert (longer["response_tokens"] - 1.5 * plain["response_tokens"]).abs().max() <= 0.5 * responses
    skewed = step_table(LENGTHS, SPEC, replace(MODEL, injections=(), imbalance=1.5))
    ratio = skewed["busiest_rank_tokens"] / skewed["mean_rank_tokens"]
    assert ratio.min() > 1.35 and ratio.max() < 1.65
    # The training stages follow the skewed busiest rank: update_actor = (10 + 4.5e-5 · busiest) · ε.
    expected = 10 + 4.5e-5 * skewed["busiest_rank_tokens"]
    assert ((skewed["update_actor_s"] / expected) - 1).abs().max() < 0.15
    with pytest.raises(PolytraceError, match="imbalance"):
        step_table(LENGTHS, SPEC, replace(MODEL, imbalance=0.9))
    with pytest.raises(PolytraceError, match="response_scale"):
        step_table(LENGTHS, SPEC, replace(MODEL, response_scale=0.0))
