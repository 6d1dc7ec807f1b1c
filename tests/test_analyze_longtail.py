"""longtail: slot idle and straggler share by hand, still-decoding curve, real traces against numpy."""

from __future__ import annotations

import json

import numpy as np
import pytest

from polytrace_cli.analyze import longtail
from polytrace_cli.analyze.common import StepRange
from polytrace_cli.ingest.driver import ingest_paths
from tests.conftest import need_real_data
from tests.test_analyze_lengths import add_run, add_samples, add_step_metrics, ids_of


def test_slot_idle_and_straggler_share_by_hand(store):
    run = add_run(store, "r")
    add_samples(store, run, step=0, prompts=[1] * 4, responses=[1, 2, 3, 10], dp_rank=0)
    add_samples(store, run, step=0, prompts=[1] * 2, responses=[5, 5], dp_rank=1)
    ranks = longtail.per_rank(store, [run])
    r0 = ranks.filter(dp_rank=0).row(0, named=True)
    assert r0["slot_idle"] == pytest.approx(1 - 16 / (4 * 10))
    assert r0["straggler_share"] == pytest.approx((10 - 7.9) / 10)  # p90 at position 2.7: 3 + 0.7·7
    r1 = ranks.filter(dp_rank=1).row(0, named=True)
    assert r1["slot_idle"] == pytest.approx(0.0) and r1["straggler_share"] == pytest.approx(0.0)
    step = longtail.per_step(store, [run]).row(0, named=True)
    assert step["slot_idle"] == pytest.approx(0.3) and step["max_slot_idle"] == pytest.approx(0.6)
    s = longtail.summary(store, [run], StepRange()).row(0, named=True)
    assert (s["batches"], s["steps"], s["basis"], s["estimate"]) == (2, 1, "samples", False)
    assert s["mean_slot_idle"] == pytest.approx(0.3) and s["mean_straggler_share"] == pytest.approx(0.105)


def test_still_decoding_share(store):
    run = add_run(store, "r")
    add_samples(store, run, step=0, prompts=[1] * 4, responses=[1, 2, 3, 10])
    add_samples(store, run, step=1, prompts=[1] * 2, responses=[4, 6])
    curve = longtail.still_decoding(store, [run], points=3)
    s0 = curve.filter(step=0)
    assert s0["position_tokens"].to_list() == pytest.approx([0.0, 5.0, 10.0])
    assert s0["still_decoding_share"].to_list() == pytest.approx([1.0, 0.25, 0.0])
    assert curve.filter(step=1)["still_decoding_share"].to_list() == pytest.approx([1.0, 0.5, 0.0])
    assert longtail.still_decoding(store, [run], steps=[1], points=3)["step"].unique().to_list() == [1]


def test_step_aggregate_run_estimates_idle_from_mean_and_max(store):
    run = add_run(store, "console")
    add_step_metrics(store, run, 1, {"response_length/mean": 250, "response_length/max": 1000})
    s = longtail.summary(store, [run], StepRange()).row(0, named=True)
    assert s["basis"] == "step_aggregates" and s["mean_slot_idle"] == pytest.approx(0.75)
    assert s["estimate"] is True and longtail.per_rank(store, [run])["estimate"].to_list() == [True]
    assert s["mean_straggler_share"] is None


def test_no_samples_no_rows(store):
    run = add_run(store, "empty")
    assert longtail.summary(store, [run], StepRange()).height == 0
    assert longtail.still_decoding(store, [run]).height == 0


def test_real_rllm_per_rank_against_numpy(store):
    folder = need_real_data("polytrace", "rllm")
    ingest_paths(store, [folder])
    batches: dict[tuple[int, int], list[int]] = {}
    for path in folder.rglob("packed_lengths_step_*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if not record.get("validate"):
                batches.setdefault((record["step"], record["dp_rank"]), []).extend(record["output"])
    ranks = longtail.per_rank(store, [ids_of(store, "rllm")])
    assert ranks.height == len(batches)
    for row in ranks.iter_rows(named=True):
        values = np.array(batches[(row["step"], row["dp_rank"])], float)
        assert row["slot_idle"] == pytest.approx(1 - values.sum() / (len(values) * values.max()))
        assert row["straggler_share"] == pytest.approx((values.max() - np.percentile(values, 90)) / values.max())
