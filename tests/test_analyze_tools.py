"""Tool-calling analysis: hand-built trajectories and the real search_r1 trace."""

from __future__ import annotations

import json
import statistics

import numpy as np
import pytest

from polytrace_cli.analyze import tools
from polytrace_cli.analyze.common import StepRange
from polytrace_cli.analyze.registry import all_analyses
from polytrace_cli.ingest.driver import ingest_paths
from tests.conftest import need_real_data

# (sample_idx, finish_reason, turns [(prompt_tokens, cached_tokens, engine_latency_s)], calls [(turn, tool, s, status)])
TRAJECTORIES = [
    (0, "stop", [(100, 0, 2.0), (200, 150, 3.0)], [(0, "search", 1.0, "success")]),
    (1, "length", [(100, 100, 1.0), (300, 50, 2.0), (400, 300, 1.0)],
     [(0, "search", 3.0, "success"), (1, "python", 0.5, "error")]),
]


@pytest.fixture
def loaded(store):
    store.execute("INSERT INTO runs (run_id, name) VALUES (1, 'm'), (2, 'single')")
    for sample_idx, finish, turns, calls in TRAJECTORIES:
        store.execute("INSERT INTO sample_rows (run_id, file_id, step, prompt_idx, sample_idx, prompt_len, response_len,"
                      " turns, tool_calls, finish_reason) VALUES (1, 1, 0, 0, ?, 100, 50, ?, ?, ?)",
                      [sample_idx, len(turns), len(calls), finish])
        for turn, (prompt, cached, seconds) in enumerate(turns):
            store.execute("INSERT INTO turns (run_id, file_id, step, prompt_idx, sample_idx, turn, prompt_tokens,"
                          " cached_tokens, engine_latency_s) VALUES (1, 1, 0, 0, ?, ?, ?, ?, ?)",
                          [sample_idx, turn, prompt, cached, seconds])
        for turn, tool, seconds, status in calls:
            store.execute("INSERT INTO tool_calls (run_id, file_id, step, prompt_idx, sample_idx, turn, tool_name,"
                          " latency_s, status) VALUES (1, 1, 0, 0, ?, ?, ?, ?, ?)",
                          [sample_idx, turn, tool, seconds, status])
    store.execute("INSERT INTO sample_rows (run_id, file_id, step, prompt_len, response_len) VALUES (2, 1, 0, 10, 20)")
    return store


def test_latency_per_tool(loaded):
    rows = {row["tool"]: row for row in tools.latency(loaded, [1]).to_dicts()}
    assert list(rows) == ["python", "search", "all"]
    search = rows["search"]
    assert (search["calls"], search["mean_s"], search["p50_s"], search["max_s"]) == (2, 2.0, 2.0, 3.0)
    assert search["p90_s"] == pytest.approx(2.8)  # 1 + 0.9 · (3 − 1)
    assert search["p99_s"] == pytest.approx(2.98)
    assert search["cv"] == pytest.approx(statistics.stdev([1.0, 3.0]) / 2.0)
    assert rows["python"]["cv"] is None and rows["python"]["error_share"] == 1.0
    every = rows["all"]
    assert (every["calls"], every["mean_s"], every["p50_s"]) == (3, 1.5, 1.0)
    assert every["error_share"] == pytest.approx(1 / 3)


def test_cache_hit_by_turn(loaded):
    cache = tools.cache_by_turn(loaded, [1])
    assert cache["turn"].to_list() == [0, 1, 2]
    assert cache["hit_ratio"].to_list() == pytest.approx([100 / 200, 200 / 500, 300 / 400])


def test_trajectories_time_split_and_finish(loaded):
    split = tools.time_split(loaded, [1]).row(0, named=True)
    assert (split["tool_s"], split["generation_s"]) == (4.5, 9.0)
    assert split["tool_share"] == pytest.approx(1 / 3)
    assert (split["trajectories"], split["mean_turns"], split["mean_tool_calls"]) == (2, 2.5, 1.5)
    dist = tools.per_trajectory(loaded, [1])
    turns = dist.filter(dist["measure"] == "turns")
    assert list(zip(turns["value"], turns["share"])) == [(2, 0.5), (3, 0.5)]
    finish = dict(tools.finish_reasons(loaded, [1]).select("finish_reason", "share").rows())
    assert finish == {"stop": 0.5, "length": 0.5}


def test_cdf_points(loaded):
    cdf = tools.latency_cdf(loaded, [1])
    cdf = cdf.filter(cdf["tool"] == "search")
    assert cdf.height == 101
    assert cdf["latency_s"][0] == 1.0 and cdf["latency_s"][-1] == 3.0 and cdf["latency_s"][50] == pytest.approx(2.0)


def test_summary(loaded):
    summary = all_analyses()["tools"].summary(loaded, [1, 2], StepRange())
    assert set(summary["run"]) == {"m"}  # 'single' has no multi-turn trajectories
    every = summary.filter(summary["tool"] == "all").row(0, named=True)
    assert every["cache_hit_ratio"] == pytest.approx(600 / 1100)
    assert every["length_finish_share"] == 0.5 and every["basis"] == "turns"
    assert tools.summary(loaded, [2], StepRange()).height == 0


@pytest.mark.realdata
def test_real_search_r1(store):
    root = need_real_data("polytrace", "search_r1")
    ingest_paths(store, [root])
    latencies, prompt, cached = [], 0, 0
    for path in root.rglob("multiturn_workload_step_*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            latencies += [call["latency_s"] for call in record["tool_calls"] if call.get("latency_s") is not None]
            for turn in record["turns"]:
                if turn.get("prompt_tokens") is not None and turn.get("cached_tokens") is not None:
                    prompt += turn["prompt_tokens"]
                    cached += turn["cached_tokens"]
    run_id = store.execute("SELECT run_id FROM runs WHERE name = 'search_r1'").fetchall()[0][0]
    summary = tools.summary(store, [run_id])
    row = summary.filter(summary["tool"] == "all").row(0, named=True)
    assert row["calls"] == len(latencies)
    assert row["p99_s"] == pytest.approx(float(np.percentile(latencies, 99)))
    assert row["cache_hit_ratio"] == pytest.approx(cached / prompt)
