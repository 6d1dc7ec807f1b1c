"""DAPO filtering analysis: a hand-built store and the real verl DAPO trace."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from polytrace_cli.analyze import filtering
from polytrace_cli.analyze.common import StepRange
from polytrace_cli.analyze.registry import all_analyses
from polytrace_cli.ingest.driver import ingest_paths
from tests.conftest import need_real_data


def _batch(con, workload_step, trainer_step, gen_batch_index, kept, used, prompt_count=4):
    con.execute(
        "INSERT INTO filter_batches (run_id, file_id, workload_step, trainer_step, gen_batch_index, prompt_count,"
        " kept, used, kept_indices, used_indices) VALUES (1, 1, ?, ?, ?, ?, ?, ?, ?, ?)",
        [workload_step, trainer_step, gen_batch_index, prompt_count, len(kept), len(used), kept, used],
    )


def _responses(con, step, dp_rank, prompt_idx, lengths, validate=False):
    for sample_idx, length in enumerate(lengths):
        con.execute(
            "INSERT INTO sample_rows (run_id, file_id, step, dp_rank, prompt_idx, sample_idx, prompt_len, response_len,"
            " validate) VALUES (1, 1, ?, ?, ?, ?, 5, ?, ?)",
            [step, dp_rank, prompt_idx, sample_idx, length, validate],
        )


@pytest.fixture
def loaded(store):
    store.execute("INSERT INTO runs (run_id, name) VALUES (1, 'd'), (2, 'plain')")
    _batch(store, 0, 1, 1, kept=[0, 2], used=[0, 2])
    _batch(store, 1, 1, 2, kept=[1, 2, 3], used=[1])
    _batch(store, 2, 2, 1, kept=[0, 1], used=[0, 1])
    # Workload step 0, positions in (dp_rank, prompt_idx) order: 0 -> 20 tokens, 1 -> 30, 2 -> 20, 3 -> 40.
    _responses(store, 0, 0, 0, [10, 10])
    _responses(store, 0, 0, 1, [30])
    _responses(store, 0, 1, 0, [20])
    _responses(store, 0, 1, 1, [40])
    _responses(store, 0, 1, 9, [999], validate=True)  # validation: not part of the batch
    # Workload step 1: positions 0..3 carry 10, 20, 30, 40 tokens.
    for position, length in enumerate([10, 20, 30, 40]):
        _responses(store, 1, position // 2, position % 2, [length])
    # Workload step 2: only 3 of its 4 prompts were logged, so the join is not trusted.
    for prompt in range(3):
        _responses(store, 2, 0, prompt, [50])
    return store


def test_per_batch_shares(loaded):
    rows = filtering.per_batch(loaded, [1]).to_dicts()
    first, second, third = rows
    assert first["kept_share"] == 0.5 and first["basis"] == "samples" and first["response_tokens"] == 110
    assert first["discarded_token_share"] == pytest.approx(70 / 110)  # positions 1 and 3: 30 + 40
    assert second["discarded_token_share"] == pytest.approx(10 / 100)
    assert second["unused_token_share"] == pytest.approx(80 / 100)
    assert second["kept_share"] == 0.75 and second["used_share"] == 0.25
    assert third["basis"] == "prompts" and third["discarded_token_share"] == 0.5


def test_per_trainer_step(loaded):
    steps = filtering.per_trainer_step(loaded, [1])
    assert steps.select("trainer_step", "batches", "prompts", "kept").rows() == [(1, 2, 8, 5), (2, 1, 4, 2)]
    assert steps["kept_share"].to_list() == pytest.approx([5 / 8, 2 / 4])


def test_summary_bases(loaded):
    summary = all_analyses()["filtering"].summary(loaded, [1, 2], StepRange())
    assert summary["run"].to_list() == ["d"]
    row = summary.row(0, named=True)
    assert row["basis"] == "prompts"  # one batch could not be joined: prompt shares for the run
    assert row["discarded_token_share"] == pytest.approx(1 - 7 / 12)
    assert row["kept_share"] == pytest.approx(7 / 12)
    assert (row["batches"], row["trainer_steps"], row["mean_batches_per_trainer_step"],
            row["max_batches_per_trainer_step"]) == (3, 2, 1.5, 2)
    joined = filtering.summary(loaded, [1], StepRange(0, 1)).row(0, named=True)
    assert joined["basis"] == "samples"
    assert joined["discarded_token_share"] == pytest.approx((70 + 10) / 210)
    assert joined["unused_token_share"] == pytest.approx((70 + 80) / 210)
    assert filtering.summary(loaded, [2]).height == 0


@pytest.mark.realdata
def test_real_verl_dapo(store):
    root = need_real_data("polytrace", "verl")
    ingest_paths(store, [root])
    batches = [json.loads(line) for path in root.rglob("dapo_filter_indices.jsonl")
               for line in path.read_text().splitlines()]
    run_id = store.execute("SELECT run_id FROM runs WHERE name = 'verl'").fetchall()[0][0]
    frame = filtering.per_batch(store, [run_id])
    assert frame.height == len(batches) == 6  # one row per generation batch
    assert dict(zip(frame["workload_step"], frame["kept_share"])) == pytest.approx(
        {b["workload_step"]: b["kept_prompt_count"] / b["prompt_count"] for b in batches})
    assert dict(zip(frame["workload_step"], zip(frame["trainer_step"], frame["gen_batch_index"]))) == {
        b["workload_step"]: (b["trainer_step"], b["gen_batch_index"]) for b in batches}
    per_trainer = defaultdict(list)
    for b in batches:
        per_trainer[b["trainer_step"]].append(b)
    trainer = filtering.per_trainer_step(store, [run_id])
    assert dict(zip(trainer["trainer_step"], trainer["batches"])) == {t: len(bs) for t, bs in per_trainer.items()}
    assert dict(zip(trainer["trainer_step"], trainer["kept_share"])) == pytest.approx(
        {t: sum(b["kept_prompt_count"] for b in bs) / sum(b["prompt_count"] for b in bs) for t, bs in per_trainer.items()})
    discarded, total = 0, 0
    for batch in batches:
        path = next(root.rglob(f"packed_lengths_step_{batch['workload_step']}.jsonl"))
        prompts = sorted((r["dp_rank"], r["local_index"], sum(r["output"]))
                         for r in map(json.loads, path.read_text().splitlines()) if not r["validate"])
        tokens = defaultdict(int, {position: p[2] for position, p in enumerate(prompts)})
        kept = set(batch["kept_prompt_indices"])
        discarded += sum(t for position, t in tokens.items() if position not in kept)
        total += sum(tokens.values())
    row = filtering.summary(store, [run_id]).row(0, named=True)
    assert row["basis"] == "samples"
    assert row["discarded_token_share"] == pytest.approx(discarded / total)
    assert row["kept_share"] == pytest.approx(sum(b["kept_prompt_count"] for b in batches)
                                              / sum(b["prompt_count"] for b in batches))
