"""The workload generator: determinism, requested shape and statistics, round trip through ingest."""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from polytrace_cli.bench.distributions import LengthModel, Marginal, load_params
from polytrace_cli.bench.presets import preset
from polytrace_cli.bench.synth import WorkloadSpec, synthesize
from polytrace_cli.cli import app
from polytrace_cli.ingest.runner import ingest_paths
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
    # lognormal with median 1000 and a cap at the 90th percentile: clip ratio ~ 10%.
    sigma = 0.5
    cap = int(round(1000 * np.exp(1.2816 * np.sqrt(sigma**2 + 0.35**2))))
    model = LengthModel(prompt=Marginal("lognorm", {"s": 0.2, "scale": 100.0}),
                        response=Marginal("lognorm", {"s": sigma, "scale": 1000.0}))
    spec = WorkloadSpec(task="t", steps=10, batch=64, n=8, dp_ranks=4, max_response_len=cap, seed=3)
    result = synthesize(model, spec, tmp_path)
    lengths = _lengths(tmp_path)
    assert result.samples == lengths.size == 10 * 64 * 8
    assert lengths.max() == cap
    clip = float((lengths == cap).mean())
    assert 0.06 < clip < 0.14
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


def test_synth_and_demo_commands(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["synth", "--task", "code", "--out", str(tmp_path / "w"), "--steps", "2", "--seed", "4"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "w").iterdir())[:2] == ["packed_lengths_step_0.jsonl", "packed_lengths_step_1.jsonl"]
    demo = runner.invoke(app, ["demo", "--out", str(tmp_path / "logs"), "--db", str(tmp_path / "d.duckdb")])
    assert demo.exit_code == 0, demo.output
    for task in ("math", "code", "search"):
        assert task in demo.output
    bad = runner.invoke(app, ["synth", "--task", "video", "--out", str(tmp_path / "v")])
    assert bad.exit_code == 2 and "no built-in preset" in bad.output
