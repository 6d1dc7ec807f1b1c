"""Fidelity of a synthetic workload: does a workload sampled from a run's fit look like the run?

The run's lengths (training samples only: prompts once per prompt group, responses once per
sample) are compared with a workload of the run's shape (prompts per step, responses per prompt,
DP ranks, cap) over MODEL_DRAW_FACTOR times its steps, written by the generator
(`workload.synth.synthesized`, packed-lengths traces, parsed from their text), and also with direct
independent draws from the length model (`LengthModel.sample`, capped), which separates the fit's
own error from what the generator adds (the grouping of responses by prompt).

Per kind (prompt, response):
- KS: the two-sample Kolmogorov–Smirnov distance sup_x |F_run(x) − F_synth(x)| (scipy `ks_2samp`);
- relative error (synth − run) / run of the mean, p50 and p99 (numpy linear-interpolation
  quantiles) and, for responses, of the clip ratio = share of responses >= the length cap.
A kind passes when KS <= 0.05 and |p99 error| <= 10%.

The KS distance of two samples drawn from one distribution is not 0: `ks_noise` is the 95%
critical value 1.358 · sqrt((n + m) / (n · m)). When it exceeds 0.05 (fewer than about 1,500
lengths on each side) the run is too small to show the target is met, whatever the fit. Both
draws take MODEL_DRAW_FACTOR times as many lengths as the run, so the noise is mostly the run's.
Responses of one prompt are correlated, so with few prompt groups the real noise exceeds ks_noise.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
from scipy import stats

from polytrace_cli.workload.distributions import LengthModel, load_own, read_params_json
from polytrace_cli.workload.synth import WorkloadSpec, synthesized
from polytrace_cli.errors import PolytraceError
from polytrace_cli.store.sql import fetch_first

KS_TARGET = 0.05
P99_TARGET = 0.10
# A response length counts as the evident cap when at least this share of responses sits exactly on the maximum.
EVIDENT_CAP_SHARE = 0.005
KS_CRITICAL_95 = 1.358
MODEL_DRAW_FACTOR = 10


@dataclass(frozen=True)
class RunShape:
    """The shape of a recorded run, as defaults for a synthetic workload of the same size."""

    steps: int
    batch: int
    n: int
    dp_ranks: int
    max_response_len: int | None
    samples: int


def run_lengths(con: duckdb.DuckDBPyConnection, run_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(prompt lengths, one per prompt group; response lengths, one per sample) of the run's training samples."""
    prompts = con.execute(
        """
        SELECT any_value(prompt_len) FROM samples
        WHERE run_id = ? AND validate IS NOT TRUE AND prompt_len IS NOT NULL
        GROUP BY step, coalesce(dp_rank, rank, 0), prompt_idx
        """, [run_id]).fetchnumpy()
    responses = con.execute(
        "SELECT response_len FROM samples WHERE run_id = ? AND validate IS NOT TRUE AND response_len IS NOT NULL",
        [run_id]).fetchnumpy()
    prompt_values = next(iter(prompts.values())).astype(float)
    response_values = next(iter(responses.values())).astype(float)
    if response_values.size == 0:
        raise PolytraceError("the run has no per-sample lengths (only step aggregates?)")
    return prompt_values, response_values


