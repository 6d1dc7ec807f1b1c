"""lengths: golden numbers on tiny stores, and the real traces against numpy on their JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from polytrace_cli.analyze import lengths
from polytrace_cli.analyze.common import StepRange
from polytrace_cli.ingest.driver import ingest_paths
from tests.conftest import need_real_data


def add_run(con, name: str, meta: dict | None = None, task: str | None = None) -> int:
    """Insert a run and return its id (shared by the analysis tests)."""
    run_id = con.execute("SELECT coalesce(max(run_id), 0) + 1 FROM runs").fetchall()[0][0]
    con.execute("INSERT INTO runs (run_id, name, task, meta) VALUES (?, ?, ?, ?)",
                [run_id, name, task, json.dumps(meta or {})])
    return run_id


def add_samples(con, run_id: int, step: int, prompts: list, responses: list, dp_rank: int | None = 0,
                validate: bool = False) -> None:
    """Insert one sample per (prompt, response) pair at a step and DP rank."""
    con.execute(
        "INSERT INTO sample_rows (run_id, file_id, step, rank, dp_rank, prompt_idx, sample_idx, prompt_len, response_len,"
        " validate) SELECT ?, 1, ?, ?, ?, unnest(range(?)), 0, unnest(?::INTEGER[]), unnest(?::INTEGER[]), ?",
        [run_id, step, dp_rank, dp_rank, len(prompts), [int(p) for p in prompts], [int(r) for r in responses], validate])


def add_step_metrics(con, run_id: int, step: int, values: dict, segment: int = 0) -> None:
    """Insert the logged scalars of one step of a console-log run."""
    con.executemany("INSERT INTO step_metrics (run_id, segment, step, key, value, file_id) VALUES (?, ?, ?, ?, ?, 1)",
                    [(run_id, segment, step, key, value) for key, value in values.items()])


def ids_of(con, name: str) -> int:
    return con.execute("SELECT run_id FROM runs WHERE name = ?", [name]).fetchall()[0][0]


def row(df, **keys):
    for name, value in keys.items():
        df = df.filter(df[name] == value)
    assert df.height == 1, f"expected one row for {keys}, got {df.height}"
    return df.row(0, named=True)


def test_golden_stats_with_known_cap(store):
    run = add_run(store, "a", meta={"max_response_len": 10})
    add_samples(store, run, step=1, prompts=[5, 5, 5, 5, 5], responses=[1, 2, 3, 4, 10])
    add_samples(store, run, step=1, prompts=[9], responses=[1000], validate=True)  # never counted
    r = row(lengths.per_step(store, [run]), kind="response", step=1)
    assert r["count"] == 5
    assert r["mean_tokens"] == pytest.approx(4.0)
    # deviations -3,-2,-1,0,6: squares sum to 50, over n-1 = 4
    assert r["std_tokens"] == pytest.approx((50 / 4) ** 0.5)
    assert r["min_tokens"] == 1 and r["max_tokens"] == 10
    assert r["p50_tokens"] == pytest.approx(3.0)
    assert r["p90_tokens"] == pytest.approx(4 + 0.6 * 6)  # position 3.6 between 4 and 10
    assert r["p99_tokens"] == pytest.approx(4 + 0.96 * 6)
    assert r["cv"] == pytest.approx((50 / 4) ** 0.5 / 4)
    assert r["clip_ratio"] == pytest.approx(1 / 5)
    assert r["p99_p50"] == pytest.approx(9.76 / 3)
    assert r["max_p50"] == pytest.approx(10 / 3)
    values = np.array([1, 2, 3, 4, 10], float)
    assert r["skewness"] == pytest.approx(stats.skew(values, bias=False))
    assert r["kurtosis"] == pytest.approx(stats.kurtosis(values, bias=False))
    total = row(lengths.per_step(store, [run]), kind="total", step=1)
    assert total["mean_tokens"] == pytest.approx(9.0) and total["max_tokens"] == 15
    assert total["clip_ratio"] is None
    prompt = row(lengths.per_step(store, [run]), kind="prompt", step=1)
    assert prompt["std_tokens"] == pytest.approx(0.0) and prompt["cv"] == pytest.approx(0.0)
    s = row(lengths.summary(store, [run], StepRange()), kind="response")
    assert (s["cap_tokens"], s["cap_source"], s["basis"]) == (10, "known", "samples")
    assert row(lengths.summary(store, [run], StepRange()), kind="prompt")["cap_tokens"] is None  # a response cap


def test_evident_cap_needs_three_and_one_percent(store):
    capped = add_run(store, "capped")
    add_samples(store, capped, step=0, prompts=[1, 1, 1, 1], responses=[5, 7, 7, 7])
    uncapped = add_run(store, "uncapped")
    add_samples(store, uncapped, step=0, prompts=[1, 1, 1, 1], responses=[5, 6, 7, 7])
    rare = add_run(store, "rare")  # 3 at the max but only 3 of 400 (< 1%)
    add_samples(store, rare, step=0, prompts=[1] * 400, responses=list(range(1, 398)) + [500, 500, 500])
    caps = {r["run"]: (r["cap_tokens"], r["cap_source"]) for r in lengths.caps(store, [capped, uncapped, rare]).to_dicts()}
    assert caps == {"capped": (7, "evident"), "uncapped": (None, None), "rare": (None, None)}
    summary = lengths.summary(store, [capped, uncapped], StepRange())
    assert row(summary, run="capped", kind="response")["clip_ratio"] == pytest.approx(0.75)
    assert row(summary, run="uncapped", kind="response")["clip_ratio"] is None


def test_correlation_sign_and_spearman_with_ties(store):
    up = add_run(store, "up")
    add_samples(store, up, step=0, prompts=[1, 2, 2, 3, 10], responses=[10, 20, 20, 25, 1000])
    down = add_run(store, "down")
    add_samples(store, down, step=0, prompts=[1, 2, 3, 4], responses=[40, 30, 30, 1])
    corr = lengths.correlation(store, [up, down])
    assert row(corr, run="up")["pearson"] > 0.9 and row(corr, run="up")["spearman"] == pytest.approx(1.0)
    assert row(corr, run="down")["pearson"] < 0
    expected = stats.spearmanr([1, 2, 3, 4], [40, 30, 30, 1]).statistic
    assert row(corr, run="down")["spearman"] == pytest.approx(expected)


def test_step_range_and_cdf(store):
    run = add_run(store, "r")
    add_samples(store, run, step=1, prompts=[1, 1], responses=[10, 20])
    add_samples(store, run, step=2, prompts=[1, 1], responses=[30, 40])
    only2 = row(lengths.summary(store, [run], StepRange(2, 2)), kind="response")
    assert only2["count"] == 2 and only2["mean_tokens"] == pytest.approx(35)
    cdf = lengths.cdf(store, [run], points=3).filter(kind="response")
    assert cdf["quantile"].to_list() == [0.0, 0.5, 1.0]
    assert cdf["length_tokens"].to_list() == pytest.approx([10.0, 25.0, 40.0])


def test_step_aggregate_run(store):
    run = add_run(store, "console")
    add_step_metrics(store, run, 1, {"response_length/mean": 100, "response_length/max": 200,
                                     "response_length/min": 10, "response_length/clip_ratio": 0.1})
    add_step_metrics(store, run, 2, {"response_length/mean": 300, "response_length/max": 400,
                                     "response_length/min": 20, "response_length/clip_ratio": 0.3})
    per_step = lengths.per_step(store, [run])
    assert set(per_step["basis"]) == {"step_aggregates"}
    assert row(per_step, step=2)["max_tokens"] == 400 and row(per_step, step=2)["p99_tokens"] is None
    s = row(lengths.summary(store, [run], StepRange()), kind="response")
    assert s["mean_tokens"] == pytest.approx(200) and s["min_tokens"] == 10 and s["max_tokens"] == 400
    assert s["clip_ratio"] == pytest.approx(0.2) and s["p50_tokens"] is None and s["count"] is None
    assert s["steps"] == 2
    # A step's logged numbers are exact; the pooled mean of step means is an estimate.
    assert s["estimate"] is True and not per_step["estimate"].any()


def test_summary_of_sample_and_step_aggregate_runs_together(store):
    # "z" has samples and a known cap; "console" has only logged step aggregates (and a cap in its
    # metadata, which its rows must not show). Rows: runs by name, kinds prompt, response, total.
    sampled = add_run(store, "z", meta={"max_response_len": 4})
    add_samples(store, sampled, step=0, prompts=[1, 2, 3, 4], responses=[1, 2, 4, 4])
    console = add_run(store, "console", meta={"max_response_len": 400})
    add_step_metrics(store, console, 1, {"response_length/mean": 100, "response_length/max": 200,
                                         "response_length/min": 10, "prompt_length/mean": 50})
    summary = lengths.summary(store, [sampled, console], StepRange())
    assert summary.columns == list(lengths.SUMMARY_COLUMNS)
    assert summary.select("run", "kind").rows() == [
        ("console", "prompt"), ("console", "response"), ("z", "prompt"), ("z", "response"), ("z", "total")]
    logged = row(summary, run="console", kind="response")
    assert (logged["basis"], logged["estimate"], logged["count"]) == ("step_aggregates", True, None)
    assert (logged["cap_tokens"], logged["pearson"]) == (None, None)
    assert logged["max_p50"] is None and logged["cv"] is None
    z = row(summary, run="z", kind="response")
    assert (z["basis"], z["estimate"], z["cap_tokens"], z["cap_source"]) == ("samples", False, 4, "known")
    assert z["clip_ratio"] == pytest.approx(0.5)
    assert z["p50_tokens"] == pytest.approx(3.0) and z["max_p50"] == pytest.approx(4 / 3)
    # prompts 1..4 against responses 1, 2, 4, 4: ranks 1, 2, 3.5, 3.5
    assert z["pearson"] == pytest.approx(np.corrcoef([1, 2, 3, 4], [1, 2, 4, 4])[0, 1])
    assert z["spearman"] == pytest.approx(stats.spearmanr([1, 2, 3, 4], [1, 2, 4, 4]).statistic)
    assert row(summary, run="z", kind="total")["cap_tokens"] is None


def test_correlation_of_a_constant_length_is_null(store):
    run = add_run(store, "flat")
    add_samples(store, run, step=0, prompts=[5, 5, 5], responses=[1, 2, 3])
    corr = row(lengths.correlation(store, [run]), run="flat")
    assert corr["n"] == 3 and corr["pearson"] is None and corr["spearman"] is None


def test_empty_run_gives_empty_frame_with_columns(store):
    run = add_run(store, "empty")
    summary = lengths.summary(store, [run], StepRange())
    assert summary.height == 0 and "p99_tokens" in summary.columns and "basis" in summary.columns


def _packed_responses(folder):
    """step -> response lengths of training samples, read straight from the packed JSON lines."""
    per_step: dict[int, list[int]] = {}
    for path in folder.rglob("packed_lengths_step_*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if not record.get("validate"):
                per_step.setdefault(record["step"], []).extend(record["output"])
    return per_step


def _multiturn_responses(folder):
    per_step: dict[int, list[int]] = {}
    for path in folder.rglob("multiturn_workload_step_*.jsonl"):
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                if not record.get("validate"):
                    per_step.setdefault(record["step"], []).append(record["final_response_len"])
    return per_step


@pytest.mark.parametrize("trace", ["rllm", "verl", "search_r1"])
def test_real_trace_per_step_p99_and_max(store, trace):
    folder = need_real_data("polytrace", trace)
    ingest_paths(store, [folder])
    run = ids_of(store, trace)
    expected = _multiturn_responses(folder) if trace == "search_r1" else _packed_responses(folder)
    assert expected
    per_step = lengths.per_step(store, [run]).filter(kind="response")
    assert sorted(per_step["step"].to_list()) == sorted(expected)
    for step, values in expected.items():
        r = row(per_step, step=step)
        assert r["p99_tokens"] == pytest.approx(np.percentile(values, 99))
        assert r["max_tokens"] == max(values)
        assert r["count"] == len(values)


def test_real_rllm_clip_ratio_is_share_of_16000(store):
    folder = need_real_data("polytrace", "rllm")
    ingest_paths(store, [folder])
    values = np.concatenate([np.array(v) for v in _packed_responses(folder).values()])
    s = row(lengths.summary(store, [ids_of(store, "rllm")], StepRange()), kind="response")
    assert s["estimate"] is False and s["cap_source"] in ("known", "evident")
    assert s["cap_tokens"] == 16000
    assert s["clip_ratio"] > 0
    assert s["clip_ratio"] == pytest.approx(np.mean(values == 16000))


def test_pooled_summary_from_the_histogram_equals_numpy_and_scipy(store):
    # Integer lengths with many ties over three steps, a cap at 60 (recorded) and one validation
    # sample left out: the histogram path must give numpy's linear percentiles and scipy's
    # bias-corrected moments over the raw samples.
    rng = np.random.default_rng(3)
    run = add_run(store, "pooled", meta={"max_response_len": 60})
    prompts, responses = [], []
    for step in range(3):
        p = rng.integers(5, 40, size=50)
        r = np.minimum(rng.integers(1, 80, size=50), 60)
        add_samples(store, run, step=step, prompts=p, responses=r)
        prompts.append(p)
        responses.append(r)
    add_samples(store, run, step=1, prompts=[1000], responses=[1000], validate=True)
    summary = lengths.summary(store, [run], StepRange())
    for kind, values in (("prompt", np.concatenate(prompts)), ("response", np.concatenate(responses)),
                         ("total", np.concatenate(prompts) + np.concatenate(responses))):
        s = row(summary, kind=kind)
        assert (s["count"], s["steps"]) == (150, 3)
        assert s["mean_tokens"] == pytest.approx(values.mean())
        assert s["std_tokens"] == pytest.approx(values.std(ddof=1))
        for name, q in (("p50_tokens", 50), ("p90_tokens", 90), ("p99_tokens", 99)):
            assert s[name] == pytest.approx(np.percentile(values, q))
        assert (s["min_tokens"], s["max_tokens"]) == (values.min(), values.max())
        assert s["skewness"] == pytest.approx(stats.skew(values, bias=False))
        assert s["kurtosis"] == pytest.approx(stats.kurtosis(values, bias=False))
    assert row(summary, kind="response")["clip_ratio"] == pytest.approx(np.mean(np.concatenate(responses) >= 60))
    assert row(summary, kind="prompt")["clip_ratio"] is None


def test_pooled_summary_small_and_constant_samples(store):
    run = add_run(store, "tiny")
    add_samples(store, run, step=0, prompts=[7, 7], responses=[3, 9])
    s = row(lengths.summary(store, [run], StepRange()), kind="response")
    assert s["p50_tokens"] == pytest.approx(6.0) and s["p99_tokens"] == pytest.approx(3 + 0.99 * 6)
    assert s["std_tokens"] == pytest.approx(np.std([3, 9], ddof=1))
    assert s["skewness"] is None and s["kurtosis"] is None and s["clip_ratio"] is None  # n = 2, no cap
    p = row(lengths.summary(store, [run], StepRange()), kind="prompt")
    assert p["std_tokens"] == 0 and p["cv"] == 0 and p["skewness"] is None
