"""Imbalance analysis: golden numbers on hand-built stores and checks against the real traces."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from polytrace_cli.analyze import imbalance
from polytrace_cli.analyze.common import StepRange
from polytrace_cli.analyze.registry import all_analyses
from polytrace_cli.ingest.driver import ingest_paths
from tests.conftest import need_real_data


def _sample(con, run_id, step, dp_rank, prompt_idx, prompt_len, response_len, validate=False, tp_rank=0):
    con.execute(
        "INSERT INTO sample_rows (run_id, file_id, step, rank, dp_rank, tp_rank, prompt_idx, sample_idx, prompt_len,"
        " response_len, validate) VALUES (?, 1, ?, ?, ?, ?, ?, 0, ?, ?, ?)",
        [run_id, step, dp_rank, dp_rank, tp_rank, prompt_idx, prompt_len, response_len, validate],
    )


@pytest.fixture
def loaded(store):
    store.execute("INSERT INTO runs (run_id, name) VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    # Run a, step 1: rank 0 holds prompt 0 (10 + 20, 10 + 30 = 70) and prompt 1 (5 + 5 = 10): 80;
    # rank 1 holds 10 + 10 = 20; rank 2 holds 5 + 15 = 20. mean 40, max 80.
    for rank, prompt, p, r in [(0, 0, 10, 20), (0, 0, 10, 30), (0, 1, 5, 5), (1, 0, 10, 10), (2, 0, 5, 15)]:
        _sample(store, 1, 1, rank, prompt, p, r)
    _sample(store, 1, 1, 1, 7, 10, 5000, validate=True)  # validation: left out
    _sample(store, 1, 1, 1, 0, 10, 5000, tp_rank=1)  # a tensor-parallel copy: left out
    # Step 2: 30 and 30 (balanced). Step 3: 20 and 40.
    for step, rank, p, r in [(2, 0, 10, 20), (2, 1, 10, 20), (3, 0, 10, 10), (3, 1, 10, 30)]:
        _sample(store, 1, step, rank, 0, p, r)
    # Run b: rank 1 is the most loaded in all 10 steps.
    for step in range(10):
        _sample(store, 2, step, 0, 0, 10, 10)
        _sample(store, 2, step, 1, 0, 10, 20)
    # Run c: console-only, verl's global_seqlen keys.
    for key, value in [("global_seqlen/max", 120), ("global_seqlen/mean", 100), ("global_seqlen/balanced_max", 105),
                       ("global_seqlen/min", 80)]:
        store.execute("INSERT INTO step_metrics (run_id, segment, step, key, value, file_id) VALUES (3, 0, 1, ?, ?, 1)",
                      [key, value])
    # Reward seconds of run a, step 1: 10 s and 30 s (and a validation call that is left out).
    for rank, seconds, validate in [(0, 10.0, False), (1, 30.0, False), (1, 100.0, True)]:
        store.execute("INSERT INTO rank_timings (run_id, file_id, step, rank, dp_rank, stage, seconds, validate)"
                      " VALUES (1, 1, 1, ?, ?, 'reward', ?, ?)", [rank, rank, seconds, validate])
    return store


def test_per_rank_loads(loaded):
    ranks = imbalance.per_rank(loaded, [1], StepRange(1, 1))
    assert ranks["load_tokens"].to_list() == [80, 20, 20]
    assert ranks["load_over_mean"].to_list() == pytest.approx([2.0, 0.5, 0.5])
    assert ranks["max_response_len"].to_list() == [30, 10, 15]
    assert ranks["is_max"].to_list() == [True, False, False]
    assert set(ranks["run"]) == {"a"}


def test_per_step_lambda_idle_and_balanced(loaded):
    steps = imbalance.per_step(loaded, [1], StepRange()).to_dicts()
    one, two, three = steps
    assert one["lambda"] == pytest.approx(2.0)
    assert one["idle_share"] == pytest.approx(0.5)
    assert one["makespan_lambda"] == pytest.approx(30 / (55 / 3))
    # Groups 70, 10, 20, 20 over 3 ranks: best is {70}, {20, 10}, {20} -> max 70, λ = 70/40.
    assert one["lambda_kk"] == pytest.approx(1.75)
    assert one["lambda_lpt"] == pytest.approx(1.75)
    assert one["saving"] == pytest.approx(1 - 1.75 / 2)
    assert one["basis"] == "samples"
    assert (two["lambda"], two["idle_share"], two["max_rank"]) == (pytest.approx(1.0), pytest.approx(0.0), 0)
    assert three["lambda"] == pytest.approx(40 / 30)
    assert three["max_rank"] == 1
    assert three["lambda_balanced"] == pytest.approx(40 / 30)  # one group per rank: nothing to move


def test_global_seqlen_basis_balancing_on(loaded):
    """balanced_max is logged and no config says otherwise: verl balanced the batch, so the busiest
    rank after balancing sets the time; the λ before balancing is shown beside it."""
    row = imbalance.per_step(loaded, [3]).row(0, named=True)
    assert row["basis"] == "global_seqlen" and row["lambda_basis"] == "rank_tokens_balanced_max"
    assert row["lambda"] == pytest.approx(1.05)
    assert row["lambda_before_balancing"] == pytest.approx(1.2)
    assert row["lambda_balanced"] == pytest.approx(1.05)
    assert row["idle_share"] == pytest.approx(1 - 100 / 105)
    assert row["saving"] == pytest.approx(0.0)
    assert row["lambda_kk"] is None


def test_global_seqlen_basis_balancing_off(loaded):
    loaded.execute("""UPDATE runs SET meta = '{"balance_batch": false}' WHERE run_id = 3""")
    row = imbalance.per_step(loaded, [3]).row(0, named=True)
    assert row["lambda_basis"] == "rank_tokens_max"
    assert row["lambda"] == pytest.approx(1.2) and row["lambda_before_balancing"] == pytest.approx(1.2)
    assert row["lambda_balanced"] == pytest.approx(1.05)
    assert row["idle_share"] == pytest.approx(1 - 100 / 120)
    assert row["saving"] == pytest.approx(1 - 105 / 120)


def test_stragglers_binomial(loaded):
    frame = imbalance.stragglers(loaded, [2])
    rank1 = frame.filter(frame["dp_rank"] == 1).row(0, named=True)
    assert rank1["max_steps"] == 10 and rank1["expected"] == 5
    assert rank1["p_value"] == pytest.approx(0.5**10)
    assert rank1["straggler"]
    assert not frame.filter(frame["dp_rank"] == 0)["straggler"].item()


def test_reward_spread(loaded):
    row = imbalance.reward_per_step(loaded, [1]).row(0, named=True)
    assert (row["ranks"], row["mean_s"], row["max_over_mean"], row["spread_s"]) == (2, 20.0, 1.5, 20.0)
    per_rank = imbalance.reward_per_rank(loaded, [1])
    assert per_rank["seconds_over_mean"].to_list() == pytest.approx([0.5, 1.5])


def test_summary_rows_and_empty_runs(loaded):
    store = loaded
    store.execute("INSERT INTO runs (run_id, name) VALUES (4, 'empty')")
    summary = all_analyses()["imbalance"].summary(store, [1, 2, 3, 4], StepRange())
    rows = {row["run"]: row for row in summary.to_dicts()}
    assert set(rows) == {"a", "b", "c"}
    assert rows["a"]["mean_lambda"] == pytest.approx((2.0 + 1.0 + 40 / 30) / 3)
    assert rows["a"]["mean_reward_spread_s"] == 20.0
    assert rows["b"]["straggler_ranks"] == "1"
    assert rows["c"]["basis"] == "global_seqlen"
    empty = imbalance.summary(store, [4], StepRange())
    assert empty.height == 0 and "mean_lambda" in empty.columns


def _direct_lambdas(folder):
    lambdas = {}
    for path in sorted(folder.glob("packed_lengths_step_*.jsonl")):
        loads = defaultdict(int)
        step = None
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("validate") or record.get("tp_rank", 0) != 0:
                continue
            step = record["step"]
            loads[record["dp_rank"]] += record["input"] * len(record["output"]) + sum(record["output"])
        if len(loads) >= 2:
            lambdas[step] = max(loads.values()) / (sum(loads.values()) / len(loads))
    return lambdas


@pytest.mark.realdata
@pytest.mark.parametrize("name", ["verl", "rllm"])
def test_real_lambda_per_step(store, name):
    root = need_real_data("polytrace", name)
    ingest_paths(store, [root])
    run_id = store.execute("SELECT run_id FROM runs WHERE name = ?", [name]).fetchall()[0][0]
    folder = next(root.rglob("packed_lengths_step_0.jsonl")).parent
    expected = _direct_lambdas(folder)
    steps = imbalance.per_step(store, [run_id])
    assert dict(zip(steps["step"], steps["lambda"])) == pytest.approx(expected)
    assert (steps["lambda_balanced"] <= steps["lambda"] + 1e-12).all()


@pytest.mark.realdata
def test_real_reward_spread_rllm(store):
    root = need_real_data("polytrace", "rllm")
    ingest_paths(store, [root])
    expected = {}
    for path in root.rglob("reward_timings_step_*.jsonl"):
        seconds = [json.loads(line)["reward_time_s"] for line in path.read_text().splitlines()
                   if not json.loads(line).get("validate")]
        step = json.loads(path.read_text().splitlines()[0])["step"]
        expected[step] = max(seconds) - min(seconds)
    run_id = store.execute("SELECT run_id FROM runs WHERE name = 'rllm'").fetchall()[0][0]
    frame = imbalance.reward_per_step(store, [run_id])
    assert dict(zip(frame["step"], frame["spread_s"])) == pytest.approx(expected)


def test_saving_is_computed_on_what_sets_the_step_time(loaded):
    """Sampled runs: the rollout waits for the longest response, so makespan λ sets the time and
    rebalancing prompts saves nothing of it (the token-load saving stays reported beside it);
    global_seqlen runs: token sums set the update stages' time and the saving is the token one."""
    one = imbalance.per_step(loaded, [1], StepRange(1, 1)).row(0, named=True)
    assert one["saving_basis"] == "makespan" and "longest response" in one["saving_basis_reason"]
    assert one["makespan_lambda"] == pytest.approx(30 / (55 / 3)) and one["lambda"] == pytest.approx(2.0)
    assert one["step_saving"] == 0.0 and one["saving"] == pytest.approx(1 - 1.75 / 2)
    console = imbalance.per_step(loaded, [3]).row(0, named=True)
    # verl balanced the batch (balanced_max is logged): nothing is left for balancing to save.
    assert console["saving_basis"] == "tokens" and console["step_saving"] == pytest.approx(0.0)
    loaded.execute("""UPDATE runs SET meta = '{"balance_batch": false}' WHERE run_id = 3""")
    console = imbalance.per_step(loaded, [3]).row(0, named=True)
    assert console["saving_basis"] == "tokens" and console["step_saving"] == pytest.approx(1 - 105 / 120)
    rows = {row["run"]: row for row in imbalance.summary(loaded, [1, 3]).to_dicts()}
    assert (rows["a"]["saving_basis"], rows["a"]["mean_step_saving"]) == ("makespan", 0.0)
    assert rows["a"]["mean_makespan_lambda"] == pytest.approx((30 / (55 / 3) + 1.0 + 30 / 20) / 3)
    assert (rows["c"]["saving_basis"], rows["c"]["mean_step_saving"]) == ("tokens", pytest.approx(1 - 105 / 120))
