"""The verdict of a comparison at matched workload: `regression`, `improvement`, `no change` or `inconclusive`.

A run's workload drifts as its policy learns (longer responses, more validation), so a raw step-time
difference is no verdict on the code that ran it. The verdict judges each stage's efficiency instead,
the quantity `explain --against` calls efficiency (`diagnose.against`): with f_k^A and f_k^B the two
sides' lines of stage k and W̃ = (W̄_A + W̄_B) / 2 the two sides' mean workload,

    Δ_k = f_k^B(W̃) − f_k^A(W̃)         seconds stage k takes more at the same workload
    E   = Σ_k Δ_k,  T_A = Σ_k f_k^A(W̃)  efficiency = E / T_A (the step's change at the same workload)

over the stages both sides time with a workload line (weight sync included; testing and checkpoint
are overheads, reported apart with the workload).

Lines and intervals: each stage's line is refitted on each side's training steps (those its model was
fitted on) by weighted least squares with Huber weights (five reweightings at the fit's robust scale;
terms borrowed from the other side kept fixed), and Δ_k is that refit at W̃. It can differ a little
from `explain --against`'s bounded soft-L1 fit, whose cost per token at its bound of 0 would not be the
centre of the draws below. The interval is a bootstrap over steps: each side's training steps are
drawn with replacement `resamples` times, the same draw for every stage of the side, the line refitted
on each draw with the same weights; σ, the standard deviation of the draws of Δ_k, gives Δ_k ± z · σ,
for E at 95% (z = 1.96) and per stage at 1 − 0.1% / K over the K stages judged (Bonferroni: the stages
together raise a false alarm at most 0.1% of the time when nothing changed and σ is right; the draws
of a line extrapolated from little within-run variation of its workload understate σ, hence the
margin).

Verdict, in order:
- `inconclusive` when the sides do not compare (`diagnose.comparable`: framework, critic, estimator,
  model, GPU count or timed stages differ), when either side has fewer than MIN_TRAINING_STEPS training
  steps, when a feature of a stage's line varied over neither side's steps but sits at different
  levels (its cost cannot be told from the stage's efficiency), when a stage holding at least 5% of T_A does not fit a side's steps (its robust residual
  scale above MAX_SCATTER of its median seconds), or when no stage is decided and E's interval is
  wider than ±MAX_HALF_WIDTH of T_A (the steps scatter too much to tell);
- `regression` when some stage is slower: its interval lies above 0 and Δ_k is at least its floor,
  max(MIN_STAGE_CHANGE · f_k^A(W̃), MIN_STEP_SHARE · T_A); the stage carrying the most seconds names it;
- `improvement` when some stage is faster by the same rule and none is slower;
- `no change` otherwise; but `inconclusive` when E's 99% interval excludes 0 though no stage is decided
  (the step changed at the same workload, and no stage's change is sure).

The workload difference (token volume, long tail, DP imbalance, GPU count) and the overheads
(validation, checkpoint, warm-up) of the same comparison are reported apart: seconds per step that
are not a verdict on efficiency.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polytrace_cli.diagnose.against import OVERHEAD_CAUSES, WORKLOAD_CAUSES, Comparison, Side
from polytrace_cli.diagnose.comparable import Comparability, percent_text, relative_change
from polytrace_cli.diagnose.explain import MIN_TRAINING_STEPS
from polytrace_cli.display import duration
from polytrace_cli.model import stage_seconds
from polytrace_cli.model.fit import values_or

REGRESSION, IMPROVEMENT, NO_CHANGE, INCONCLUSIVE = "regression", "improvement", "no change", "inconclusive"
VERDICTS = (REGRESSION, IMPROVEMENT, NO_CHANGE, INCONCLUSIVE)
CONFIDENCE = 0.95
# The stages' calls together are wrong at most 1 − STAGE_CONFIDENCE of the time (Bonferroni over the stages).
STAGE_CONFIDENCE = 0.999
# With no stage decided, an efficiency whose interval at this confidence excludes 0 is no "no change".
SURE_CONFIDENCE = 0.99
RESAMPLES = 400
SEED = 0
# A stage's change counts when at least this share of its seconds at the same workload...
MIN_STAGE_CHANGE = 0.02
# ... and at least this share of A's modelled step.
MIN_STEP_SHARE = 0.0005
# "no change" needs E's interval within ± this share of T_A.
MAX_HALF_WIDTH = 0.02
# A stage holding at least FIT_STAGE_SHARE of T_A does not fit when its residual scale exceeds this share
# of its median seconds.
MAX_SCATTER, FIT_STAGE_SHARE = 0.5, 0.05
HUBER_K, REWEIGHTINGS = 1.345, 5


@dataclass(frozen=True)
class StageEfficiency:
    """One stage at the same workload: A's and B's seconds, Δ with its interval, and its call
    (slower, faster, same, or unsure when the interval holds 0 but also a change above the floor)."""

    stage: str
    a_s: float
    b_s: float
    seconds: float
    low_s: float
    high_s: float
    floor_s: float
    call: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values; `change` is seconds / a_s (null over a base near zero)."""
        return {"stage": self.stage, "a_s": self.a_s, "b_s": self.b_s, "seconds": self.seconds,
                "change": relative_change(self.b_s, self.a_s, self.floor_s), "low_s": self.low_s,
                "high_s": self.high_s, "call": self.call}