def run_shape(con: duckdb.DuckDBPyConnection, run_id: int, max_response_len: int | None = None) -> RunShape:
    """Steps, prompts per step, responses per prompt, DP ranks and length cap of a run.

    n is the group size most samples sit in; batch = round(samples / (steps × n)), so that the
    synthetic workload has about as many samples as the run. The cap is the given one, else the
    run's recorded `max_response_len`, else the maximum response length when at least 0.5% of
    responses sit exactly on it.
    """
    row = fetch_first(con, """
        WITH s AS (SELECT * FROM samples WHERE run_id = ? AND validate IS NOT TRUE),
             g AS (SELECT step, coalesce(dp_rank, rank, 0) AS dp, prompt_idx, count(*) AS k FROM s GROUP BY ALL)
        SELECT (SELECT count(DISTINCT step) FROM s), (SELECT count(*) FROM s),
               (SELECT arg_max(k, k * cnt) FROM (SELECT k, count(*) AS cnt FROM g GROUP BY k)),
               (SELECT count(DISTINCT coalesce(dp_rank, rank)) FROM s),
               (SELECT max(response_len) FROM s),
               (SELECT count(*) FILTER (WHERE response_len = (SELECT max(response_len) FROM s)) FROM s),
               (SELECT try_cast(json_extract(meta, '$.max_response_len') AS INTEGER) FROM runs WHERE run_id = ?)
        """, [run_id, run_id])
    steps, samples, n, dp_ranks, longest, at_longest, recorded_cap = row
    if not samples:
        raise PolytraceError("the run has no per-sample lengths (only step aggregates?)")
    cap = max_response_len or recorded_cap
    if cap is None and at_longest >= 2 and at_longest / samples >= EVIDENT_CAP_SHARE:
        cap = int(longest)
    n = int(n or 1)
    return RunShape(steps=int(steps), batch=max(1, round(samples / (steps * n))), n=n, dp_ranks=max(1, int(dp_ranks)),
                    max_response_len=cap, samples=int(samples))


def _relative(synthetic: float | None, real: float | None) -> float | None:
    if synthetic is None or real is None or real == 0:
        return None
    return (synthetic - real) / real


def compare_lengths(real: np.ndarray, synthetic: np.ndarray, cap: int | None = None) -> dict:
    """KS distance and relative errors of mean, p50, p99 and (with a cap) clip ratio; pass/fail (module docstring)."""
    real = np.asarray(real, float)
    synthetic = np.asarray(synthetic, float)
    out = {"n_run": int(real.size), "n_synth": int(synthetic.size),
           "ks": float(stats.ks_2samp(real, synthetic).statistic),
           "ks_noise": KS_CRITICAL_95 * float(np.sqrt((real.size + synthetic.size) / (real.size * synthetic.size)))}
    for name, value in (("mean", np.mean), ("p50", lambda x: np.quantile(x, 0.5)), ("p99", lambda x: np.quantile(x, 0.99))):
        run_value, synth_value = float(value(real)), float(value(synthetic))
        out[f"{name}_run"], out[f"{name}_synth"] = run_value, synth_value
        out[f"{name}_error"] = _relative(synth_value, run_value)
    if cap:
        clip_run, clip_synth = float(np.mean(real >= cap)), float(np.mean(synthetic >= cap))
    else:
        clip_run = clip_synth = None
    out.update(clip_run=clip_run, clip_synth=clip_synth, clip_error=_relative(clip_synth, clip_run))
    out["pass"] = bool(out["ks"] <= KS_TARGET and out["p99_error"] is not None and abs(out["p99_error"]) <= P99_TARGET)
    return out


