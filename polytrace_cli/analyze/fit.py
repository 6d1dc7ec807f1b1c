"""fit: parametric models of prompt and response lengths, and the `polytrace-params/1` file.

For each kind (prompt, response) of a run, or of several runs pooled (e.g. every run of a task),
maximum-likelihood fits of scipy.stats `lognorm`, `gamma` and `weibull_min` with the location fixed
at 0 (`floc=0`), and a 1-D Gaussian mixture (scikit-learn, extra `polytrace[fit]`; 2 to 4
components, the count with the lowest AIC; skipped with a note when scikit-learn is missing).
Each candidate gets:

    AIC = 2k − 2 ln L          (k free parameters: 2 for the scipy families, 3c − 1 for c components)
    KS  = sup_x |F_n(x) − F(x)| (F_n the empirical CDF)

and the best candidate is the one with the lowest AIC.

A kind with fewer than `MIN_FIT_VALUES` (20) values is not fitted: its summary row has no family and
says why, and `polytrace fit` refuses a run whose responses are that few.

Censoring: when the run has a response length cap (`lengths.caps`: known or evident), responses at
or above it are excluded from the response fit and their share is reported as `clip_ratio`. Lengths
<= 0 cannot be fitted by these families and are left out (`excluded_nonpositive`).

Scale: lengths are read as a histogram (value, count) computed in SQL. ln L and KS are exact over
the full histogram; parameters are estimated on at most `FIT_SAMPLE_LIMIT` systematically chosen
order statistics (the values at ranks (i + ½)·n/m), which keeps a fit on millions of samples to
well under a second and is deterministic. The Gaussian mixture's EM (iterative, three component
counts, k-means++ starts) is run on at most `MIXTURE_SAMPLE_LIMIT` of those order statistics,
chosen the same way.
"""

from __future__ import annotations

import functools
import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
from scipy import stats

from polytrace_cli.analyze.common import ALL_STEPS, StepRange, caps_sql, ids_sql, run_names, samples_sql
from polytrace_cli.analyze.registry import register
from polytrace_cli.errors import PolytraceError

PARAMS_FORMAT = "polytrace-params/1"
FIT_SAMPLE_LIMIT = 20_000
MIXTURE_SAMPLE_LIMIT = 4_000
SCIPY_FAMILIES = ("lognorm", "gamma", "weibull_min")
MIXTURE_COMPONENTS = (2, 3, 4)
JOINT_COMPONENTS = tuple(range(2, 9))
SEED = 0
# Fewer values than this and nothing is fitted: 10 per parameter of the two-parameter families. Below
# it a KS statistic cannot tell the families apart (its 5% critical value at n = 20 is already 0.29).
MIN_FIT_VALUES = 20

CANDIDATE_SCHEMA = {
    "run": pl.String, "kind": pl.String, "family": pl.String, "params": pl.String, "n_fitted": pl.Int64,
    "ks": pl.Float64, "aic": pl.Float64, "best": pl.Boolean, "note": pl.String,
}
SUMMARY_SCHEMA = {
    "run": pl.String, "kind": pl.String, "basis": pl.String, "family": pl.String, "params": pl.String,
    "ks": pl.Float64, "aic": pl.Float64, "n_fitted": pl.Int64, "excluded_at_cap": pl.Int64,
    "excluded_nonpositive": pl.Int64, "cap_tokens": pl.Int64, "clip_ratio": pl.Float64, "candidates": pl.Int64,
    "note": pl.String,
}


