"""The workload generator: determinism, requested shape and statistics, round trip through ingest."""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from scipy import stats

from polytrace_cli.workload.distributions import GaussianMixture2D, LengthModel, Marginal, load_params
from polytrace_cli.workload.presets import preset
from polytrace_cli.workload.synth import WorkloadSpec, drift_factor, synthesize
from polytrace_cli.cli import app
from polytrace_cli.ingest.driver import ingest_paths
from tests.conftest import need_real_data


def _lengths(folder):
    out = []
    for path in sorted(folder.glob("packed_lengths_step_*.jsonl")):
        for line in path.read_text().splitlines():
            out.extend(json.loads(line)["output"])
    return np.array(out)


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    model, spec = preset("code")
    synthesize(model, spec, tmp_path / "a")
    synthesize(model, spec, tmp_path / "b")
    synthesize(model, WorkloadSpec(**{**spec.__dict__, "seed": 1}), tmp_path / "c")
    first = (tmp_path / "a" / "packed_lengths_step_0.jsonl").read_bytes()
    assert first == (tmp_path / "b" / "packed_lengths_step_0.jsonl").read_bytes()
    assert first != (tmp_path / "c" / "packed_lengths_step_0.jsonl").read_bytes()


def test_requested_shape_and_cap(tmp_path):
    # lognormal with median 1000 and a cap at its 90th percentile: clip ratio ~ 10% (the marginal is kept).
    sigma = 0.5
    cap = int(round(1000 * np.exp(1.2816 * sigma)))
    model = LengthModel(prompt=Marginal("lognorm", {"s": 0.2, "scale": 100.0}),
                        response=Marginal("lognorm", {"s": sigma, "scale": 1000.0}))
    spec = WorkloadSpec(task="t", steps=10, batch=64, n=8, dp_ranks=4, max_response_len=cap, seed=3)
    result = synthesize(model, spec, tmp_path)
    lengths = _lengths(tmp_path)
    assert result.samples == lengths.size == 10 * 64 * 8
    assert lengths.max() == cap
    clip = float((lengths == cap).mean())
    assert 0.07 < clip < 0.13
    lines = [json.loads(x) for x in (tmp_path / "packed_lengths_step_0.jsonl").read_text().splitlines()]
    assert {x["dp_rank"] for x in lines} == {0, 1, 2, 3}
    assert all(len(x["output"]) == 8 for x in lines)
    rewards = (tmp_path / "reward_timings_step_0.jsonl").read_text().splitlines()
    assert len(rewards) == 4


def test_drift_raises_mean_length_over_steps(tmp_path):
    model = LengthModel(prompt=Marginal("lognorm", {"s": 0.1, "scale": 100.0}),
                        response=Marginal("lognorm", {"s": 0.3, "scale": 1000.0}))
    synthesize(model, WorkloadSpec(task="t", steps=30, batch=64, n=8, drift=0.02, seed=1), tmp_path)
    means = [np.mean([v for line in (tmp_path / f"packed_lengths_step_{s}.jsonl").read_text().splitlines()
                      for v in json.loads(line)["output"]]) for s in (0, 29)]
    assert 1.5 < means[1] / means[0] < 1.9  # 1.02 ** 29 = 1.78
    # Centred on the middle step: the pooled mean stays the model's, 1000 · exp(0.3² / 2) = 1046.
    assert drift_factor(WorkloadSpec(task="t", steps=3, drift=0.1), 1) == 1.0
    assert abs(_lengths(tmp_path).mean() / (1000 * np.exp(0.045) * np.mean([1.02 ** (s - 14.5) for s in range(30)])) - 1) < 0.02


def test_drift_far_from_the_middle_of_a_long_run_stays_within_one_and_the_cap():
    from polytrace_cli.workload.synth import draw_step

    model = LengthModel(prompt=Marginal("lognorm", {"s": 0.1, "scale": 100.0}),
                        response=Marginal("lognorm", {"s": 0.3, "scale": 1000.0}))
    for cap in (4096, None):
        spec = WorkloadSpec(task="t", steps=200_000, batch=4, n=2, drift=0.01, max_response_len=cap)
        assert drift_factor(spec, 0) == 0.0 and drift_factor(spec, spec.steps - 1) == float("inf")
        _, first = draw_step(model, spec, np.random.default_rng(0), 0)
        _, last = draw_step(model, spec, np.random.default_rng(0), spec.steps - 1)
        assert first.tolist() == [[1, 1]] * 4
        assert last.tolist() == [[cap or 2**31 - 1] * 2] * 4


