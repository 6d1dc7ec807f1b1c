"""`polytrace whatif --policy`: each policy on logs written from a known model (test_model's
generator), savings against the truth the generator knows, and pipelines computed by hand."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from polytrace_cli.cli import app
from polytrace_cli.errors import PolytraceError
from polytrace_cli.ingest.driver import ingest_paths
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


def _pipeline_log(path: Path) -> Path:
    """Eight noise-free steps: 100 responses of mean length m = 500, 600, ..., 1200 and 100-token
    prompts; gen = 10 + 1e-4 · response_tokens, update_actor = 6, rest 0.5."""
    lines = ["(TaskRunner pid=1) Training from scratch"]
    for step, mean in enumerate(range(500, 1300, 100), start=1):
        gen = 10 + 1e-4 * 100 * mean
        lines.append(f"step:{step} - timing_s/gen:{gen} - timing_s/update_actor:6.0 - timing_s/step:{gen + 6.5} - "
                     f"response_length/mean:{mean} - prompt_length/mean:100 - "
                     f"perf/total_num_tokens:{100 * (mean + 100)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_one_step_off_pipeline_by_hand(store, tmp_path):
    ingest_paths(store, [_pipeline_log(tmp_path / "train.log")], run_name="pipe")
    result = whatif_run(store, "pipe", ["one-step-off", "one-step-off=0.8", "balance"])
    # replay: Σ gen = 8 · 10 + 0.01 · Σ m (= 6800) = 148, plus 8 · 6.5 = 200
    assert result.baseline_s == pytest.approx(200.0, rel=1e-6)
    # half the GPUs generate: gen = 10 + 0.02 · m (20 .. 34) always exceeds training (6), so
    # wall = Σ gen + the last training step + 8 · 0.5 = 80 + 136 + 6 + 4 = 226: slower by 26 s
    half = _scenario(result, "one-step-off")
    assert half.predicted_s == pytest.approx(226.0, rel=1e-4) and half.saving_s == pytest.approx(-26.0, rel=1e-3)
    # 0.8 generate: gen = 10 + 0.0125 · m, Σ = 165; wall = 165 + 6 + 4 = 175
    most = _scenario(result, "one-step-off=0.8")
    assert most.predicted_s == pytest.approx(175.0, rel=1e-4)
    assert most.stages["overlap"] == pytest.approx(175.0 - sum(v for k, v in most.stages.items() if k != "overlap"))
    # no per-rank token sums are logged: balance says so instead of printing a number
    balance = _scenario(result, "balance")
    assert balance.predicted_s is None and balance.saving_s is None and "imbalance is unknown" in balance.note


def test_a_term_the_fit_could_not_see_gives_no_number(store, tmp_path):
    # every step has one response at the cap: r_max never varies, so gen has no b_tail
    write_length_log(tmp_path / "train.log", steps=40, seed=8, always_capped=True)
    ingest_paths(store, [tmp_path / "train.log"], run_name="capped")
    result = whatif_run(store, "capped", ["max-response-len=4096", "partial-rollout=0.9", "balance"])
    for policy in ("max-response-len=4096", "partial-rollout=0.9"):
        scenario = _scenario(result, policy)
        assert scenario.predicted_s is None and scenario.saving_s is None, policy
        assert "r_max did not vary" in scenario.note and "the saving lies between" in scenario.note
    # the range: the model's terms alone, up to all of gen's constant bound to r_max (b_tail ≤ a/8192)
    cut = _scenario(result, "max-response-len=4096").note
    low, high = (float(x.replace(",", "")) for x in re.findall(r"between ([\d,.]+) s and ([\d,.]+) s", cut)[0])
    true_tail = TRUE["gen"]["r_max"] * (8192 - 4096) * 40
    assert low < high and low > 0
    assert _scenario(result, "balance").saving_s > 0 and true_tail < high - low


def test_a_negligible_unseen_term_leaves_the_number_with_its_range(store, tmp_path):
    # a fixed batch of 256: n_responses never varies, but partial rollout changes its total over the
    # run only by the responses left unfinished, so reward's unknown slope cannot move the saving much
    write_length_log(tmp_path / "train.log", steps=40, seed=9)
    ingest_paths(store, [tmp_path / "train.log"], run_name="fixed")
    scenario = _scenario(whatif_run(store, "fixed", ["partial-rollout=0.9"]), "partial-rollout=0.9")
    assert scenario.saving_s > 0
    assert "n_responses did not vary" in scenario.note and "the saving lies between" in scenario.note
    low, high = (float(x.replace(",", "")) for x in re.findall(r"between ([\d,.]+) s and ([\d,.]+) s",
                                                              scenario.note)[0])
    assert low - 0.05 <= scenario.saving_s <= high + 0.05 and high - low <= 0.05 * scenario.saving_s



def test_one_step_off_needs_a_volume_term(store, tmp_path):
    path = tmp_path / "train.log"
    path.write_text("\n".join(f"step:{s} - timing_s/gen:10.0 - timing_s/update_actor:6.0 - timing_s/step:16.5"
                              for s in range(1, 7)) + "\n")
    ingest_paths(store, [path], run_name="flat")
    scenario = _scenario(whatif_run(store, "flat", ["one-step-off"]), "one-step-off")
    assert scenario.predicted_s is None and "no response_tokens term" in scenario.note


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
    # Printed for people: whole seconds from 100 s on, the share as a percentage with one decimal.
    [balance] = [s for s in document["scenarios"] if s["policy"] == "balance"]
    row = next(line for line in table.stdout.splitlines() if "balance" in line)
    cells = [cell.strip() for cell in row.split("│")[1:-1]]
    predicted = round(balance["predicted_s"]) if abs(balance["predicted_s"]) >= 100 else round(balance["predicted_s"], 1)
    assert cells[1] == f"{predicted:,}".removesuffix(".0")
    assert cells[-1] == f"{balance['saving_share'] * 100:.1f}".removesuffix(".0")
    # For scripts, CSV: the table's rows with every digit.
    as_csv = runner.invoke(app, ["whatif", "known", "--policy", "balance", "--csv", "--db", str(db_path)])
    assert as_csv.exit_code == 0, as_csv.output
    rows = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert [r["policy"] for r in rows] == ["as logged (replay)", "balance"]
    assert float(rows[1]["predicted_s"]) == pytest.approx(balance["predicted_s"])


def test_partial_rollout_by_hand():
    import polars as pl

    from polytrace_cli.simulate.policies import partial_rollout_workload

    # two steps of four responses, prompts of 10 tokens, busiest rank twice the mean
    frame = pl.DataFrame({"r_max": [8.0, 7.0], "response_tokens": [20.0, 16.0], "n_responses": [4.0, 4.0],
                          "total_tokens": [60.0, 56.0], "mean_rank_tokens": [30.0, 28.0],
                          "busiest_rank_tokens": [60.0, 56.0]})
    lengths = [np.array([2.0, 4.0, 6.0, 8.0]), np.array([1.0, 3.0, 5.0, 7.0])]
    changed, unfinished = partial_rollout_workload(frame, lengths, 0.5)
    # step 1: h = median(2, 4, 6, 8) = 5; decodes 2 + 4 + 5 + 5 = 16, finishes 2 and 4 (6 + 2 prompts),
    # carries 6 and 8 with 1 and 3 tokens left.
    # step 2: h = 4; decodes 1 + 3 (carried) + 1 + 3 + 4 + 4 = 16, finishes four (6 + 8 + 1 + 3 = 18 tokens
    # + 4 prompts), carries 5 and 7 with 1 and 3 left.
    assert changed["r_max"].to_list() == [5.0, 4.0]
    assert changed["response_tokens"].to_list() == [16.0, 16.0]
    assert changed["n_responses"].to_list() == [2.0, 4.0]
    assert changed["total_tokens"].to_list() == [26.0, 58.0]
    assert changed["mean_rank_tokens"].to_list() == pytest.approx([13.0, 29.0])
    assert changed["busiest_rank_tokens"].to_list() == pytest.approx([26.0, 58.0])
    assert unfinished == 2


def test_response_cap_on_per_sample_traces(store, tmp_path):
    from polytrace_cli.model import read_workload
    from polytrace_cli.simulate.policies import capped_workload

    folder = tmp_path / "mixed"
    folder.mkdir()
    timings = []
    for step in range(1, 7):
        sample = {"step": step, "rank": 0, "dp_rank": 0, "tp_rank": 0, "local_index": 0, "input": 10,
                  "output": [2 * step, 4, 6, 8], "n_sampling": 4, "validate": False}
        (folder / f"packed_lengths_step_{step}.jsonl").write_text(json.dumps(sample) + "\n")
        timings.append(f"step:{step} - timing_s/gen:{10 + step} - timing_s/step:{20 + step}")
    (folder / "train.log").write_text("\n".join(timings) + "\n")
    ingest_paths(store, [folder], run_name="mixed")
    result = whatif_run(store, "mixed", ["max-response-len=5"])
    assert "per-sample traces" in _scenario(result, "max-response-len=5").note
    frame = read_workload(store, "mixed")
    capped = capped_workload(frame, [np.array([2.0 * s, 4, 6, 8]) for s in range(1, 7)], 5.0)
    # step 1: lengths 2, 4, 6, 8 cut at 5 lose 1 + 3 tokens
    row = capped.row(0, named=True)
    assert (row["r_max"], row["response_tokens"], row["total_tokens"]) == (5.0, 16.0, 56.0)


def write_length_log(path: Path, steps: int, seed: int, cap: int = 8192, per_step: int = 256,
                     always_capped: bool = False) -> dict:
    """A verl console log whose every response length is drawn (lognormal, clipped at `cap`), with
    stage seconds from TRUE; returns the lengths and rank sums per step."""
    rng = np.random.default_rng(seed)
    truth = {"lengths": {}, "busiest": {}, "total": {}}
    lines = ["(TaskRunner pid=1) Training from scratch", f"data.max_response_length={cap}"]
    for step in range(1, steps + 1):
        lengths = np.minimum(np.rint(rng.lognormal(np.log(rng.uniform(500, 1400)), 0.8, per_step)), cap)
        if always_capped:
            lengths[0] = cap
        prompt = 300.0
        total = float(lengths.sum() + prompt * per_step)
        mean_rank = total / 8
        busiest = mean_rank * (1 + rng.uniform(0.02, 0.3))
        workload = {"r_max": lengths.max(), "response_tokens": lengths.sum(), "n_responses": per_step,
                    "busiest_rank_tokens": busiest}
        seconds = {stage: terms["intercept"] + sum(b * workload[k] for k, b in terms.items() if k != "intercept")
                   for stage, terms in TRUE.items()}
        seconds = {k: v * float(rng.lognormal(0, 0.01)) for k, v in seconds.items()}
        seconds["step"] = sum(seconds.values()) + 0.4
        truth["lengths"][step], truth["busiest"][step], truth["total"][step] = lengths, busiest, total
        pairs = [f"timing_s/{k}:{v:.6f}" for k, v in seconds.items()]
        pairs += [f"response_length/max:{lengths.max():.1f}", f"response_length/mean:{lengths.mean():.6f}",
                  f"response_length/clip_ratio:{np.mean(lengths >= cap):.6f}", f"prompt_length/mean:{prompt}",
                  f"perf/total_num_tokens:{round(total)}", f"global_seqlen/max:{busiest:.3f}",
                  f"global_seqlen/mean:{mean_rank:.3f}"]
        lines.append(f"step:{step} - " + " - ".join(pairs))
    path.write_text("\n".join(lines) + "\n")
    return truth


@pytest.mark.parametrize("cap", [2048, 4096])
def test_response_cap_saving_from_fitted_lengths_is_near_the_truth(store, tmp_path, cap):
    truth = write_length_log(tmp_path / "train.log", steps=60, seed=5)
    ingest_paths(store, [tmp_path / "train.log"], run_name="lengths")
    result = whatif_run(store, "lengths", [f"max-response-len={cap}"])
    b_rank = sum(terms.get("busiest_rank_tokens", 0.0) for terms in TRUE.values())
    expected = 0.0
    for step, lengths in truth["lengths"].items():
        cut = float(np.maximum(lengths - cap, 0).sum())
        expected += TRUE["gen"]["r_max"] * max(lengths.max() - cap, 0) + TRUE["gen"]["response_tokens"] * cut
        expected += b_rank * truth["busiest"][step] * cut / truth["total"][step]
    scenario = _scenario(result, f"max-response-len={cap}")
    assert "fitted per step" in scenario.note
    assert scenario.saving_s == pytest.approx(expected, rel=0.05)


def test_saving_standard_error_is_a_bootstrap_over_steps(store, known):
    from polytrace_cli.model import fit_model, read_workload, training_mask
    from polytrace_cli.simulate.uncertainty import saving_standard_error

    result = whatif_run(store, "known", ["balance", "no-validation", "validate-every=20"])
    balance = _scenario(result, "balance")
    # One busiest-rank slope per token stage: the formula's SE(b_k) = σ_k / √Σ(x − x̄)² over the fitted
    # steps gives the saving's SE = D · √Σ_k SE(b_k)² (D = Σ busiest − mean); resampling the steps
    # lands near it (the robust fit is a little less efficient than least squares on clean noise)
    frame = read_workload(store, "known")
    model = fit_model(frame, training_mask(frame))
    x = frame.filter(training_mask(frame))["busiest_rank_tokens"].to_numpy()
    spread = np.sqrt(np.sum((x - x.mean()) ** 2))
    shift = float((frame["busiest_rank_tokens"] - frame["mean_rank_tokens"]).sum())
    by_hand = shift * np.sqrt(sum((model.stages[s].scale_s / spread) ** 2
                                  for s in ("old_log_prob", "ref", "update_actor")))
    balanced = frame.with_columns(busiest_rank_tokens=pl.col("mean_rank_tokens"))
    assert saving_standard_error(model, frame, balanced) == pytest.approx(by_hand, rel=0.02)
    assert 0.5 * by_hand <= balance.saving_se_s <= 2.0 * by_hand
    slope = sum(terms.get("busiest_rank_tokens", 0.0) for terms in TRUE.values())
    truth = slope * sum(w["busiest_rank_tokens"] - w["mean_rank_tokens"] for w in known.workload.values())
    assert abs(balance.saving_s - truth) < 3 * balance.saving_se_s
    assert _scenario(result, "no-validation").saving_se_s == 0.0
    # a schedule's saving rests on the median validation seconds, which resampling moves
    assert _scenario(result, "validate-every=20").saving_se_s > 0


@pytest.mark.realdata
def test_real_traces_give_per_sample_lengths(store):
    from conftest import need_real_data

    from polytrace_cli.model import read_workload, run_info
    from polytrace_cli.simulate.lengths import SAMPLES_BASIS, step_lengths

    ingest_paths(store, [need_real_data("polytrace", "verl")], run_name="real")
    frame = read_workload(store, "real")
    info = run_info(store, "real")
    lengths = step_lengths(store, info.run_id, frame, info.meta)
    assert lengths.basis == SAMPLES_BASIS and lengths.known == frame.height > 0
    for row, values in zip(frame.iter_rows(named=True), lengths.lengths):
        assert values.size == row["n_responses"] and values.max() == row["r_max"]
        assert values.sum() == pytest.approx(row["response_tokens"])


def test_balance_follows_the_busiest_rank_after_verls_balancing(store, tmp_path):
    # the training stages' time follows global_seqlen/balanced_max (verl's balance_batch), not /max
    log = write_known_log(tmp_path / "train.log", steps=120, seed=23, spread=0.5, balanced=True)
    ingest_paths(store, [log.path], run_name="balanced")
    result = whatif_run(store, "balanced", ["balance", "one-step-off=0.5"])
    slope = sum(terms.get("busiest_rank_tokens", 0.0) for terms in TRUE.values())
    truth = slope * sum(w["balanced_busiest_tokens"] - w["mean_rank_tokens"] for w in log.workload.values())
    balance = _scenario(result, "balance")
    assert "after verl's balancing" in balance.note
    assert abs(balance.saving_s - truth) <= 3 * balance.saving_se_s
    # what the logged /max would claim is many times more: it does not set the stages' time
    unbalanced = slope * sum(w["busiest_rank_tokens"] - w["mean_rank_tokens"] for w in log.workload.values())
    assert balance.saving_s < 0.5 * unbalanced
    assert _scenario(result, "one-step-off=0.5").predicted_s is not None