@dataclass
class Histogram:
    """Distinct positive values and their counts, plus what was left out."""

    values: np.ndarray
    counts: np.ndarray
    excluded_at_cap: int = 0
    excluded_nonpositive: int = 0
    cap: int | None = None

    @property
    def n(self) -> int:
        return int(self.counts.sum())

    @property
    def clip_ratio(self) -> float | None:
        total = self.n + self.excluded_at_cap
        return self.excluded_at_cap / total if self.cap is not None and total else None

    def systematic_sample(self, limit: int = FIT_SAMPLE_LIMIT) -> np.ndarray:
        """The whole sample when n <= limit, else the order statistics at ranks (i + ½)·n/limit."""
        if self.n <= limit:
            return np.repeat(self.values, self.counts)
        ranks = ((np.arange(limit) + 0.5) * self.n / limit).astype(np.int64)
        return self.values[np.searchsorted(np.cumsum(self.counts), ranks, side="right")]

    def ks(self, cdf) -> float:
        """sup |F_n − F| over the histogram, checking both sides of every jump of F_n."""
        model = cdf(self.values)
        after = np.cumsum(self.counts) / self.n
        before = after - self.counts / self.n
        return float(max(np.max(np.abs(after - model)), np.max(np.abs(model - before))))


@dataclass
class Candidate:
    family: str
    params: dict
    ks: float | None
    aic: float | None
    n_fitted: int
    note: str | None = None

    def as_json(self) -> dict:
        return {"family": self.family, "params": self.params, "ks": self.ks, "aic": self.aic}


def histogram(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange, kind: str) -> Histogram:
    """Histogram of the prompt or response lengths of the step range's split of the samples (training
    by default); responses at or above the
    run's cap are counted in `excluded_at_cap` instead (each run judged against its own cap)."""
    if kind not in ("prompt", "response"):
        raise ValueError(f"kind must be prompt or response, not {kind!r}")
    column = "prompt_len" if kind == "prompt" else "response_len"
    at_cap = "s.response_len >= c.cap_tokens" if kind == "response" else "false"
    sql = f"""
        WITH c AS ({caps_sql(run_ids)}), s AS ({samples_sql(run_ids, steps)})
        SELECT CASE WHEN coalesce({at_cap}, false) THEN 'cap' WHEN {column} <= 0 THEN 'nonpositive' ELSE 'ok' END AS what,
               {column} AS value, count(*) AS n
        FROM s JOIN c ON s.run_id = c.run_id
        WHERE {column} IS NOT NULL GROUP BY ALL ORDER BY value
    """
    rows = con.execute(sql).fetchall()
    caps = [row[0] for row in con.execute(f"SELECT cap_tokens FROM ({caps_sql(run_ids)})").fetchall()]
    ok = [(v, n) for what, v, n in rows if what == "ok"]
    cap = max((c for c in caps if c is not None), default=None) if kind == "response" else None
    return Histogram(
        values=np.array([v for v, _ in ok], dtype=float), counts=np.array([n for _, n in ok], dtype=np.int64),
        excluded_at_cap=sum(n for what, _, n in rows if what == "cap"),
        excluded_nonpositive=sum(n for what, _, n in rows if what == "nonpositive"), cap=cap)


def run_histograms(con: duckdb.DuckDBPyConnection, run_ids: list[int],
                   steps: StepRange = ALL_STEPS) -> dict[tuple[int, str], Histogram]:
    """`histogram(con, [run_id], steps, kind)` for every run and kind, keyed (run_id, kind), read in one
    query (the per-run reads each scanned the samples again for the run's cap)."""
    sql = f"""
        WITH c AS ({caps_sql(run_ids)}), s AS ({samples_sql(run_ids, steps)}),
        v AS (
            SELECT s.run_id, 'prompt' AS kind, s.prompt_len AS value, false AS at_cap
            FROM s JOIN c ON s.run_id = c.run_id
            UNION ALL
            SELECT s.run_id, 'response', s.response_len, coalesce(s.response_len >= c.cap_tokens, false)
            FROM s JOIN c ON s.run_id = c.run_id
        )
        SELECT run_id, kind, CASE WHEN at_cap THEN 'cap' WHEN value <= 0 THEN 'nonpositive' ELSE 'ok' END AS what,
               value, count(*) AS n
        FROM v WHERE value IS NOT NULL GROUP BY ALL ORDER BY run_id, kind, value
    """
    rows = con.execute(sql).fetchnumpy()
    caps = dict(con.execute(f"SELECT run_id, cap_tokens FROM ({caps_sql(run_ids)})").fetchall())
    out = {}
    for run_id in run_ids:
        for kind in ("prompt", "response"):
            mine = (rows["run_id"] == run_id) & (rows["kind"] == kind)
            what, values, counts = rows["what"][mine], rows["value"][mine], rows["n"][mine]
            ok = what == "ok"
            out[(run_id, kind)] = Histogram(
                values=values[ok].astype(float), counts=counts[ok].astype(np.int64),
                excluded_at_cap=int(counts[what == "cap"].sum()),
                excluded_nonpositive=int(counts[what == "nonpositive"].sum()),
                cap=caps.get(run_id) if kind == "response" else None)
    return out


