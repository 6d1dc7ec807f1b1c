"""Fidelity: the comparison math by hand, run shapes, and real traces against direct computation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from polytrace_cli.workload.fidelity import compare_lengths, fidelity, read_params, run_lengths, run_shape
from polytrace_cli.errors import PolytraceError
from polytrace_cli.ingest.driver import ingest_paths
from tests.conftest import need_real_data


def test_compare_lengths_by_hand():
    real = np.array([1, 2, 3, 4, 100])
    synthetic = np.array([2, 3, 4, 5, 100])
    out = compare_lengths(real, synthetic, cap=100)
    # ECDFs differ by 1/5 on [1, 2) and are equal elsewhere... and on [2,3), [3,4), [4,5) by 1/5 too.
    assert out["ks"] == pytest.approx(0.2)
    assert out["mean_run"] == pytest.approx(22.0) and out["mean_synth"] == pytest.approx(22.8)
    assert out["mean_error"] == pytest.approx(0.8 / 22)
    assert out["p50_error"] == pytest.approx((4 - 3) / 3)
    # p99 by linear interpolation: 4 + 0.96 * (100 - 4) and 5 + 0.96 * (100 - 5).
    assert out["p99_run"] == pytest.approx(96.16) and out["p99_synth"] == pytest.approx(96.2)
    assert out["clip_run"] == pytest.approx(0.2) and out["clip_error"] == pytest.approx(0.0)
    assert out["ks_noise"] == pytest.approx(1.358 * np.sqrt(10 / 25))
    assert out["pass"] is False  # KS 0.2 > 0.05


def test_compare_lengths_passes_identical_samples_and_has_no_clip_without_cap():
    values = np.arange(1, 1001)
    out = compare_lengths(values, values)
    assert out["ks"] == 0 and out["p99_error"] == 0 and out["pass"] is True
    assert out["clip_run"] is None and out["clip_error"] is None


def _packed(folder, step, groups, dp_ranks=2):
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"step": step, "rank": g % dp_ranks, "dp_rank": g % dp_ranks, "tp_rank": 0,
                         "local_index": g // dp_ranks, "input": prompt, "output": outputs, "validate": False})
             for g, (prompt, outputs) in enumerate(groups)]
    (folder / f"packed_lengths_step_{step}.jsonl").write_text("\n".join(lines) + "\n")


def test_run_shape_and_lengths(store, tmp_path):
    # Step 0: three groups of 4, two of them at the cap 50; step 1: two groups of 4 and one of 1.
    _packed(tmp_path / "r", 0, [(10, [50, 50, 20, 30]), (11, [1, 2, 3, 50]), (12, [5, 6, 7, 8])])
    _packed(tmp_path / "r", 1, [(13, [9, 9, 9, 9]), (14, [50, 1, 1, 1]), (15, [3])])
    ingest_paths(store, [tmp_path / "r"], run_name="r")
    shape = run_shape(store, 1)
    # 21 samples, 20 of them in groups of 4: n = 4, batch = round(21 / (2 × 4)) = 3; 4 of 21 at 50.
    assert (shape.steps, shape.n, shape.batch, shape.dp_ranks, shape.samples) == (2, 4, 3, 2, 21)
    assert shape.max_response_len == 50
    assert run_shape(store, 1, max_response_len=64).max_response_len == 64
    prompts, responses = run_lengths(store, 1)
    assert sorted(prompts) == [10, 11, 12, 13, 14, 15] and responses.size == 21


def test_model_matching_the_run_passes_and_a_wrong_one_fails(store, tmp_path):
    rng = np.random.default_rng(7)
    for step in range(4):
        groups = [(int(p), [int(x) for x in rng.lognormal(np.log(1000), 0.5, 8)])
                  for p in rng.lognormal(np.log(200), 0.3, 64)]
        _packed(tmp_path / "run", step, groups)
    ingest_paths(store, [tmp_path / "run"], run_name="run")
    right = {"format": "polytrace-params/1", "task": "t",
             "prompt": {"family": "lognorm", "params": {"s": 0.3, "scale": 200.0}},
             "response": {"family": "lognorm", "params": {"s": 0.5, "scale": 1000.0}}}
    wrong = {**right, "response": {"family": "lognorm", "params": {"s": 0.5, "scale": 1500.0}}}
    frame = fidelity(store, 1, right, seed=1)
    model_rows = {r["kind"]: r for r in frame.to_dicts() if r["draw"] == "model"}
    assert set(frame["sampler"]) == {"parametric"}  # no empirical quantiles in the parameters
    assert model_rows["response"]["n_run"] == 4 * 64 * 8 and model_rows["response"]["n_synth"] == 10 * 4 * 64 * 8
    assert model_rows["response"]["ks"] < 0.05 and model_rows["response"]["pass"]
    # Through the generator (grouped by prompt, 10x the run's steps): the marginal is kept.
    workload = {r["kind"]: r for r in frame.to_dicts() if r["draw"] == "workload"}
    assert workload["response"]["n_synth"] == 10 * 4 * 64 * 8 and workload["prompt"]["n_synth"] == 10 * 4 * 64
    assert workload["response"]["ks"] < 0.05 and abs(workload["response"]["p50_error"]) < 0.05
    assert workload["response"]["pass"]
    bad = {r["kind"]: r for r in fidelity(store, 1, wrong, seed=1).to_dicts() if r["draw"] == "model"}
    # Scale × 1.5 moves every quantile by +50%.
    assert bad["response"]["p50_error"] == pytest.approx(0.5, abs=0.08)
    assert not bad["response"]["pass"]


def test_read_params_refuses_other_files(tmp_path):
    other = tmp_path / "x.json"
    other.write_text('{"math_task": {}}')
    with pytest.raises(PolytraceError, match="not a polytrace-params/1 file"):
        read_params(other)
    with pytest.raises(PolytraceError, match="no parameters file"):
        read_params(tmp_path / "missing.json")


def test_real_trace_lengths_match_the_json(store):
    source = need_real_data("polytrace", "rllm")
    ingest_paths(store, [source], run_name="rllm")
    records = [json.loads(line) for path in sorted(source.rglob("packed_lengths_step_*.jsonl"))
               for line in path.read_text().splitlines() if line.strip()]
    expected_responses = np.array([x for r in records if not r.get("validate") for x in r["output"]], float)
    quantiles = np.quantile(expected_responses, np.linspace(0, 1, 101)).tolist()
    params = {"format": "polytrace-params/1", "task": "code",
              "prompt": {"family": "lognorm", "params": {"s": 0.5, "scale": 400.0}},
              "response": {"family": "lognorm", "params": {"s": 0.5, "scale": 9000.0}},
              "empirical": {"prompt_quantiles": np.quantile([r["input"] for r in records], np.linspace(0, 1, 101)).tolist(),
                            "response_quantiles": quantiles}}
    frame = fidelity(store, 1, params, seed=0)
    row = next(r for r in frame.to_dicts() if (r["sampler"], r["draw"], r["kind"]) == ("empirical", "model", "response"))
    assert row["n_run"] == expected_responses.size
    assert row["p99_run"] == pytest.approx(np.quantile(expected_responses, 0.99))
    assert row["clip_run"] == pytest.approx(np.mean(expected_responses >= 16000))
    # Inverse-CDF draws from the run's own quantiles reproduce it within sampling noise.
    assert row["ks"] < row["ks_noise"]


@pytest.mark.parametrize("task", ["verl", "rllm", "search_r1"])
def test_real_traces_fitted_and_resynthesized_meet_the_targets(store, task):
    """fit + synth + compare on the PolyTrace traces: response lengths through the generator meet
    KS <= 0.05 and |p99 error| <= 10% with both samplers, and the clip ratio is kept within 3 points."""
    from polytrace_cli.workload.fidelity import fitted_params

    ingest_paths(store, [need_real_data("polytrace", task)], run_name=task)
    run_id = store.execute("SELECT run_id FROM runs WHERE name = ?", [task]).fetchall()[0][0]
    frame = fidelity(store, run_id, fitted_params(store, run_id), seed=0)
    for row in frame.filter(kind="response").to_dicts():
        assert row["pass"], row
        if row["clip_run"] is not None:
            assert abs(row["clip_synth"] - row["clip_run"]) < 0.03, row
    if task == "verl":  # enough prompts (576) to hold prompts to the targets too
        assert all(frame.filter(kind="prompt")["pass"])