def test_groups_keep_the_response_marginal_and_correlate_within_a_prompt():
    model = LengthModel(prompt=Marginal("lognorm", {"s": 0.2, "scale": 100.0}),
                        response=Marginal("lognorm", {"s": 0.5, "scale": 1000.0}))
    _, responses = model.sample_groups(np.random.default_rng(5), 4000, 8)
    # Every response has the lognormal marginal: KS against its CDF within sampling error (n = 32,000).
    assert stats.kstest(responses.ravel(), stats.lognorm(0.5, scale=1000.0).cdf).statistic < 0.015
    # Responses of one prompt share the copula factor: correlation of log lengths ~ rho = 0.5.
    logs = np.log(responses)
    assert 0.42 < np.corrcoef(logs[:, 0], logs[:, 1])[0, 1] < 0.58


def test_censored_model_reproduces_the_clip_share_and_the_body():
    # Fitted below the cap (exponential with mean 1000) and 20% of responses at the cap 2000.
    model = LengthModel(prompt=Marginal("lognorm", {"s": 0.1, "scale": 100.0}),
                        response=Marginal("expon", {"scale": 1000.0}), max_response_len=2000, clip_ratio=0.2)
    _, responses = model.sample(np.random.default_rng(2), 100_000, cap=2000)
    assert abs(np.mean(responses == 2000) - 0.2) < 0.005
    body = responses[responses < 2000]
    # Below the cap: the exponential truncated at 2000, median = −1000 · ln(1 − (1 − e^−2)/2) = 566.
    assert abs(np.median(body) / 566.2 - 1) < 0.02
    # Another cap than the fitted one: plain clipping of the model, share = e^−3 = 5.0%.
    _, other = model.sample(np.random.default_rng(2), 100_000, cap=3000)
    assert abs(np.mean(other == 3000) - np.exp(-3)) < 0.004


def test_joint_mixture_groups_follow_the_conditional_gaussian():
    # One component in log space: ln prompt ~ N(5, 0.04), ln response ~ N(7, 0.25), covariance 0.06 (rho 0.6).
    joint = GaussianMixture2D(np.array([1.0]), np.array([[5.0, 7.0]]), np.array([[[0.04, 0.06], [0.06, 0.25]]]), "log")
    prompts, responses = joint.sample_groups(np.random.default_rng(1), 20_000, 4)
    x, y = np.log(prompts), np.log(responses)
    assert abs(y.mean() - 7.0) < 0.01 and abs(y.std() - 0.5) < 0.01
    assert abs(np.corrcoef(x, y[:, 0])[0, 1] - 0.6) < 0.02
    # Within a prompt the residual sd is sqrt(0.25 − 0.06² / 0.04) = 0.4.
    assert abs((y - y.mean(axis=1, keepdims=True)).std() / np.sqrt(3 / 4) - 0.4) < 0.01
    # Censored at e^7 with half the responses at the cap: the rest all below it.
    _, capped = joint.sample_groups(np.random.default_rng(1), 20_000, 4, cap=float(np.exp(7.0)), clip_ratio=0.5)
    assert abs(np.mean(capped == np.exp(7.0)) - 0.5) < 0.01 and capped.max() == np.exp(7.0)


def test_round_trip_through_ingest_gives_exact_counts(store, tmp_path):
    for task in ("math", "code", "search"):
        model, spec = preset(task)
        synthesize(model, spec, tmp_path / task)
        reports = ingest_paths(store, [tmp_path / task], task=task)
        assert all(r.status == "ingested" and r.rejected == 0 for r in reports)
    counts = dict(store.execute("SELECT r.name, count(*) FROM samples JOIN runs r USING (run_id) GROUP BY 1").fetchall())
    assert counts == {"math": 6 * 48 * 8, "code": 5 * 16 * 8, "search": 3 * 16 * 4}
    assert store.execute("SELECT count(*) FROM filter_batches").fetchall()[0][0] == 6
    assert store.execute("SELECT count(*) FROM tool_calls").fetchall()[0][0] > 0


def test_published_parameters_file_drives_the_math_sampler(tmp_path):
    path = need_real_data("distributions", "enhanced_task_distribution_parameters.json")
    model = load_params(path, task="math")
    prompts, responses = model.sample(np.random.default_rng(0), 200_000)
    published = json.loads(path.read_text())["math_task"]["gmm_parameters"]
    expected_mean = np.dot(published["weights"], np.array(published["means"])[:, 1])
    assert abs(responses.mean() / expected_mean - 1) < 0.02
    # The linear-space mixture is truncated at 1 token, not clamped: no pile of 1-token responses
    # (clamping put 0.7% of draws there, mostly from the component with mean 4,959 and sd 2,192).
    assert np.mean(responses <= 1) < 1e-4


def test_synth_and_demo_commands(tmp_path, demo_run):
    runner = CliRunner()
    result = runner.invoke(app, ["synth", "--task", "code", "--out", str(tmp_path / "w"), "--num-steps", "2", "--seed", "4"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "w").iterdir())[:2] == ["packed_lengths_step_0.jsonl", "packed_lengths_step_1.jsonl"]
    # Without --db the demo writes its own store beside the sample logs, never the user's store.
    demo, folder = demo_run
    assert demo.exit_code == 0, demo.output
    for task in ("math", "code", "search"):
        assert task in demo.output
    assert (folder / "logs" / "demo.duckdb").exists() and not (folder / "user.duckdb").exists()
    bad = runner.invoke(app, ["synth", "--task", "video", "--out", str(tmp_path / "v")])
    assert bad.exit_code == 2 and "no built-in preset" in bad.output