def _fit_scipy(family: str, hist: Histogram, sample: np.ndarray) -> Candidate:
    distribution = getattr(stats, family)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        fitted = distribution.fit(sample, floc=0)
    names = (distribution.shapes.split(", ") if distribution.shapes else []) + ["loc", "scale"]
    params = {name: float(value) for name, value in zip(names, fitted)}
    frozen = distribution(*fitted)
    log_likelihood = float(np.sum(hist.counts * frozen.logpdf(hist.values)))
    aic = 2 * 2 - 2 * log_likelihood if math.isfinite(log_likelihood) else None
    return Candidate(family, params, hist.ks(frozen.cdf), aic, hist.n)


@functools.cache
def _thread_pools():
    """threadpoolctl's handle on the BLAS and OpenMP pools loaded in this process, found once (after
    scikit-learn is imported): finding them walks every loaded library, a few milliseconds a time."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def _one_thread():
    """A context in which BLAS and OpenMP run one thread: on these small matrices more threads only
    spin (a mixture fit took 2.5x as long with two on two cores)."""
    return _thread_pools().limit(limits=1)


def _fit_mixture(hist: Histogram, sample: np.ndarray) -> Candidate:
    try:
        from sklearn.mixture import GaussianMixture
    except ImportError:
        return Candidate("gaussian_mixture", {}, None, None, hist.n,
                         note="scikit-learn is not installed (pip install 'polytrace[fit]'): mixture skipped")
    best: Candidate | None = None
    column = sample.reshape(-1, 1)
    distinct = len(np.unique(sample))
    for components in MIXTURE_COMPONENTS:
        if distinct <= components:
            continue
        with _one_thread():
            model = GaussianMixture(components, init_params="k-means++", random_state=SEED).fit(column)
        log_likelihood = float(np.sum(hist.counts * model.score_samples(hist.values.reshape(-1, 1))))
        aic = 2 * (3 * components - 1) - 2 * log_likelihood
        weights, means = model.weights_, model.means_[:, 0]
        sds = np.sqrt(model.covariances_.reshape(components))

        def cdf(x, w=weights, m=means, s=sds):
            return np.sum(w * stats.norm.cdf((np.asarray(x)[:, None] - m) / s), axis=1)

        candidate = Candidate("gaussian_mixture", {"weights": weights.tolist(), "means": means.tolist(),
                                                   "stds": sds.tolist()}, hist.ks(cdf), aic, hist.n)
        if best is None or candidate.aic < best.aic:
            best = candidate
    return best or Candidate("gaussian_mixture", {}, None, None, hist.n, note="too few distinct values for a mixture")


def too_few_note(count: int) -> str:
    """Why a kind with `count` values has no fit."""
    return f"too few values to fit: {count} (needs {MIN_FIT_VALUES})"


def fit_histogram(hist: Histogram) -> list[Candidate]:
    """Every candidate fitted to a histogram (see module docstring); empty with fewer than
    MIN_FIT_VALUES values or fewer than two distinct ones."""
    if hist.n < MIN_FIT_VALUES or len(hist.values) < 2:
        return []
    sample = hist.systematic_sample()
    return [*(_fit_scipy(family, hist, sample) for family in SCIPY_FAMILIES),
            _fit_mixture(hist, hist.systematic_sample(MIXTURE_SAMPLE_LIMIT))]


def best_of(candidates: list[Candidate], families: tuple[str, ...] | None = None) -> Candidate | None:
    """The candidate with the lowest AIC (optionally only among `families`)."""
    usable = [c for c in candidates if c.aic is not None and (families is None or c.family in families)]
    return min(usable, key=lambda c: c.aic) if usable else None


def candidates(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """Per run and kind: every fitted candidate with its parameters (JSON), KS, AIC and whether it is best."""
    rows = []
    histograms = run_histograms(con, run_ids, steps)
    for run_id, name in sorted(run_names(con, run_ids).items()):
        for kind in ("prompt", "response"):
            fitted = fit_histogram(histograms[(run_id, kind)])
            best = best_of(fitted)
            rows += [{"run": name, "kind": kind, "family": c.family, "params": json.dumps(c.params), "n_fitted": c.n_fitted,
                      "ks": c.ks, "aic": c.aic, "best": c is best, "note": c.note} for c in fitted]
    return pl.DataFrame(rows, schema=CANDIDATE_SCHEMA)


@register("fit", "MLE fits of prompt/response lengths (lognormal, gamma, Weibull, Gaussian mixture): KS, AIC, best")
def summary(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> pl.DataFrame:
    """One row per run × kind: the best candidate by AIC with its parameters, KS and AIC, the number of
    values fitted, those excluded at the cap or as non-positive, the cap and clip ratio. A kind with
    values but fewer than MIN_FIT_VALUES has a row without a family, its note saying so."""
    rows = []
    histograms = run_histograms(con, run_ids, steps)
    for run_id, name in sorted(run_names(con, run_ids).items()):
        for kind in ("prompt", "response"):
            hist = histograms[(run_id, kind)]
            fitted = fit_histogram(hist)
            best = best_of(fitted)
            if best is None and 0 < hist.n < MIN_FIT_VALUES:
                rows.append({"run": name, "kind": kind, "basis": "samples", "n_fitted": hist.n,
                             "excluded_at_cap": hist.excluded_at_cap, "excluded_nonpositive": hist.excluded_nonpositive,
                             "cap_tokens": hist.cap, "clip_ratio": hist.clip_ratio, "candidates": 0,
                             "note": too_few_note(hist.n)})
                continue
            if best is None:
                continue
            notes = [c.note for c in fitted if c.note]
            rows.append({"run": name, "kind": kind, "basis": "samples", "family": best.family,
                         "params": json.dumps(best.params), "ks": best.ks, "aic": best.aic, "n_fitted": hist.n,
                         "excluded_at_cap": hist.excluded_at_cap, "excluded_nonpositive": hist.excluded_nonpositive,
                         "cap_tokens": hist.cap, "clip_ratio": hist.clip_ratio,
                         "candidates": sum(c.aic is not None for c in fitted), "note": "; ".join(notes) or None})
    return pl.DataFrame(rows, schema=SUMMARY_SCHEMA)


def runs_for_task(con: duckdb.DuckDBPyConnection, task: str) -> list[int]:
    """Ids of every run whose task is `task` (an error when there is none)."""
    ids = [row[0] for row in con.execute("SELECT run_id FROM runs WHERE task = ? ORDER BY run_id", [task]).fetchall()]
    if not ids:
        raise PolytraceError(f"no run has task {task!r}")
    return ids


def _joint_mixture(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange) -> dict | None:
    """A 2-D Gaussian mixture over (ln prompt, ln response) of the uncensored pairs, fitted on at most
    FIT_SAMPLE_LIMIT pairs chosen by a hash of their identity (deterministic). The component count
    is the one of JOINT_COMPONENTS with the lowest AIC = 2k − 2 ln L (k = 6c − 1 free parameters
    for c full-covariance components), among counts with at least 10 pairs per component.
    Log space keeps drawn lengths positive and follows the long right tail of response lengths."""
    try:
        from sklearn.mixture import GaussianMixture
    except ImportError:
        return None
    sql = f"""
        WITH c AS ({caps_sql(run_ids)}), s AS ({samples_sql(run_ids, steps)})
        SELECT prompt_len, response_len FROM s JOIN c ON s.run_id = c.run_id
        WHERE prompt_len > 0 AND response_len > 0 AND NOT coalesce(response_len >= c.cap_tokens, false)
        ORDER BY hash(s.run_id, s.step, s.dp_rank, s.rank, s.prompt_idx, s.sample_idx, s.prompt_len, s.response_len)
        LIMIT {FIT_SAMPLE_LIMIT}
    """
    pairs = np.log(np.array(con.execute(sql).fetchall(), dtype=float).reshape(-1, 2))
    best = None
    for components in JOINT_COMPONENTS:
        if len(pairs) < 10 * components:
            break
        with _one_thread():
            model = GaussianMixture(components, covariance_type="full", random_state=SEED).fit(pairs)
        aic = float(model.aic(pairs))
        if best is None or aic < best[0]:
            best = (aic, model)
    if best is None:
        return None
    aic, model = best
    return {"family": "gaussian_mixture", "space": "log", "components": len(model.weights_), "aic": aic,
            "weights": model.weights_.tolist(), "means": model.means_.tolist(),
            "covariances": model.covariances_.tolist()}


def _empirical_quantiles(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange) -> dict | None:
    """1,001 quantiles (q = 0, 0.001, ..., 1) of prompt and of response lengths, capped values included
    so that sampling them reproduces the clip share."""
    grid = [i / 1000 for i in range(1001)]
    row = con.execute(
        f"SELECT quantile_cont(prompt_len, {grid}), quantile_cont(response_len, {grid}) "
        f"FROM ({samples_sql(run_ids, steps)})"
    ).fetchall()[0]
    if row[0] is None or row[1] is None:
        return None
    return {"prompt_quantiles": [float(v) for v in row[0]], "response_quantiles": [float(v) for v in row[1]]}


def _lognorm_node(values: np.ndarray) -> dict | None:
    """Lognormal MLE (loc 0) of the positive values with its KS = sup |F_n − F| and AIC = 2·2 − 2 ln L."""
    values = values[values > 0]
    if len(values) < 2 or len(np.unique(values)) < 2:
        return None
    s, loc, scale = stats.lognorm.fit(values, floc=0)
    frozen = stats.lognorm(s, loc, scale)
    return {"family": "lognorm", "params": {"s": float(s), "loc": float(loc), "scale": float(scale)},
            "ks": float(stats.kstest(values, frozen.cdf).statistic), "aic": float(4 - 2 * np.sum(frozen.logpdf(values))),
            "n_fitted": int(len(values))}


def _multiturn(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange) -> dict | None:
    """Turns-per-trajectory pmf, and lognormal fits of tool latency (s) and completion tokens per turn."""
    ids, step_sql = ids_sql(run_ids), steps.sql("step")
    turns = con.execute(f"SELECT turns, count(*) FROM ({samples_sql(run_ids, steps)}) "
                        "WHERE turns IS NOT NULL AND turns > 0 GROUP BY turns ORDER BY turns").fetchall()
    if not turns:
        return None
    total = sum(n for _, n in turns)
    latency = np.array([r[0] for r in con.execute(
        f"SELECT latency_s FROM tool_calls WHERE run_id IN {ids} AND {step_sql} AND latency_s > 0").fetchall()], float)
    completion = np.array([r[0] for r in con.execute(
        f"SELECT completion_tokens FROM turns WHERE run_id IN {ids} AND {step_sql} AND completion_tokens > 0"
    ).fetchall()], float)
    return {"turns_pmf": {str(t): n / total for t, n in turns}, "tool_latency_s": _lognorm_node(latency),
            "completion_tokens": _lognorm_node(completion)}


def params_document(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange = ALL_STEPS) -> dict:
    """The `polytrace-params/1` document of one run or several pooled (e.g. a task).

    `prompt`/`response` hold the best scipy family by AIC (so any scipy-based sampler can draw from
    them); `candidates` every fit including the Gaussian mixture; `joint` a 2-D mixture over
    (ln prompt, ln response); `empirical` 1,001 quantiles; `drift_per_step` the mean over the runs of the
    drift analysis' relative slope (slope / mean response length), null when no run has enough steps
    with data for a trend; `notes` what was skipped (e.g.
    the mixtures without scikit-learn, when `joint` is null and the marginals are sampled); absent
    parts are null.
    """
    from polytrace_cli.analyze import drift

    names = run_names(con, run_ids)
    if not names:
        raise PolytraceError("no runs to fit")
    meta_rows = con.execute(f"SELECT task, meta FROM runs WHERE run_id IN {ids_sql(run_ids)} ORDER BY run_id").fetchall()
    metas = [json.loads(meta or "{}") for _, meta in meta_rows]
    tasks = sorted({task for task, _ in meta_rows if task})
    document: dict = {"format": PARAMS_FORMAT, "task": tasks[0] if len(tasks) == 1 else None,
                      "source_run": ",".join(names[i] for i in sorted(names))}
    fitted: dict[str, list[Candidate]] = {}
    hists: dict[str, Histogram] = {}
    for kind in ("prompt", "response"):
        hists[kind] = histogram(con, run_ids, steps, kind)
        fitted[kind] = fit_histogram(hists[kind])
        best = best_of(fitted[kind], SCIPY_FAMILIES)
        document[kind] = best.as_json() if best else None
    if not fitted["response"]:
        if 0 < hists["response"].n < MIN_FIT_VALUES:
            raise PolytraceError(f"run {document['source_run']} has {hists['response'].n} response lengths, too few "
                                 f"to fit (a fit needs {MIN_FIT_VALUES})")
        raise PolytraceError(f"run {document['source_run']} has no per-sample lengths to fit")
    document["candidates"] = {kind: [c.as_json() for c in fitted[kind] if c.aic is not None] for kind in fitted}
    document["joint"] = _joint_mixture(con, run_ids, steps)
    document["notes"] = sorted({c.note for kind in fitted for c in fitted[kind] if c.note}) or None
    document["empirical"] = _empirical_quantiles(con, run_ids, steps)
    document["max_response_len"] = hists["response"].cap
    document["clip_ratio"] = hists["response"].clip_ratio
    n_sampling = [m["n_sampling"] for m in metas if m.get("n_sampling")]
    document["n_sampling"] = max(n_sampling) if n_sampling else None
    dp = [m.get("dp_size") or m.get("dp_ranks") or m.get("dp_ranks_seen") for m in metas]
    dp = [d for d in dp if d]
    if not dp:
        counted = con.execute(f"SELECT count(DISTINCT dp_rank) FROM samples WHERE run_id IN {ids_sql(run_ids)}").fetchall()[0][0]
        dp = [counted] if counted else []
    document["dp_ranks"] = max(dp) if dp else None
    document["multiturn"] = _multiturn(con, run_ids, steps)
    # A drift is fitted only where the drift analysis shows a trend (enough steps with data).
    trends = drift.summary(con, run_ids, steps)
    slopes = [s for s in trends["relative_slope_per_step"].to_list() if s is not None]
    document["drift_per_step"] = float(np.mean(slopes)) if slopes else None
    if not slopes and trends.height:
        withheld = [f"drift_per_step is null: {note}" for note in trends["note"].to_list() if note]
        document["notes"] = sorted({*(document["notes"] or []), *withheld}) or document["notes"]
    return document


def write_params(con: duckdb.DuckDBPyConnection, run_id: int | list[int], path: str | Path,
                 steps: StepRange = ALL_STEPS) -> dict:
    """Write the `polytrace-params/1` JSON of a run (or of several runs pooled) to `path`; returns it."""
    run_ids = [run_id] if isinstance(run_id, int) else list(run_id)
    document = params_document(con, run_ids, steps)
    Path(path).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return document

