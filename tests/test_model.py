"""The per-run step-time model, fitted on verl console logs written from a known model.

`write_known_log` is the small generator these tests (and test_explain*.py) use: every step's
workload is drawn at random, every stage's seconds come from known coefficients with 1%
multiplicative noise, and causes can be injected at chosen steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.model import fit_model, read_workload, training_mask

TRUE = {
    "gen": {"intercept": 5.0, "r_max": 0.004, "response_tokens": 2e-5},
    "reward": {"intercept": 0.5, "n_responses": 0.004},
    "old_log_prob": {"intercept": 1.0, "busiest_rank_tokens": 2e-5},
    "ref": {"intercept": 0.8, "busiest_rank_tokens": 1.5e-5},
    "update_actor": {"intercept": 2.0, "busiest_rank_tokens": 8e-5},
    "adv": {"intercept": 0.3},
    "update_weights": {"intercept": 1.5},
}
REST_S = 0.4
RANKS = 8
CAP = 16384


@dataclass
class KnownLog:
    """What the generator wrote: the path, per-step workload and seconds, and the injected causes."""

    path: Path
    workload: dict[int, dict[str, float]] = field(default_factory=dict)
    seconds: dict[int, dict[str, float]] = field(default_factory=dict)
    injected: dict[int, str] = field(default_factory=dict)


def _stage_seconds(workload: dict[str, float]) -> dict[str, float]:
    out = {}
    for stage, terms in TRUE.items():
        out[stage] = terms["intercept"] + sum(b * workload[name] for name, b in terms.items() if name != "intercept")
    return out


def write_known_log(path: Path, steps: int = 80, seed: int = 0, inject: dict[int, str] | None = None,
                    validation_every: int | None = None, checkpoint_every: int | None = None,
                    warmup: bool = True, noise: float = 0.01, fixed_batch: bool = False,
                    spread: float = 1.0, drift: float = 0.0, first_step: int = 1,
                    log_stages: tuple[str, ...] | None = None, balanced: bool = False) -> KnownLog:
    """Write a verl console log of `steps` steps from the TRUE model; `inject` maps step -> cause
    (long_tail, token_volume, dp_imbalance, unexplained, weight_sync). Validation (60 s) and
    checkpoints (30 s) land every K steps, inside timing_s/step as verl does; step 1 is a warm-up
    step (every stage × 1.8) unless warmup=False. `spread` scales how much the workload varies
    from step to step (1: widely, for fitting; 0.2: a steady run); `drift` grows the mean response
    length linearly by that share over the run. The log starts at `first_step` (its first step is
    the warm-up step) and prints the timers of `log_stages` only (default: all; step time always).
    global_seqlen/balanced_max is the mean rank + 0.2–2%; with `balanced` the training stages follow
    it instead of global_seqlen/max, as they do when verl balances the batch, and the command line
    says `trainer.balance_batch=True` (else False)."""
    rng = np.random.default_rng(seed)
    inject = dict(inject or {})
    log = KnownLog(path)
    lines = [f"+ python3 -m verl.trainer.main_ppo trainer.balance_batch={balanced}",
             "(TaskRunner pid=1) Training from scratch", "some unrelated line"]
    for step in range(first_step, first_step + steps):
        n = 512.0 if fixed_batch else float(round(512 + spread * rng.uniform(-128, 128)))
        mean_len = (1000 + spread * float(rng.uniform(-500, 500))) * (1 + drift * (step - first_step) / steps)
        prompt_mean = float(rng.uniform(200, 400))
        r_max = 6000 + spread * float(rng.uniform(-3000, 3000))
        gap = 0.16 + spread * float(rng.uniform(-0.14, 0.14))
        cause = inject.get(step)
        if cause == "long_tail":
            r_max = float(CAP)
        if cause == "token_volume":
            n, mean_len = n * 1.6, mean_len * 1.5
        if cause == "dp_imbalance":
            gap = 2.0
        total = n * (prompt_mean + mean_len)
        rank_mean = total / RANKS
        workload = {"r_max": r_max, "n_responses": n, "response_tokens": n * mean_len,
                    "busiest_rank_tokens": rank_mean * (1 + gap), "mean_rank_tokens": rank_mean,
                    "balanced_busiest_tokens": rank_mean * (1 + float(rng.uniform(0.002, 0.02)))}
        timed = dict(workload, busiest_rank_tokens=workload["balanced_busiest_tokens"]) if balanced else workload
        seconds = {k: v * float(rng.lognormal(0, noise)) for k, v in _stage_seconds(timed).items()}
        if cause == "unexplained":
            seconds["gen"] *= 2
        if cause == "weight_sync":
            seconds["update_weights"] *= 8
        if warmup and step == first_step:
            seconds = {k: v * 1.8 for k, v in seconds.items()}
            log.injected[step] = "warmup"
        step_s = sum(seconds.values()) + REST_S
        if validation_every and step % validation_every == 0:
            seconds["testing"] = 60.0 * float(rng.lognormal(0, noise))
            step_s += seconds["testing"]
            log.injected.setdefault(step, "validation")
        if checkpoint_every and step % checkpoint_every == 0:
            seconds["save_checkpoint"] = 30.0 * float(rng.lognormal(0, noise))
            step_s += seconds["save_checkpoint"]
            log.injected.setdefault(step, "checkpoint")
        if cause:
            log.injected[step] = cause
        seconds["step"] = step_s
        log.workload[step], log.seconds[step] = workload, seconds
        pairs = [f"timing_s/{k}:np.float64({v:.6f})" for k, v in seconds.items()
                 if log_stages is None or k in (*log_stages, "step", "testing", "save_checkpoint")]
        pairs += [f"response_length/max:{r_max:.1f}", f"response_length/mean:{mean_len:.6f}",
                  f"prompt_length/mean:{prompt_mean:.6f}", f"perf/total_num_tokens:np.int64({round(total)})",
                  f"global_seqlen/max:{workload['busiest_rank_tokens']:.3f}", f"global_seqlen/mean:{rank_mean:.3f}",
                  f"global_seqlen/balanced_max:{workload['balanced_busiest_tokens']:.3f}",
                  "actor/pg_loss:0.01"]
        lines.append(f"step:{step} - " + " - ".join(pairs))
    path.write_text("\n".join(lines) + "\n")
    return log


def ingest_known(store, log: KnownLog, run: str = "known") -> str:
    reports = ingest_paths(store, [log.path], run_name=run)
    assert [r.status for r in reports] == ["ingested"], reports
    return run


def test_workload_frame_reads_the_logged_workload(store, tmp_path):
    log = write_known_log(tmp_path / "train.log", steps=12, validation_every=5)
    frame = read_workload(store, ingest_known(store, log))
    assert frame.height == 12
    row = frame.filter(pl.col("step") == 3).row(0, named=True)
    truth = log.workload[3]
    for name in ("r_max", "n_responses", "response_tokens", "busiest_rank_tokens", "mean_rank_tokens"):
        assert row[name] == pytest.approx(truth[name], rel=1e-4), name
    assert row["ranks"] == RANKS and row["workload_basis"] == "step_aggregates"
    assert row["update_weights_s"] == pytest.approx(log.seconds[3]["update_weights"], abs=1e-5)
    # wall time is the logged step time (verl's step time includes validation)
    assert frame.filter(pl.col("step") == 5)["wall_s"].item() == pytest.approx(log.seconds[5]["step"], abs=1e-5)
    mask = training_mask(frame)
    assert frame.filter(~mask)["step"].to_list() == [1, 5, 10]


def test_a_run_without_step_metrics_has_no_timed_step_and_says_so_cheaply(store, tmp_path):
    from polytrace_cli.model import logs_step_metrics, run_info
    from tests.test_analyze_lengths import add_run, add_samples

    timed = run_info(store, ingest_known(store, write_known_log(tmp_path / "train.log", steps=6))).run_id
    sampled = add_run(store, "sampled")
    add_samples(store, sampled, step=0, prompts=[5, 6], responses=[40, 50], dp_rank=0)
    add_samples(store, sampled, step=1, prompts=[5, 6], responses=[30, 70], dp_rank=1)
    assert logs_step_metrics(store, timed) and not logs_step_metrics(store, sampled)
    frame = read_workload(store, sampled)  # the connection is free for the next query
    assert frame.height == 2 and frame["wall_s"].is_null().all() and not training_mask(frame).any()


def test_fit_recovers_known_coefficients(store, tmp_path):
    inject = {12: "unexplained", 30: "long_tail", 47: "dp_imbalance", 61: "weight_sync"}
    log = write_known_log(tmp_path / "train.log", steps=100, seed=3, inject=inject, validation_every=10,
                          checkpoint_every=25)
    frame = read_workload(store, ingest_known(store, log))
    model = fit_model(frame, training_mask(frame))
    typical = model.predict_typical()
    for stage, terms in TRUE.items():
        fit = model.stages[stage]
        # an intercept trades off against its slopes: held to 2% of the stage's typical seconds
        assert fit.intercept == pytest.approx(terms["intercept"], abs=0.02 * typical[stage]), stage
        for name, value in terms.items():
            if name != "intercept":
                assert fit.coefficients[name] == pytest.approx(value, rel=0.04), (stage, name)
    assert model.stages["other"].intercept == pytest.approx(REST_S, abs=0.02)
    assert set(model.stages) == {*TRUE, "other"}


def test_constant_feature_drops_its_term(store, tmp_path):
    log = write_known_log(tmp_path / "train.log", steps=40, fixed_batch=True)
    frame = read_workload(store, ingest_known(store, log))
    model = fit_model(frame, training_mask(frame))
    reward = model.stages["reward"]
    assert reward.dropped == ("n_responses",) and reward.coefficients == {}
    assert reward.intercept == pytest.approx(0.5 + 0.004 * 512, rel=0.02)


def test_predict_and_replay_follow_the_workload(store, tmp_path):
    log = write_known_log(tmp_path / "train.log", steps=60, seed=5)
    frame = read_workload(store, ingest_known(store, log))
    model = fit_model(frame, training_mask(frame))
    replay = model.replay()
    assert replay.columns[:2] == ["segment", "step"] and "gen_s" in replay.columns
    stage_columns = [c for c in replay.columns if c.endswith("_s") and c not in ("step_s", "wall_s")]
    assert np.allclose(replay.select(pl.sum_horizontal(stage_columns)).to_series().to_numpy(),
                       replay["step_s"].to_numpy())
    # Away from the warm-up step, the replay is within a few % of each logged step.
    steady = replay.filter(pl.col("step") > 1)
    error = (steady["step_s"] / steady["wall_s"] - 1).abs()
    assert error.max() < 0.04
    truth = sum(_stage_seconds(log.workload[20]).values()) + REST_S
    assert replay.filter(pl.col("step") == 20)["step_s"].item() == pytest.approx(truth, rel=0.01)
    typical = model.predict_typical()
    assert typical["step"] == pytest.approx(sum(v for k, v in typical.items() if k != "step"))


@pytest.mark.parametrize("balanced", [False, True])
def test_training_stages_follow_the_busiest_rank_that_sets_their_time(store, tmp_path, balanced):
    log = write_known_log(tmp_path / "train.log", steps=80, seed=21, spread=0.5, balanced=balanced)
    frame = read_workload(store, ingest_known(store, log))
    model = fit_model(frame, training_mask(frame))
    # The run's semantics record names the busiest rank that sets the time: the frame carries it
    # as busiest_rank_tokens, after verl's balancing when the run balances its batch.
    timed = "balanced_busiest_tokens" if balanced else "busiest_rank_tokens"
    step = frame.filter(pl.col("step") == 10).row(0, named=True)
    assert step["busiest_rank_tokens"] == pytest.approx(log.workload[10][timed], rel=1e-4)
    assert step["busiest_after_balancing"] is balanced
    assert model.stages["update_actor"].coefficients[model.busiest_feature] == pytest.approx(8e-5, rel=0.05)


def test_validation_before_training_does_not_hide_the_first_step(store, tmp_path):
    log = write_known_log(tmp_path / "train.log", steps=12)
    text = "step:0 - val-core/math/reward/mean@1:0.2\n" + log.path.read_text()
    log.path.write_text(text)
    frame = read_workload(store, ingest_known(store, log))
    starts = frame.filter(pl.col("segment_start"))["step"].to_list()
    assert starts == [1]
    assert frame.filter(~training_mask(frame))["step"].to_list() == [0, 1]