def test_synth_ingest_analyze_gives_the_requested_statistics(store, tmp_path):
    """synth -> ingest -> analyze lengths: the model's statistics within sampling error.

    Responses lognormal(μ = ln 1000, σ = 0.5) capped at its 90th percentile c = 1000·e^(1.2816·0.5) = 1898:
    median 1000, clip ratio 10%, mean E[min(X, c)] = e^(μ+σ²/2)·Φ((ln c − μ − σ²)/σ) + c·0.1
    = 1133.1·Φ(0.7816) + 189.8 = 1076.8. Prompts lognormal with median 100.
    """
    from polytrace_cli.analyze import lengths

    cap = int(round(1000 * np.exp(1.2816 * 0.5)))
    model = LengthModel(prompt=Marginal("lognorm", {"s": 0.2, "scale": 100.0}),
                        response=Marginal("lognorm", {"s": 0.5, "scale": 1000.0}))
    spec = WorkloadSpec(task="t", steps=8, batch=64, n=8, dp_ranks=2, max_response_len=cap, seed=7)
    synthesize(model, spec, tmp_path / "w")
    reports = ingest_paths(store, [tmp_path / "w"], run_name="synthetic")
    assert all(r.status == "ingested" and r.rejected == 0 for r in reports)
    run_id = store.execute("SELECT run_id FROM runs WHERE name = 'synthetic'").fetchall()[0][0]
    summary = {row["kind"]: row for row in lengths.summary(store, [run_id]).to_dicts()}
    response, prompt = summary["response"], summary["prompt"]
    assert response["count"] == 8 * 64 * 8 and response["max_tokens"] == cap
    assert abs(response["p50_tokens"] / 1000 - 1) < 0.05
    assert abs(response["mean_tokens"] / 1076.8 - 1) < 0.05
    assert 0.07 < np.mean(_lengths(tmp_path / "w") == cap) < 0.13
    assert response["cap_tokens"] == cap and 0.07 < response["clip_ratio"] < 0.13
    assert abs(prompt["p50_tokens"] / 100 - 1) < 0.05
    ranks = store.execute("SELECT count(DISTINCT dp_rank) FROM samples WHERE run_id = ?", [run_id]).fetchall()[0][0]
    assert ranks == 2


def test_published_tool_calling_sequence_models_drive_multiturn_trajectories(tmp_path):
    # A 2-call model with zero covariance: every session is input 100, 50 and output 10, 20.
    names = ["input_1", "input_2", "output_1", "output_2"]
    document = {"math_task": {}, "tool_calling_task": {
        "call_count_distribution": {"2": 7},
        "sequence_models": {"2": {"feature_names": names, "mean_vector": [100, 50, 10, 20],
                                  "covariance_matrix": np.zeros((4, 4)).tolist()}}}}
    path = tmp_path / "published.json"
    path.write_text(json.dumps(document))
    model = load_params(path, task="tool")
    synthesize(model, WorkloadSpec(task="tool", steps=1, batch=3, n=2, multiturn=True, seed=0), tmp_path / "w")
    lines = [json.loads(x) for x in (tmp_path / "w" / "multiturn_workload_step_0.jsonl").read_text().splitlines()]
    assert len(lines) == 6
    for line in lines:
        assert line["prompt_len"] == 100 and line["turn_count"] == 2 and line["tool_call_count"] == 1
        assert [t["completion_tokens"] for t in line["turns"]] == [10, 20]
        assert [t["prompt_tokens"] for t in line["turns"]] == [100, 100 + 10 + 50]
        assert line["tool_calls"][0]["response_token_len"] == 50 and line["final_response_len"] == 10 + 50 + 20


def test_published_tool_calling_call_counts(store, tmp_path):
    path = need_real_data("distributions", "enhanced_task_distribution_parameters.json")
    counts = json.loads(path.read_text())["tool_calling_task"]["call_count_distribution"]
    model = load_params(path, task="tool")
    synthesize(model, WorkloadSpec(task="tool", steps=1, batch=1000, n=2, multiturn=True, seed=0), tmp_path / "w")
    reports = ingest_paths(store, [tmp_path / "w"], run_name="tool")
    assert all(r.status == "ingested" and r.rejected == 0 for r in reports)
    turns = dict(store.execute("SELECT turns, count(*) FROM samples GROUP BY turns").fetchall())
    total = sum(counts.values())
    for calls, n in counts.items():
        assert abs(turns.get(int(calls), 0) / 2000 - n / total) < 0.03