@dataclass
class EfficiencyVerdict:
    """The verdict of a comparison (see the module docstring)."""

    verdict: str
    reasons: list[str]
    a: str
    b: str
    stage: str | None = None
    seconds: float | None = None
    efficiency_s: float | None = None
    low_s: float | None = None
    high_s: float | None = None
    a_s: float | None = None
    stages: list[StageEfficiency] = field(default_factory=list)
    workload: list[dict] = field(default_factory=list)
    comparability: Comparability | None = None
    resamples: int = RESAMPLES

    @property
    def efficiency(self) -> float | None:
        """E / T_A: the step's change at the same workload (0.05 is 5% slower); None without a model."""
        if self.efficiency_s is None or not self.a_s:
            return None
        return self.efficiency_s / self.a_s

    @property
    def interval(self) -> tuple[float, float] | None:
        """E's 95% interval as shares of T_A."""
        if self.low_s is None or self.high_s is None or not self.a_s:
            return None
        return self.low_s / self.a_s, self.high_s / self.a_s

    def headline(self) -> str:
        """One line: the verdict, the stage and seconds that carry it, the efficiency at the same workload."""
        if self.verdict == INCONCLUSIVE:
            return f"inconclusive: {'; '.join(self.reasons)}"
        share = self.efficiency
        low, high = self.interval
        at_same = (f"at the same workload {self.b}'s step takes {share:+.1%} against {self.a}'s "
                   f"({CONFIDENCE:.0%} interval {low:+.1%} to {high:+.1%})").replace("-", "−")
        if self.verdict == NO_CHANGE:
            return f"no change: {at_same}"
        carrying = next(s for s in self.stages if s.stage == self.stage)
        change = percent_text(relative_change(carrying.b_s, carrying.a_s, carrying.floor_s))
        return (f"{self.verdict}: {self.stage} {'+' if carrying.seconds >= 0 else '−'}"
                f"{duration(abs(carrying.seconds))} per step{change} at the same workload; {at_same}")

    def to_dict(self) -> dict[str, Any]:
        """The verdict as JSON-ready values (`check --json`'s `baseline.verdict` document)."""
        interval = self.interval
        return {"verdict": self.verdict, "reasons": self.reasons, "headline": self.headline(),
                "stage": self.stage, "seconds": self.seconds, "efficiency": self.efficiency,
                "efficiency_s": self.efficiency_s, "low": None if interval is None else interval[0],
                "high": None if interval is None else interval[1], "low_s": self.low_s, "high_s": self.high_s,
                "a_at_same_workload_s": self.a_s, "confidence": CONFIDENCE, "resamples": self.resamples,
                "stages": [s.to_dict() for s in self.stages], "workload": self.workload,
                "comparable": None if self.comparability is None else self.comparability.to_dict()}


def inconclusive(a: str, b: str, reasons: list[str], comparability: Comparability | None = None) -> EfficiencyVerdict:
    """An `inconclusive` verdict with its reasons (no model, or sides that do not compare)."""
    return EfficiencyVerdict(INCONCLUSIVE, reasons, a, b, comparability=comparability)