def synthetic_workload_lengths(params: dict, shape: RunShape, seed: int, sampler: str) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and response lengths of a packed workload of `shape`, MODEL_DRAW_FACTOR times its steps,
    drawn by the generator from `params` (`synthesize`'s texts, parsed in memory).

    Without drift: the fit is pooled over the run's steps, so its marginal already holds the
    step-to-step change; drifting the steps apart again would widen the pooled lengths twice."""
    model = load_own(params, sampler)
    spec = WorkloadSpec(task=str(params.get("task") or "run"), steps=shape.steps * MODEL_DRAW_FACTOR,
                        batch=shape.batch, n=shape.n,
                        dp_ranks=shape.dp_ranks, max_response_len=shape.max_response_len,
                        drift=0.0, seed=seed, reward_timings=False)
    texts = "".join(text for name, text, _ in synthesized(model, spec) if name.startswith("packed_lengths_step_"))
    traces = pl.read_ndjson(io.BytesIO(texts.encode()), schema={"input": pl.Int64, "output": pl.List(pl.Int64)})
    return traces["input"].to_numpy().astype(float), traces["output"].explode().to_numpy().astype(float)


def model_draw_lengths(params: dict, shape: RunShape, seed: int, sampler: str,
                       prompt_count: int, response_count: int) -> tuple[np.ndarray, np.ndarray]:
    """Direct draws from the length model: prompt_count prompts and response_count independent responses,
    capped as the generator caps them (`LengthModel.sample`)."""
    model = load_own(params, sampler)
    rng = np.random.default_rng(seed)
    prompts, _ = model.sample(rng, prompt_count)
    _, responses = model.sample(rng, response_count, shape.max_response_len)
    return prompts.astype(float), responses.astype(float)


def fidelity(con: duckdb.DuckDBPyConnection, run_id: int, params: dict, *, seed: int = 0,
             samplers: tuple[str, ...] = ("parametric", "empirical")) -> pl.DataFrame:
    """One row per (sampler, draw, kind): the comparison of `compare_lengths` for the run against its synthesis.

    draw 'workload' goes through the generator with the run's shape (10× the steps); draw 'model' samples the
    length model directly. Samplers missing what they need in `params` (e.g. no empirical
    quantiles) are left out.
    """
    real_prompts, real_responses = run_lengths(con, run_id)
    shape = run_shape(con, run_id, params.get("max_response_len"))
    rows = []
    for sampler in samplers:
        if sampler == "empirical" and not (params.get("empirical") or {}).get("response_quantiles"):
            continue
        draws = {
            "workload": synthetic_workload_lengths(params, shape, seed, sampler),
            "model": model_draw_lengths(params, shape, seed, sampler, MODEL_DRAW_FACTOR * real_prompts.size,
                                        MODEL_DRAW_FACTOR * real_responses.size),
        }
        for draw, (prompts, responses) in draws.items():
            for kind, real, synthetic, cap in (("prompt", real_prompts, prompts, None),
                                               ("response", real_responses, responses, shape.max_response_len)):
                rows.append({"sampler": sampler, "draw": draw, "kind": kind, **compare_lengths(real, synthetic, cap)})
    if not rows:
        raise PolytraceError("the parameters have nothing to sample from")
    return pl.DataFrame(rows)


def read_params(path: str | Path) -> dict:
    """A polytrace-params/1 document from a file; anything else is a user error."""
    document = read_params_json(path)
    if not isinstance(document, dict) or document.get("format") != "polytrace-params/1":
        raise PolytraceError(f"{path} is not a polytrace-params/1 file (written by `polytrace fit`)")
    return document


def fitted_params(con: duckdb.DuckDBPyConnection, run_id: int) -> dict:
    """Fit the run with the fitting library (`analyze.fit.params_document`) and return the parameters document."""
    try:
        from polytrace_cli.analyze.fit import params_document
    except ImportError:
        raise PolytraceError("distribution fitting is not available in this installation; pass --params FILE") from None
    return params_document(con, [run_id])


def workload_from_run(con: duckdb.DuckDBPyConnection, run: str, sampler: str = "parametric",
                      task: str | None = None) -> tuple[LengthModel, WorkloadSpec]:
    """The length model fitted to run `run` and a workload spec of the run's shape (see `run_shape`).

    Multi-turn runs (whose fit carries a multi-turn model) default to multi-turn trajectories, and
    the drift per step is the fitted one.
    """
    from polytrace_cli.store.queries import run_id as run_id_of

    run_id = run_id_of(con, run)
    document = fitted_params(con, run_id)
    model = load_own(document, sampler)
    shape = run_shape(con, run_id, document.get("max_response_len"))
    spec = WorkloadSpec(task=task or document.get("task") or run, steps=shape.steps, batch=shape.batch, n=shape.n,
                        dp_ranks=shape.dp_ranks, max_response_len=shape.max_response_len,
                        drift=float(document.get("drift_per_step") or 0.0), multiturn=bool(model.multiturn))
    return model, spec
