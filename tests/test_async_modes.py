"""Asynchronous runs: the execution mode and its evidence, the async metric names, the pipeline generator,
what bounds a run, the backtest and the cross-mode --against on generated verl logs with known truth.

Metric names are verl's own, read from volcengine/verl at commit b178a3cd56f58b2d502255daba591e92833930a7:
verl/experimental/fully_async_policy/fully_async_trainer.py (`timing_s/param_sync`,
`fully_async/count/stale_samples_processed`), fully_async_rollouter.py (`rollouter/active_time`,
`rollouter/idle_ratio`, `count/dropped_stale_samples`), detach_utils.py (`trainer/idle_ratio` =
timing_s/gen / timing_s/step, `fully_async/partial/partial_ratio`), one_step_off_policy/ray_trainer.py
(`timing_s/sync_rollout_weights`), docs/advance/one_step_off.md (`wait_prev_gen`, `generate_sequences`);
the V1 trainer's from verl-project/verl docs/advance/v1_async_trainer.md at commit
b89c3b3424714c18600652daed5a6a59f0b975d7 (`timing_s/gen` as the wait, `timing_s/update_weights`,
`timing_s/switch_to_rollout`, `training/off_policy/trajectory_staleness/*`); TRL's AsyncGRPO rollout
loop's from huggingface/trl trl/experimental/async_grpo/async_rollout_worker.py (`rollout/inflight`,
`rollout/generated_tok_s`, `rollout/score_wait_s`).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import schema_check
from polytrace_cli.analyze.semantics import record_of
from polytrace_cli.analyze.step_frame import step_frame
from polytrace_cli.diagnose import explain_run
from polytrace_cli.diagnose.against import explain_against
from polytrace_cli.diagnose.explain import decompose_run
from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.ingest.formats.trl.names import METRIC_ALIASES as TRL_ALIASES
from polytrace_cli.ingest.formats.verl.names import METRIC_ALIASES as VERL_ALIASES
from polytrace_cli.model import read_workload, run_info, training_mask
from polytrace_cli.simulate.backtest import backtest_run
from polytrace_cli.store import open_store
from polytrace_cli.workload.async_pipeline import bound_of, simulate
from polytrace_cli.workload.async_scenarios import SCENARIOS, relative_error, truth_bound
from polytrace_cli.workload.presets import preset
from polytrace_cli.workload.steplog import StepTimeModel, write_step_log
from polytrace_cli.workload.synth import WorkloadSpec

STEPS = 30
RUNS = {
    "sync": SCENARIOS["sync"][0],
    "one-step-off": SCENARIOS["rollout-bound one-step-off p=0.50"][0],
    "fully-async": SCENARIOS["rollout-bound p=0.55"][0],
    "separate-async": replace(SCENARIOS["rollout-bound separate-async p=0.45"][0], switch_s=20.0),
    "train-bound": SCENARIOS["train-bound p=0.80"][0],
    "weight-sync-bound": SCENARIOS["weight-sync-bound p=0.67"][0],
}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("async")
    lengths, _ = preset("math")
    spec = WorkloadSpec(task="math", steps=STEPS, batch=48, n=8, dp_ranks=2, max_response_len=20480, seed=3)
    truth = {}
    con = open_store(root / "store.duckdb")
    for name, model in RUNS.items():
        written = write_step_log(lengths, spec, model, root / name, ("verl-console",))
        ingest_paths(con, [root / name], run_name=name)
        truth[name] = written.frame
    # Four GPUs, two on the rollout: a split whatif can price exactly in whole GPUs.
    four = replace(spec, dp_ranks=4)
    written = write_step_log(lengths, four, replace(RUNS["fully-async"], rollout_gpu_share=0.5), root / "four")
    ingest_paths(con, [root / "four"], run_name="four")
    truth["four"] = written.frame
    # Another framework whose trainer wait maps to the canonical name (as a plugin format's `metric_aliases`
    # declares it; the shared row is what the catalog writes for a key no other format names), in a file
    # verl's file logger shape reads.
    con.execute("INSERT INTO metric_aliases VALUES ('*', 'perf/trainer_wait_time', 'trainer_wait_s')")
    other = root / "other" / "metrics.jsonl"
    other.parent.mkdir()
    other.write_text("".join(json.dumps({"step": step, "data": {"timing_s/step": 10.0 + step,
                                                                  "perf/trainer_wait_time": 4.0}}) + "\n"
                             for step in range(1, 6)), encoding="utf-8")
    ingest_paths(con, [other], run_name="other")
    yield con, truth
    con.close()


def test_the_pipeline_by_hand():
    # R = 5 / 0.5 = 10 s of rollout, C = 3 / 0.5 = 6 s of training, W = 1 s of weight sync (the rollout
    # pauses), staleness limit 1: step 1 waits the whole first batch (10 s) and takes 10 + 6 + 1 = 17 s;
    # batch 2 starts at 10, pauses for the sync at 16–17 and ends at 21, so step 2 (from 17) waits 4 s and
    # takes 4 + 6 + 1 = 11 s, and so on: the steady step is R + W = 11 s. In step 3's window [28, 39] the
    # rollout works 28–32 and 32–38 (batch 4 starts at 32), pauses 38–39: idle 0.
    run = simulate(np.full(4, 5.0), np.full(4, 3.0), np.zeros(4), np.ones(4), 0.5, 1)
    assert run["step_s"].tolist() == [17.0, 11.0, 11.0, 11.0]
    assert run["wait_s"].tolist() == [10.0, 4.0, 4.0, 4.0]
    assert run["rollout_active_s"][2] == 10.0 and run["rollout_idle_s"][2] == 0.0
    assert run["staleness"].tolist() == [0.0, 1.0, 1.0, 1.0]
    # The last step's rollout has no next batch to make: it idles there.
    assert list(run["bound"]) == ["rollout-bound"] * 3 + ["train-bound"]
    # Staleness limit 0: batch s starts only once step s − 1 is done, so the sides alternate: the trainer
    # waits R = 10 s, the rollout idles C = 6 s of every steady step of 17 s.
    serial = simulate(np.full(4, 5.0), np.full(4, 3.0), np.zeros(4), np.ones(4), 0.5, 0)
    assert serial["step_s"].tolist() == [17.0] * 4 and serial["rollout_idle_s"][1:].tolist() == [6.0] * 3
    assert serial["throttled"][1:].all()


def test_bound_of_takes_the_largest_part():
    assert bound_of(5.0, 2.0, 1.0) == ("rollout-bound", 5.0)
    assert bound_of(0.0, 7.0, 1.0) == ("train-bound", 7.0)
    assert bound_of(1.0, 2.0, 9.0) == ("overhead-bound", 9.0)


def test_async_names_are_mapped_to_canonical_names():
    assert {key: VERL_ALIASES[key] for key in (
        "timing_s/wait_prev_gen", "timing_s/param_sync", "timing_s/sync_rollout_weights", "rollouter/active_time",
        "rollouter/idle_ratio", "trainer/idle_ratio", "fully_async/count/dropped_stale_samples",
        "training/off_policy/trajectory_staleness/mean", "training/off_policy/trajectory_staleness/max")} == {
        "timing_s/wait_prev_gen": "trainer_wait_s", "timing_s/param_sync": "update_weights_s",
        "timing_s/sync_rollout_weights": "update_weights_s", "rollouter/active_time": "rollout_s",
        "rollouter/idle_ratio": "rollout_idle_ratio", "trainer/idle_ratio": "trainer_idle_ratio",
        "fully_async/count/dropped_stale_samples": "dropped_samples",
        "training/off_policy/trajectory_staleness/mean": "staleness_mean",
        "training/off_policy/trajectory_staleness/max": "staleness_max"}
    assert TRL_ALIASES["rollout/score_wait_s"] == "score_wait_s"
    # verl's timing_s/gen keeps its one alias: what it means is the run's execution mode.
    assert VERL_ALIASES["timing_s/gen"] == "gen_s"


@pytest.mark.parametrize("run, mode, evidence", [
    ("sync", "sync", "no asynchronous config key or metric family: colocated, one phase after the other"),
    ("one-step-off", "one-step-off", "config: started as python -m verl.experimental.one_step_off_policy.main_ppo"),
    ("fully-async", "fully-async", "config: async_training.staleness_threshold=1"),
    ("separate-async", "separate-async", "config: trainer.v1.trainer_mode=separate_async"),
    ("other", "fully-async", "canonical families: trainer_wait_s"),
])
def test_execution_mode_and_its_evidence(store, run, mode, evidence):
    con, _ = store
    record = record_of(con, run_info(con, run).run_id)
    assert record["execution_mode"] == mode
    assert evidence in record["execution_mode_evidence"]


def test_fully_async_step_time_adds_the_weight_sync_timed_outside_the_step(store):
    # verl's fully async trainer times param_sync after the `step` timer: the wall time of a step is
    # timing_s/step + timing_s/param_sync, the generator's true step.
    con, truth = store
    frame = step_frame(con, [run_info(con, "fully-async").run_id]).filter(pl.col("step") >= 1).sort("step")
    assert np.allclose(frame["step_s"].to_numpy(), truth["fully-async"]["step_s"].to_numpy(), rtol=1e-9)
    assert (frame["logged_step_s"] < frame["step_s"]).all()


@pytest.mark.parametrize("run", ["fully-async", "one-step-off", "train-bound", "weight-sync-bound", "sync"])
def test_the_bound_named_and_its_seconds_match_the_truth(store, run):
    con, truth = store
    bounds = explain_run(con, run).bounds
    true = truth_bound(truth[run])
    assert bounds["run"]["bound"] == true["bound"]
    assert relative_error(bounds["run"]["seconds_per_step"], true["seconds_per_step"]) <= 0.10
    assert bounds["windows"] and all(w["bound"] == true["bound"] for w in bounds["windows"])


def test_no_generation_cause_is_put_on_the_trainer_wait(store):
    con, _ = store
    for run in ("fully-async", "one-step-off", "separate-async"):
        frame = read_workload(con, run_info(con, run).run_id)
        assert frame["gen_s"].is_null().all() and frame["trainer_wait_s"].is_not_null().all()
        causes = decompose_run(frame, training_mask(frame)).causes
        assert causes.filter(pl.col("cause").is_in(["long_tail", "token_volume"])
                             & (pl.col("stage") == "trainer_wait")).height == 0


def test_rules_of_thumb_and_recomputed_idle_ratios(store):
    con, _ = store
    one_step_off = explain_run(con, "one-step-off").bounds["run"]
    # The math preset's longest response sits at the cap, about 2× the mean: uniform lengths.
    assert one_step_off["rule"] == "verl one-step-off: a high wait_prev_gen with uniform lengths says add rollout GPUs"
    fully = explain_run(con, "fully-async").bounds["run"]
    assert fully["trainer_idle_ratio"] == pytest.approx(fully["wait_s"] / fully["step_s"], rel=0.05)
    assert fully["rule"].startswith("trainer idle high, rollout idle low")
    separate = explain_run(con, "separate-async").bounds
    assert separate["run"]["overhead_s"] == pytest.approx(5.0 + 20.0, rel=0.1)  # weight sync and the switch
    assert any("train-bound cannot be told" in note for note in separate["notes"])


def test_backtest_of_an_asynchronous_run_beats_the_median(store):
    con, _ = store
    step = backtest_run(con, "fully-async").to_dict()["step"]
    assert step["accuracy"] >= 90.0 and step["accuracy"] > step["median_baseline"]


def test_against_across_modes_names_the_overlap_gained(store):
    con, truth = store
    comparison = explain_against(con, "fully-async", "sync").to_dict()
    causes = {c["cause"]: c["seconds"] for c in comparison["causes"]}
    assert set(causes) == {"overlap_gained", "trainer_wait", "stale_samples", "efficiency", "weight_sync",
                           "unexplained"}
    assert sum(causes.values()) == pytest.approx(comparison["delta_s"])
    true_gain = -float(truth["sync"]["gen_s"].mean())
    assert relative_error(causes["overlap_gained"], true_gain) <= 0.10
    assert causes["trainer_wait"] == pytest.approx(float(truth["fully-async"]["trainer_wait_s"].mean()), rel=0.10)


def test_generator_refuses_what_it_cannot_model(tmp_path):
    from polytrace_cli.errors import PolytraceError

    lengths, _ = preset("math")
    spec = WorkloadSpec(task="math", steps=4, batch=4, n=2, dp_ranks=2, seed=0)
    with pytest.raises(PolytraceError, match="unknown execution mode"):
        write_step_log(lengths, spec, StepTimeModel(mode="async"), tmp_path)
    with pytest.raises(PolytraceError, match="rollout-gpu-share"):
        write_step_log(lengths, spec, StepTimeModel(mode="fully-async", rollout_gpu_share=1.0), tmp_path)
    with pytest.raises(PolytraceError, match="without injected causes"):
        write_step_log(lengths, spec, StepTimeModel(mode="one-step-off", validate_every=2), tmp_path)


def test_the_log_prints_each_mode_as_verl_does(store, tmp_path):
    lengths, _ = preset("math")
    spec = WorkloadSpec(task="math", steps=3, batch=4, n=2, dp_ranks=2, seed=0)
    write_step_log(lengths, spec, RUNS["fully-async"], tmp_path / "f")
    text = Path(tmp_path / "f" / "train.log").read_text()
    assert "python3 -m verl.experimental.fully_async_policy.fully_async_main" in text
    # The weight sync and the rollouter's times are logged on lines of their own at the same step.
    assert "step:2 - timing_s/wait_last_valid:0.0 - timing_s/param_sync:" in text
    assert "step:2 - rollouter/active_time:" in text


def test_async_alerts_by_hand():
    from polytrace_cli.watch.asynchronous import AsyncAlerts

    alerts = AsyncAlerts()
    raised = []
    # Ten steps waiting 10% of a 100 s step, then the wait jumps to 50%: the fifth high step alerts, once.
    for step in range(1, 19):
        wait = 10.0 if step <= 10 else 50.0
        raised += [(step, a["signal"]) for a in alerts.observe(step, step == 1, 100.0, wait, None, None, False)]
    assert raised == [(15, "wait_share")]
    # Staleness 1, 1, 2, 3, 4, 5, 6: five rises in a row by the seventh step; a cumulative drop counter
    # 0, 0, 4, 4: no growth of the per-step count.
    grow = AsyncAlerts()
    staleness = [1, 1, 2, 3, 4, 5, 6]
    dropped = [0, 0, 4, 4, 4, 4, 4]
    raised = [(step, a["signal"]) for step, (s, d) in enumerate(zip(staleness, dropped), start=1)
              for a in grow.observe(step, False, None, None, s, d, True)]
    assert raised == [(7, "staleness")]


def test_watch_alerts_a_wait_above_its_usual_share(tmp_path):
    import jsonschema

    from polytrace_cli.schemas import json_schema
    from polytrace_cli.watch import WatchSettings, watch_log

    lengths, _ = preset("math")
    spec = WorkloadSpec(task="math", steps=24, batch=48, n=8, dp_ranks=2, max_response_len=20480, seed=5)
    # The rollout on 2/3 of the GPUs keeps up with the trainer (a small wait) until, from step 15,
    # generation takes 300 s more (450 s more on 2/3 of the GPUs), most of it waited for.
    model = replace(RUNS["fully-async"], rollout_gpu_share=0.67, level_shifts=((15, "gen", 300.0),))
    write_step_log(lengths, spec, model, tmp_path / "run")
    con = open_store(tmp_path / "store.duckdb")
    events: list[dict] = []
    watch_log(con, tmp_path / "run" / "train.log", events.append, WatchSettings(poll=0.05, idle_exit=0.3))
    con.close()
    schema = json_schema("watch")
    for event in events:
        schema_check.validate(event, schema)
    waits = [e for e in events if e.get("kind") == "async" and e["signal"] == "wait_share"]
    assert [e["step"] for e in waits] == [19]
    assert waits[0]["value"] > waits[0]["usual"] + 0.1


@pytest.mark.parametrize("policy, setting", [("gpu-split=0.75", {"rollout_gpu_share": 0.75}),
                                             ("staleness=0", {"staleness_limit": 0})])
def test_whatif_prices_another_split_and_staleness_limit(store, policy, setting):
    from polytrace_cli.simulate.policies import whatif_run
    from polytrace_cli.workload.steplog import step_table

    con, truth = store
    scenario = whatif_run(con, "four", [policy]).to_dict()["scenarios"][0]
    lengths, _ = preset("math")
    spec = WorkloadSpec(task="math", steps=STEPS, batch=48, n=8, dp_ranks=4, max_response_len=20480, seed=3)
    other = step_table(lengths, spec, replace(RUNS["fully-async"], **{"rollout_gpu_share": 0.5, **setting}))
    true_share = 1.0 - float(other["step_s"].sum()) / float(truth["four"]["step_s"].sum())
    assert scenario["saving_share"] == pytest.approx(true_share, abs=0.03)
    assert "0.50 of the GPUs on the rollout, staleness limit 1" in scenario["note"]


def test_whatif_refuses_an_asynchronous_policy_on_a_sync_run(store):
    from polytrace_cli.simulate.policies import whatif_run

    con, _ = store
    scenario = whatif_run(con, "sync", ["gpu-split=0.6"]).to_dict()["scenarios"][0]
    assert scenario["saving_s"] is None and "one-step-off" in scenario["note"]



@pytest.mark.parametrize("folder", ["verl05dev-agentloop-opd-wandb", "verl06-multiturn-gui-agent",
                                    "trl-new-grpo-7b-steptime-collapse"])
def test_real_colocated_runs_read_as_sync(tmp_path, folder):
    from conftest import need_real_data

    # Colocated trainers (verl's agent loop serves rollouts asynchronously inside a synchronous step).
    path = need_real_data("real", folder)
    con = open_store(tmp_path / "store.duckdb")
    ingest_paths(con, [path], run_name="real")
    record = record_of(con, run_info(con, "real").run_id)
    con.close()
    assert record["execution_mode"] == "sync"


def test_bounds_by_hand():
    from polytrace_cli.diagnose.bounds import run_bounds

    # Four steps of 10 s: the trainer waits 2 s, the rollout works 3 s, the weight sync takes 1 s, so the
    # rollout idles 10 − 3 − 1 = 6 s a step: train-bound, 6 s; trainer idle 2 / 10 = 0.2 against a logged 0.05.
    frame = pl.DataFrame({"step": [1, 2, 3, 4], "wall_s": [10.0] * 4, "trainer_wait_s": [2.0] * 4,
                          "rollout_s": [3.0] * 4, "update_weights_s": [1.0] * 4, "switch_s": [None] * 4,
                          "trainer_idle_ratio": [0.05] * 4, "rollout_idle_ratio": [None] * 4,
                          "r_max": [100.0] * 4, "response_tokens": [800.0] * 4, "n_responses": [16.0] * 4},
                         schema_overrides={"switch_s": pl.Float64, "rollout_idle_ratio": pl.Float64})
    bounds = run_bounds(frame, pl.Series([True] * 4), "fully-async")
    run = bounds["run"]
    assert (run["bound"], run["seconds_per_step"], run["wait_s"], run["overhead_s"]) == ("train-bound", 6.0, 2.0, 1.0)
    assert run["trainer_idle_ratio"] == pytest.approx(0.2) and run["rollout_idle_ratio"] == pytest.approx(0.7)
    assert any("logged trainer idle ratio (0.05) differs from the one its timers give (0.20)" in n for n in bounds["notes"])
    assert run["rule"].startswith("rollout idle high, trainer idle low")


def test_no_bound_from_no_timers():
    from polytrace_cli.diagnose.bounds import run_bounds

    # An asynchronous run (TRL's AsyncGRPO logs a step time, no wait and no rollout busy time): no bound.
    frame = pl.DataFrame({"step": [1, 2, 3], "wall_s": [10.0, 11.0, 10.5]})
    assert run_bounds(frame, pl.Series([True] * 3), "async-grpo") is None


def test_a_rollout_wait_says_what_the_rollout_did(store):
    con, truth = store
    frame = truth["fully-async"]
    step = int(frame.filter(pl.col("step") >= 3).sort("trainer_wait_s", descending=True)["step"][0])
    causes = explain_run(con, "fully-async", step=step).to_dict()["steps"][0]["causes"]
    (wait,) = [c for c in causes if c["cause"] == "rollout_wait"]
    assert wait["stage"] == "trainer_wait"
    true_busy = float(frame.filter(pl.col("step") == step)["rollout_active_s"][0])
    assert wait["rollout"]["rollout_s"] == pytest.approx(true_busy, rel=1e-6)
    assert wait["rollout"]["typical_rollout_s"] > 0