def common_workload(a: Side, b: Side) -> dict[str, float]:
    """W̃ = (W̄_A + W̄_B) / 2 per feature, a feature one side lacks at the other's level (as
    `explain --against`'s efficiency terms take it)."""
    out = {}
    for feature in set(a.workload) | set(b.workload):
        wa, wb = a.workload.get(feature, np.nan), b.workload.get(feature, np.nan)
        wa, wb = (wa if np.isfinite(wa) else wb), (wb if np.isfinite(wb) else wa)
        if np.isfinite(wa):
            out[feature] = (wa + wb) / 2
    return out


def judged_stages(a: Side, b: Side) -> list[str]:
    """The stages both sides time with a line, in A's order."""
    return [stage for stage in a.lines if stage in b.lines]


def _draw_weights(n: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(resamples + 1) × n multiplicities: row 0 the full sample, each other row a draw with replacement."""
    counts = np.ones((resamples + 1, n))
    if n:
        draws = rng.integers(0, n, size=(resamples, n))
        counts[1:] = np.stack([np.bincount(row, minlength=n) for row in draws])
    return counts


def _huber_predictions(x: np.ndarray, y: np.ndarray, counts: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Per row of `counts` (multiplicities of the rows of x, y), the Huber-weighted least-squares line
    of y on [1, x] evaluated at `target` (see the module docstring). Rows with a missing y weigh 0."""
    valid = np.isfinite(y) & np.all(np.isfinite(x), axis=1)
    y = np.where(valid, y, 0.0)
    x = np.where(np.isfinite(x), x, 0.0)
    scales = np.maximum(np.max(np.abs(x), axis=0), 1e-12) if x.shape[1] else np.ones(0)
    design = np.column_stack([np.ones(len(y)), x / scales])
    point = np.concatenate([[1.0], target / scales])
    # A vanishing ridge keeps a draw whose features happen not to vary solvable (its prediction at the
    # mean workload is unaffected).
    ridge = np.eye(design.shape[1]) * 1e-9 * max(len(y), 1)

    p = design.shape[1]
    # Per row its outer product and its moment, so that every draw's normal equations are one matrix product.
    outer = (design[:, :, None] * design[:, None, :]).reshape(len(y), p * p)
    moments = design * y[:, None]

    def solve(weights: np.ndarray) -> np.ndarray:
        gram = (weights @ outer).reshape(-1, p, p) + ridge
        return np.linalg.solve(gram, (weights @ moments)[..., None])[..., 0]

    # The Huber weights come from the full sample (index 0 of counts), reweighted REWEIGHTINGS times; every
    # draw is then the weighted least squares with those weights times its multiplicities.
    valid_weights = valid.astype(float)
    beta = solve(valid_weights[None, :])[0]
    full = y[valid] - design[valid] @ beta
    scale = max(1.4826 * float(np.median(np.abs(full - np.median(full)))) if full.size else 0.0, 1e-9)
    huber = valid_weights
    for _ in range(REWEIGHTINGS):
        ratio = np.abs(y - design @ beta) / (HUBER_K * scale)
        huber = valid_weights * np.where(ratio <= 1.0, 1.0, 1.0 / np.maximum(ratio, 1e-12))
        beta = solve(huber[None, :])[0]
    beta = solve(counts * huber)
    return beta @ point


def _stage_draws(side: Side, stages: list[str], target: dict[str, float], resamples: int,
                 rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Per stage, its line at `target` refitted on each draw of the side's training steps (index 0: the
    full sample); terms borrowed from the other side stay fixed."""
    model = side.model
    frame = model.frame
    train = model.training.fill_null(False).to_numpy() if model.training.len() == frame.height \
        else np.ones(frame.height, dtype=bool)
    rows = frame.filter(train)
    actual = stage_seconds(rows)
    counts = _draw_weights(rows.height, resamples, rng)
    out = {}
    for stage in stages:
        own = model.stages[stage].coefficients if stage in model.stages else {}
        borrowed = {f: c for f, c in side.lines[stage][1].items() if f not in own}
        y = actual.get(stage, np.full(rows.height, np.nan)).astype(float)
        fixed = sum((c * target.get(f, model.typical.get(f, 0.0)) for f, c in borrowed.items()), 0.0)
        for feature, coefficient in borrowed.items():
            y = y - coefficient * values_or(rows[feature], model.typical.get(feature, 0.0))
        features = list(own)
        x = np.column_stack([values_or(rows[f], model.typical.get(f, 0.0)) for f in features]) if features \
            else np.empty((rows.height, 0))
        point = np.array([target.get(f, model.typical.get(f, 0.0)) for f in features])
        out[stage] = _huber_predictions(x, y, counts, point) + fixed
    return out


def _interval(point: float, draws: np.ndarray, alpha: float) -> tuple[float, float]:
    """point ± z_{1−α/2} · σ, σ the standard deviation of the draws (index 0, the full sample, left out)."""
    from statistics import NormalDist

    spread = float(np.std(draws[1:], ddof=1)) if draws.size > 2 else 0.0
    z = NormalDist().inv_cdf(1 - alpha / 2)
    return float(point - z * spread), float(point + z * spread)


def _fit_problems(comparison: Comparison, stages: list[str], at_same: dict[str, float], total: float) -> list[str]:
    problems = []
    for side in (comparison.a, comparison.b):
        actual = stage_seconds(side.model.frame.filter(side.model.training))
        for stage in stages:
            fit = side.model.stages.get(stage)
            seconds = actual.get(stage)
            if fit is None or seconds is None or at_same[stage] < FIT_STAGE_SHARE * total:
                continue
            typical = float(np.nanmedian(seconds)) if np.isfinite(seconds).any() else 0.0
            if typical > 0 and fit.scale_s > MAX_SCATTER * typical:
                problems.append(f"{stage}'s line does not fit {side.label}'s steps (their scatter around it is "
                                f"{fit.scale_s / typical:.0%} of its {duration(typical)})")
    return problems


def _confounded(a: Side, b: Side, stages: list[str]) -> list[str]:
    """A feature of a stage's line that varied over neither side's steps, at levels that differ by more than
    1% (the longest response at the cap in one run and at 0.7 × the cap in the other): its cost cannot be
    told apart from the stage's efficiency."""
    from polytrace_cli.diagnose.against import FEATURE_UNIT

    problems = []
    for stage in stages:
        neither = (set(a.lines[stage][2]) & set(b.lines[stage][2])) - set(a.lines[stage][1]) - set(b.lines[stage][1])
        for feature in sorted(neither):
            wa, wb = a.workload.get(feature, np.nan), b.workload.get(feature, np.nan)
            if np.isfinite(wa) and np.isfinite(wb) and abs(wb - wa) > 0.01 * max(abs(wa), abs(wb)):
                problems.append(f"{feature} did not vary over either side's steps ({wb:,.0f} against {wa:,.0f} "
                                f"per step): the cost per {FEATURE_UNIT.get(feature, feature)} cannot be told "
                                f"apart from {stage}'s efficiency")
    return problems


def _workload_lines(comparison: Comparison) -> list[dict]:
    a, b = comparison.a, comparison.b
    rows = []
    for cause in comparison.causes:
        if cause["cause"] not in (*WORKLOAD_CAUSES, *OVERHEAD_CAUSES) or abs(cause["seconds"]) < 0.005 * a.step_s:
            continue
        what = {"token_volume": "token volume", "long_tail": "long tail", "dp_imbalance": "DP imbalance",
                "gpu_count": "GPU count"}.get(cause["cause"], cause["cause"])
        if cause["cause"] == "token_volume":
            said = []
            for feature, name in (("response_tokens", "response tokens"), ("total_tokens", "all tokens")):
                change = relative_change(b.workload.get(feature, np.nan), a.workload.get(feature, np.nan), 1.0)
                if change is not None:
                    said.append(f"{name} {change:+.0%}".replace("-", "−"))
            what = f"token volume ({', '.join(said)})" if said else what
        elif cause["cause"] == "long_tail":
            change = relative_change(b.workload.get("r_max", np.nan), a.workload.get("r_max", np.nan), 1.0)
            if change is not None:
                what = f"longest response {change:+.0%}".replace("-", "−")
        kind = "workload" if cause["cause"] in WORKLOAD_CAUSES else "overhead"
        seconds = cause["seconds"]
        rows.append({"cause": cause["cause"], "stage": cause["stage"], "seconds": seconds, "kind": kind,
                     "text": f"{what}: {'+' if seconds >= 0 else '−'}{duration(abs(seconds))} per step, {kind}, "
                             "not a regression" if seconds > 0 else
                             f"{what}: −{duration(abs(seconds))} per step, {kind}, not an improvement"})
    return rows


def judge(comparison: Comparison, resamples: int = RESAMPLES, seed: int = SEED) -> EfficiencyVerdict:
    """The verdict of a comparison (see the module docstring); the bootstrap is seeded, so the same
    comparison gives the same verdict."""
    a, b = comparison.a, comparison.b
    guard = comparison.comparability
    workload = _workload_lines(comparison)
    reasons = list(guard.reasons) if guard is not None and not guard.comparable else []
    for side in (a, b):
        trained = int(side.model.training.fill_null(False).sum())
        if trained < MIN_TRAINING_STEPS:
            reasons.append(f"{side.label} has {trained} training steps; a verdict needs {MIN_TRAINING_STEPS}")
    stages = judged_stages(a, b)
    if not stages:
        reasons.append("the two sides time no stage in common")
    if reasons:
        verdict = inconclusive(a.label, b.label, reasons, guard)
        verdict.workload = workload
        return verdict
    target = common_workload(a, b)
    rng = np.random.default_rng(seed)
    draws_a = _stage_draws(a, stages, target, resamples, rng)
    draws_b = _stage_draws(b, stages, target, resamples, rng)
    # The point is the refit on all steps (draw 0), the estimator the draws repeat: a bounded fit at its
    # bound (a cost per token fitted as 0) would sit off the draws' centre.
    at_a = {stage: float(draws_a[stage][0]) for stage in stages}
    at_b = {stage: float(draws_b[stage][0]) for stage in stages}
    total = sum(at_a.values())
    alpha = (1 - STAGE_CONFIDENCE) / len(stages)
    judged = []
    for stage in stages:
        delta = at_b[stage] - at_a[stage]
        low, high = _interval(delta, draws_b[stage] - draws_a[stage], alpha)
        floor = max(MIN_STAGE_CHANGE * abs(at_a[stage]), MIN_STEP_SHARE * abs(total))
        if low > 0 and delta >= floor:
            call = "slower"
        elif high < 0 and -delta >= floor:
            call = "faster"
        elif high < floor and low > -floor:
            call = "same"
        else:
            call = "unsure"
        judged.append(StageEfficiency(stage, at_a[stage], at_b[stage], delta, low, high, floor, call))
    efficiency = sum(s.seconds for s in judged)
    low, high = _interval(efficiency, sum(draws_b[s] - draws_a[s] for s in stages), 1 - CONFIDENCE)
    verdict = EfficiencyVerdict(NO_CHANGE, [], a.label, b.label, efficiency_s=efficiency, low_s=low, high_s=high,
                                a_s=total, stages=judged, workload=workload, comparability=guard,
                                resamples=resamples)
    slower = [s for s in judged if s.call == "slower"]
    faster = [s for s in judged if s.call == "faster"]
    problems = _confounded(a, b, stages) + _fit_problems(comparison, stages, at_a, total)
    if problems:
        verdict.verdict, verdict.reasons = INCONCLUSIVE, problems
    elif slower or faster:
        carrying = max(slower or faster, key=lambda s: abs(s.seconds))
        verdict.verdict = REGRESSION if slower else IMPROVEMENT
        verdict.stage, verdict.seconds = carrying.stage, carrying.seconds
    elif (high - low) / 2 > MAX_HALF_WIDTH * abs(total):
        verdict.verdict = INCONCLUSIVE
        verdict.reasons = [f"the steps scatter too much to tell: at the same workload the step's change lies "
                           f"between {low / total:+.1%} and {high / total:+.1%}".replace("-", "−")]
    else:
        sure_low, sure_high = _interval(efficiency, sum(draws_b[s] - draws_a[s] for s in stages), 1 - SURE_CONFIDENCE)
        if sure_low > 0 or sure_high < 0:
            verdict.verdict = INCONCLUSIVE
            verdict.reasons = [(f"at the same workload the step takes {efficiency / total:+.1%} ({SURE_CONFIDENCE:.0%} "
                                f"interval {sure_low / total:+.1%} to {sure_high / total:+.1%}), but no stage's change "
                                "is sure: more steps would tell").replace("-", "−")]
    return verdict
