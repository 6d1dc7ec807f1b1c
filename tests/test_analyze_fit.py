"""fit: parameter recovery on seeded samples, KS/AIC formulas, censoring at the cap, the params file."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from scipy import stats

from polytrace_cli.analyze import fit
from polytrace_cli.analyze.common import StepRange
from polytrace_cli.workload.distributions import load_params
from polytrace_cli.errors import PolytraceError
from polytrace_cli.ingest.driver import ingest_paths
from tests.conftest import need_real_data
from tests.test_analyze_lengths import add_run, add_samples, ids_of


def seeded_run(store, name="seeded", meta=None, n=4000, cap=None):
    rng = np.random.default_rng(7)
    prompts = np.rint(stats.lognorm(0.5, scale=300).rvs(n, random_state=rng)).astype(int)
    responses = np.rint(stats.gamma(2.0, scale=900).rvs(n, random_state=rng)).astype(int)
    if cap is not None:
        responses = np.minimum(responses, cap)
    run = add_run(store, name, meta=meta)
    for step in range(4):
        chunk = slice(step * n // 4, (step + 1) * n // 4)
        add_samples(store, run, step=step, prompts=prompts[chunk].tolist(), responses=responses[chunk].tolist(),
                    dp_rank=step % 2)
    return run, prompts, responses


def test_recovers_known_parameters(store):
    run, _, _ = seeded_run(store)
    prompt = fit.fit_histogram(fit.histogram(store, [run], StepRange(), "prompt"))
    response = fit.fit_histogram(fit.histogram(store, [run], StepRange(), "response"))
    lognorm = next(c for c in prompt if c.family == "lognorm")
    assert lognorm.params["s"] == pytest.approx(0.5, rel=0.05)
    assert lognorm.params["scale"] == pytest.approx(300, rel=0.05)
    assert lognorm.params["loc"] == 0.0
    gamma = next(c for c in response if c.family == "gamma")
    assert gamma.params["a"] == pytest.approx(2.0, rel=0.08)
    assert gamma.params["scale"] == pytest.approx(900, rel=0.08)
    assert fit.best_of(prompt, fit.SCIPY_FAMILIES).family == "lognorm"
    assert fit.best_of(response, fit.SCIPY_FAMILIES).family == "gamma"
    assert {c.family for c in response} == {"lognorm", "gamma", "weibull_min", "gaussian_mixture"}


def test_aic_and_ks_formulas(store):
    run, _, responses = seeded_run(store, n=400)
    fitted = fit.fit_histogram(fit.histogram(store, [run], StepRange(), "response"))
    weibull = next(c for c in fitted if c.family == "weibull_min")
    frozen = stats.weibull_min(weibull.params["c"], loc=0, scale=weibull.params["scale"])
    values = responses[responses > 0].astype(float)
    assert weibull.aic == pytest.approx(2 * 2 - 2 * frozen.logpdf(values).sum())
    assert weibull.ks == pytest.approx(stats.kstest(values, frozen.cdf).statistic)


def test_ks_and_systematic_sample_by_hand():
    hist = fit.Histogram(values=np.array([1.0, 2.0, 3.0]), counts=np.array([2, 1, 1]))
    # F_n jumps to 0.5, 0.75, 1 at 1, 2, 3; uniform(0, 4) is 0.25, 0.5, 0.75 there: worst gap 0.25
    assert hist.ks(stats.uniform(0, 4).cdf) == pytest.approx(0.25)
    assert hist.systematic_sample(limit=2).tolist() == [1.0, 3.0]  # ranks 1 and 3 of 1,1,2,3
    assert hist.systematic_sample(limit=10).tolist() == [1.0, 1.0, 2.0, 3.0]


def test_responses_at_the_cap_are_left_out_and_counted(store):
    run, _, responses = seeded_run(store, meta={"max_response_len": 3000}, cap=3000)
    row = fit.summary(store, [run], StepRange()).filter(kind="response").row(0, named=True)
    at_cap = int(np.sum(responses >= 3000))
    assert at_cap > 0
    assert row["excluded_at_cap"] == at_cap and row["n_fitted"] == len(responses) - at_cap
    assert row["clip_ratio"] == pytest.approx(at_cap / len(responses))
    assert row["cap_tokens"] == 3000
    hist = fit.histogram(store, [run], StepRange(), "response")
    assert hist.values.max() < 3000


def test_histograms_of_every_run_read_at_once_equal_each_run_read_alone(store):
    capped, _, _ = seeded_run(store, "capped", meta={"max_response_len": 3000}, cap=3000)
    plain, _, _ = seeded_run(store, "plain", n=400)
    odd = add_run(store, "odd")
    add_samples(store, odd, step=0, prompts=[0, 5, 5, 9], responses=[-1, 0, 12, 12])
    empty = add_run(store, "empty")
    runs = [capped, plain, odd, empty]
    together = fit.run_histograms(store, runs, StepRange(0, 2))
    assert set(together) == {(run, kind) for run in runs for kind in ("prompt", "response")}
    for (run, kind), hist in together.items():
        alone = fit.histogram(store, [run], StepRange(0, 2), kind)
        assert np.array_equal(hist.values, alone.values) and hist.values.dtype == alone.values.dtype
        assert np.array_equal(hist.counts, alone.counts) and hist.counts.dtype == alone.counts.dtype
        assert (hist.excluded_at_cap, hist.excluded_nonpositive, hist.cap) == (
            alone.excluded_at_cap, alone.excluded_nonpositive, alone.cap)
    assert together[(capped, "response")].excluded_at_cap > 0 and together[(capped, "response")].cap == 3000
    assert together[(odd, "response")].excluded_nonpositive == 2 and together[(odd, "prompt")].excluded_nonpositive == 1
    assert together[(empty, "prompt")].n == 0


def test_mixture_skipped_with_a_note_without_scikit_learn(store, monkeypatch):
    run, _, _ = seeded_run(store, n=200)
    monkeypatch.setitem(sys.modules, "sklearn.mixture", None)
    fitted = fit.fit_histogram(fit.histogram(store, [run], StepRange(), "prompt"))
    mixture = next(c for c in fitted if c.family == "gaussian_mixture")
    assert mixture.aic is None and "scikit-learn" in mixture.note
    row = fit.summary(store, [run], StepRange()).filter(kind="prompt").row(0, named=True)
    assert row["family"] != "gaussian_mixture" and "scikit-learn" in row["note"] and row["candidates"] == 3


def test_params_file_round_trips_into_the_generator(store, tmp_path):
    run, prompts, responses = seeded_run(store, meta={"n_sampling": 8, "dp_ranks_seen": 2})
    path = tmp_path / "params.json"
    fit.write_params(store, run, path)
    document = json.loads(path.read_text())
    assert document["format"] == "polytrace-params/1" and document["source_run"] == "seeded"
    assert document["prompt"]["family"] == "lognorm" and document["response"]["family"] == "gamma"
    assert set(document["prompt"]["params"]) == {"s", "loc", "scale"}
    assert len(document["empirical"]["prompt_quantiles"]) == 1001
    assert document["empirical"]["response_quantiles"][-1] == responses.max()
    assert document["empirical"]["prompt_quantiles"][500] == pytest.approx(np.percentile(prompts, 50))
    assert (document["n_sampling"], document["dp_ranks"], document["max_response_len"]) == (8, 2, None)
    assert document["multiturn"] is None
    assert document["joint"]["space"] == "log" and len(document["joint"]["weights"]) in fit.JOINT_COMPONENTS
    # Four steps are too few for a trend: no drift is made up from them, and the notes say why.
    assert document["drift_per_step"] is None
    assert "drift_per_step is null: trend withheld: 4 steps with data, at least 5 needed" in document["notes"]
    model = load_params(path)
    drawn_prompts, drawn_responses = model.sample(np.random.default_rng(0), 1000)
    assert len(drawn_prompts) == 1000 and drawn_responses.min() >= 1
    empirical = load_params(path, sampler="empirical")
    assert empirical.sample(np.random.default_rng(0), 10)[0].max() <= prompts.max()


def test_params_of_a_run_without_samples_is_an_error(store, tmp_path):
    run = add_run(store, "empty")
    with pytest.raises(PolytraceError):
        fit.write_params(store, run, tmp_path / "p.json")
    assert fit.summary(store, [run], StepRange()).height == 0


def test_real_rllm_params(store, tmp_path):
    folder = need_real_data("polytrace", "rllm")
    ingest_paths(store, [folder])
    document = fit.write_params(store, ids_of(store, "rllm"), tmp_path / "rllm.json")
    values = [v for p in folder.rglob("packed_lengths_step_*.jsonl") for line in p.read_text().splitlines()
              for v in json.loads(line)["output"]]
    assert document["max_response_len"] == 16000
    assert document["clip_ratio"] == pytest.approx(np.mean(np.array(values) == 16000))
    assert document["n_sampling"] == 8 and document["dp_ranks"] == 2
    assert document["response"]["family"] in fit.SCIPY_FAMILIES


def test_real_search_r1_multiturn_params(store):
    folder = need_real_data("polytrace", "search_r1")
    ingest_paths(store, [folder])
    document = fit.params_document(store, [ids_of(store, "search_r1")])
    turns = [json.loads(line)["turn_count"] for p in folder.rglob("multiturn_workload_step_*.jsonl")
             for line in p.read_text().splitlines() if line.strip()]
    pmf = document["multiturn"]["turns_pmf"]
    assert sum(pmf.values()) == pytest.approx(1.0)
    for count in set(turns):
        assert pmf[str(count)] == pytest.approx(turns.count(count) / len(turns))
    assert document["multiturn"]["tool_latency_s"]["family"] == "lognorm"
    for node in ("tool_latency_s", "completion_tokens"):
        assert 0 < document["multiturn"][node]["ks"] < 1 and np.isfinite(document["multiturn"][node]["aic"])
    assert document["max_response_len"] == 3000


def test_multiturn_lognormal_node_ks_and_aic_by_hand():
    # ln x = −1, 0, 1: MLE s = sqrt(2/3), scale 1; F(e^x) = Φ(x / s) = 0.1103, 0.5, 0.8897 against the
    # empirical steps 1/3, 2/3, 1: KS = 1/3 − 0.1103 = 0.2230.
    node = fit._lognorm_node(np.exp(np.array([-1.0, 0.0, 1.0])))
    assert node["params"]["s"] == pytest.approx(np.sqrt(2 / 3), rel=1e-4)
    assert node["params"]["scale"] == pytest.approx(1.0, rel=1e-4)
    assert node["ks"] == pytest.approx(0.2230, abs=1e-4)
    # ln L = Σ [−ln x − ln(s·sqrt(2π)) − (ln x)² / (2s²)] = 0 − 3·ln(sqrt(2/3)·sqrt(2π)) − 1.5
    log_likelihood = -3 * np.log(np.sqrt(2 / 3) * np.sqrt(2 * np.pi)) - 1.5
    assert node["aic"] == pytest.approx(4 - 2 * log_likelihood, rel=1e-4)


def test_runs_for_task(store):
    add_run(store, "a", task="code")
    add_run(store, "b", task="math")
    assert fit.runs_for_task(store, "code") == [1]
    with pytest.raises(PolytraceError):
        fit.runs_for_task(store, "video")


def test_params_carry_the_drift_of_a_run_long_enough_for_a_trend(store, tmp_path):
    from polytrace_cli.workload.distributions import LengthModel, Marginal
    from polytrace_cli.workload.synth import WorkloadSpec, synthesize

    model = LengthModel(prompt=Marginal("lognorm", {"s": 0.1, "scale": 100.0}),
                        response=Marginal("lognorm", {"s": 0.2, "scale": 1000.0}))
    synthesize(model, WorkloadSpec(task="t", steps=12, batch=64, n=4, drift=0.03, seed=2), tmp_path / "drifting")
    ingest_paths(store, [tmp_path / "drifting"])
    document = fit.params_document(store, [ids_of(store, "drifting")])
    # Lengths grow by 1.03 a step: the least-squares slope over the mean is about ln 1.03 = 0.0296.
    assert document["drift_per_step"] == pytest.approx(0.0296, rel=0.15)


def test_too_few_values_give_a_reason_not_a_fit(store):
    few = add_run(store, "few")
    add_samples(store, few, step=0, prompts=[100, 120, 130, 150, 170], responses=[900, 1200, 800, 2000, 1500])
    enough, _, _ = seeded_run(store, name="enough", n=fit.MIN_FIT_VALUES)
    assert fit.fit_histogram(fit.histogram(store, [few], StepRange(), "response")) == []
    assert fit.fit_histogram(fit.histogram(store, [enough], StepRange(), "response"))  # 20 values are enough
    rows = {(r["run"], r["kind"]): r for r in fit.summary(store, [few, enough]).to_dicts()}
    short = rows[("few", "response")]
    assert short["family"] is None and short["ks"] is None and short["n_fitted"] == 5
    assert short["note"] == "too few values to fit: 5 (needs 20)"
    assert rows[("enough", "response")]["family"] is not None
    with pytest.raises(PolytraceError, match="has 5 response lengths, too few to fit"):
        fit.params_document(store, [few])
