"""The per-step frame against numbers computed by hand on a tiny packed trace and a tiny verl console log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polytrace_cli.analyze.common import StepRange
from polytrace_cli.analyze.per_step import COLUMNS, per_step
from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.store.queries import run_ids
from tests.conftest import need_real_data


def _group(step, rank, index, prompt, outputs, validate=False):
    return json.dumps({"step": step, "rank": rank, "dp_rank": rank, "tp_rank": 0, "local_index": index,
                       "input": prompt, "output": outputs, "n_sampling": len(outputs), "validate": validate})


@pytest.fixture
def packed_run(store, tmp_path: Path):
    folder = tmp_path / "packed"
    folder.mkdir()
    (folder / "packed_lengths_step_0.jsonl").write_text("\n".join([
        _group(0, 0, 0, 10, [5, 6, 7]), _group(0, 0, 1, 20, [2, 2, 2]), _group(0, 1, 0, 10, [10, 1, 1]),
    ]) + "\n")
    (folder / "packed_lengths_step_1.jsonl").write_text("\n".join([
        _group(1, 0, 0, 4, [3, 3, 3]), _group(1, 1, 0, 4, [1, 2, 3]), _group(1, 0, 1, 50, [100, 100, 100], validate=True),
    ]) + "\n")
    (folder / "reward_timings_step_0.jsonl").write_text(
        '{"step": 0, "rank": 0, "dp_rank": 0, "tp_rank": 0, "reward_time_s": 2.5, "validate": false}\n'
        '{"step": 0, "rank": 1, "dp_rank": 1, "tp_rank": 0, "reward_time_s": 4.0, "validate": false}\n')
    ingest_paths(store, [folder], run_name="packed")
    return store


def test_packed_trace_steps_match_hand_computed_numbers(packed_run):
    frame = per_step(packed_run, run_ids(packed_run, ["packed"]))
    assert frame.columns == list(COLUMNS)
    zero, one = frame.to_dicts()
    # Step 0. Rank 0: responses 5,6,7,2,2,2 with prompts 10,10,10,20,20,20 -> T0 = 90 + 24 = 114,
    # longest 7, idle 1 - 24/(6*7). Rank 1: responses 10,1,1 with prompts 10 -> T1 = 30 + 12 = 42,
    # longest 10, idle 1 - 12/(3*10).
    assert zero["basis"] == "samples" and zero["dp_ranks"] == 2
    assert zero["tokens"] == 156
    assert zero["lambda_tokens"] == pytest.approx(114 / 78)
    assert zero["lambda_makespan"] == pytest.approx(10 / 8.5)
    assert zero["slot_idle"] == pytest.approx(((1 - 24 / 42) + (1 - 12 / 30)) / 2)
    assert (zero["response_mean"], zero["response_max"]) == (pytest.approx(36 / 9), 10)
    assert (zero["prompt_mean"], zero["prompt_max"]) == (pytest.approx(120 / 9), 20)
    assert zero["reward_s"] == 4.0  # the slowest rank
    assert zero["validation"] is False
    # No cap recorded and the longest response (10) is unique: no cap, so no clip ratio.
    assert zero["clip_ratio"] is None
    # Step 1: the validation group is left out of every number but marks the step.
    assert one["validation"] is True
    assert one["tokens"] == 12 + 9 + 6 + 12
    assert one["lambda_tokens"] == pytest.approx(21 / 19.5)
    assert one["lambda_makespan"] == pytest.approx(1.0)
    assert one["slot_idle"] == pytest.approx((0 + (1 - 6 / 9)) / 2)
    assert one["response_max"] == 3 and one["reward_s"] is None
    # Stages a trace does not log, checkpoints and the explanation's columns stay empty.
    assert one["step_s"] is None and one["gen_s"] is None and one["checkpoint"] is None
    assert one["expected_step_s"] is None and one["top_cause"] is None


def test_step_range_and_single_rank_steps(packed_run):
    [row] = per_step(packed_run, run_ids(packed_run, ["packed"]), StepRange.parse("1")).to_dicts()
    assert row["step"] == 1
    packed_run.execute("DELETE FROM sample_groups WHERE dp_rank = 1")
    [row] = per_step(packed_run, run_ids(packed_run, ["packed"]), StepRange.parse("0")).to_dicts()
    # One rank: no balance to speak of, but the slot idle of that rank still holds.
    assert row["dp_ranks"] == 1 and row["lambda_tokens"] is None and row["lambda_makespan"] is None
    assert row["slot_idle"] == pytest.approx(1 - 24 / 42)
    # Samples that name no rank (multi-turn trajectories): the rank count is unknown, not 0.
    packed_run.execute("UPDATE sample_groups SET dp_rank = NULL, rank = NULL")
    [row] = per_step(packed_run, run_ids(packed_run, ["packed"]), StepRange.parse("0")).to_dicts()
    assert row["dp_ranks"] is None and row["lambda_tokens"] is None and row["response_max"] == 7


CONSOLE_LOG = """\
step:1 - timing_s/gen:6.000 - timing_s/reward:1.000 - timing_s/update_actor:2.000 - timing_s/step:10.000 - response_length/mean:300.000 - response_length/max:1200.000 - prompt_length/mean:100.000 - prompt_length/max:150.000 - response_length/clip_ratio:0.250 - perf/total_num_tokens:64000.000 - global_seqlen/max:9000.000 - global_seqlen/mean:8000.000
step:2 - timing_s/gen:5.000 - timing_s/testing:3.000 - timing_s/save_checkpoint:4.000 - timing_s/step:20.000 - response_length/mean:400.000 - response_length/max:800.000
step:2 - timing_s/gen:7.000 - timing_s/step:9.000 - response_length/mean:0.000 - response_length/max:0.000
"""


def test_console_steps_match_logged_numbers(store, tmp_path):
    folder = tmp_path / "console"
    folder.mkdir()
    (folder / "train.log").write_text(CONSOLE_LOG)
    ingest_paths(store, [folder], run_name="console")
    rows = per_step(store, run_ids(store, ["console"])).to_dicts()
    assert [(r["segment"], r["step"]) for r in rows] == [(0, 1), (0, 2), (1, 2)]
    first, second, restarted = rows
    assert first["basis"] == "step_aggregates"
    assert (first["gen_s"], first["reward_s"], first["update_actor_s"], first["step_s"]) == (6, 1, 2, 10)
    assert (first["response_mean"], first["response_max"], first["prompt_mean"], first["prompt_max"]) == (300, 1200, 100, 150)
    assert first["clip_ratio"] == 0.25 and first["tokens"] == 64000
    assert first["lambda_tokens"] == pytest.approx(9000 / 8000)
    assert first["slot_idle"] == pytest.approx(1 - 300 / 1200)
    assert first["lambda_makespan"] is None and first["dp_ranks"] is None  # per-rank maxima are not logged
    assert (first["validation"], first["checkpoint"], first["restart"], first["truncated"]) == (False, False, False, False)
    assert (second["testing_s"], second["save_checkpoint_s"]) == (3, 4)
    assert (second["validation"], second["checkpoint"]) == (True, True)
    assert second["lambda_tokens"] is None  # no global_seqlen keys at this step
    assert restarted["restart"] is True
    assert restarted["slot_idle"] is None  # a longest response of 0 gives no slot idle, not a division by zero


def test_real_packed_trace_has_one_row_per_step(store):
    folder = need_real_data("polytrace", "verl")
    ingest_paths(store, [folder], run_name="verl")
    frame = per_step(store, run_ids(store, ["verl"]))
    expected = store.execute("SELECT count(DISTINCT step) FROM samples").fetchone()[0]
    assert frame.height == expected
    training = frame.filter(frame["response_max"].is_not_null())
    assert training.height > 0
    assert (training["lambda_tokens"].drop_nulls() >= 1).all()
    assert ((training["slot_idle"].drop_nulls() >= 0) & (training["slot_idle"].drop_nulls() < 1)).all()
