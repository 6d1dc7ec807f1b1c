"""`explain_against`: why one run's mean step (B) differs from another's (A), in causes that sum to it.

A side is a run, or a window of its steps. Over a side's timed steps that are not validation-only
(N of them), its mean step is step = Σ wall_s / N, the wall time of validation-only steps included.
Each such step's wall time splits as

    wall = Σ_{k≠update_weights} f_k(W_s) + update_weights_s + testing_s + save_checkpoint_s + residual_s

with f_k the side's fitted stage line (`explain.decompose_run`: warm-up steps found and left out of
the fit) at the step's workload W_s, and residual_s = Σ_{k≠update_weights} (actual_k − f_k(W_s)): warm-up
on the warm-up steps, unexplained on the others. A validation-only step's wall time is validation.
The lines are linear, so Σ_s f_k(W_s) / N = f_k(W̄), W̄ the side's mean workload (a missing feature
filled with the side's typical value, as the model fills it).

delta_s = step_B − step_A splits exactly into these causes (b_{k,f}: stage k's seconds per unit of
feature f, 0 where the side's model has no such term; Δ = B − A; x̄ = (x_A + x_B) / 2):

- workload, Σ_{k,f} b̄_{k,f} · ΔW̄_f, by feature: r_max → long_tail; response_tokens, n_responses,
  total_tokens → token_volume; the busiest rank's tokens (the column the training stages follow) are
  m · λ, m the mean rank's tokens and λ = busiest / m over the side's steps, and Δ(m·λ) = λ̄·Δm + m̄·Δλ:
  m̄·Δλ → dp_imbalance, λ̄·Δm → token_volume; when the sides differ in DP ranks r, m = T / r (T the
  tokens of all ranks) and Δm = ΔT · mean(1/r_A, 1/r_B) (→ token_volume) + Δ(1/r) · T̄ (→ gpu_count);
- efficiency, per stage: f_k^B(W̃) − f_k^A(W̃) = Δa_k + Σ_f Δb_{k,f} · W̃_f at W̃ = (W̄_A + W̄_B) / 2,
  the stage's time at the same workload;
- validation, checkpoint, weight_sync, warmup, each per step = frequency × cost (frequency = share of
  the N steps that have it, cost = its mean seconds there): Δ(f·c) = c̄·Δf + f̄·Δc, the two parts
  telling which of the two changed;
- unexplained: the change of the mean residual on the steps that are not warm-up;
- stage_only_in_a, stage_only_in_b: a stage with a workload line that one side times and the other does
  not (a critic's values and update_critic, a reference model's ref) is its own cause, never an
  efficiency: its whole seconds on that side, f_k(W̄) (minus for A's), with no workload or efficiency
  term; whatever the other side spent on it is in that side's `other` time.
A cause's share = seconds / delta_s, given when |delta_s| is at least 1% of A's step (null otherwise).

A term one side's model lacks because its feature did not vary over that side's steps (the longest
response at the cap on every step) is not 0 s per unit: it takes the other side's coefficient b and
the side's intercept becomes a − b · W̄_f, so the side's line is unchanged at its own mean workload
(a note names each such term).

Workload and efficiency are the average of the two orders of the decomposition (Shapley): A's model at
B's workload first (the interaction Σ Δb · ΔW then counts as efficiency), or B's model at A's workload
first (it counts as workload); each gets half. `interaction_s` = Σ Δb · ΔW, named in the findings when
it is above 5% of |delta_s| and 1% of A's step.

Scale: when the sides' GPU counts differ (run meta n_gpus, or nnodes × n_gpus_per_node from the printed
config), each stage's seconds t_k = f_k at the common workload (W̃'s batch features; m = T̄ / r of
the side, busiest = λ of the side · m) give speedup = t_fewer / t_more, ideal = g_more / g_fewer and
scaling efficiency = speedup / ideal; a stage holding ≥ 5% of the larger side's modelled step whose
speedup is below 1.05 stopped scaling. Only stages both sides time are scaled, and a stage whose
seconds on either side are below 1% of the larger side's modelled step gets no speedup (a ratio over a
base near zero).

Guardrails (`diagnose.comparable`): the first findings say when the sides differ in framework, algorithm
(a critic or not), advantage estimator, model, GPU count or timed stages. No percentage is given over a
base below 1% of A's step; the mean rank's tokens are only spoken of when both sides log per-rank data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

import duckdb
import numpy as np
import polars as pl

from polytrace_cli.analyze.common import StepRange
from polytrace_cli.diagnose.comparable import (
    Comparability, compare_profiles, percent_text, profile_of, relative_change,
)
from polytrace_cli.diagnose.explain import MIN_TRAINING_STEPS, _finite, decompose_run, explained_in_seconds
from polytrace_cli.display import duration
from polytrace_cli.errors import PolytraceError
from polytrace_cli.jsontext import json_default
from polytrace_cli.model import read_workload, run_info, stage_seconds, training_mask
from polytrace_cli.model.fit import GAP_OF
from polytrace_cli.model.workload import _ranks_from_meta

WORKLOAD_CAUSES = ("token_volume", "long_tail", "dp_imbalance", "gpu_count")
OVERHEAD_CAUSES = ("validation", "checkpoint", "weight_sync", "warmup")
STAGE_ONLY_CAUSES = ("stage_only_in_a", "stage_only_in_b")
CAUSES = (*WORKLOAD_CAUSES, "efficiency", *STAGE_ONLY_CAUSES, *OVERHEAD_CAUSES, "unexplained")
# The stage each overhead's seconds are logged as.
OVERHEAD_STAGE = {"validation": "testing", "checkpoint": "save_checkpoint", "weight_sync": "update_weights",
                  "warmup": None}
VOLUME_FEATURES = ("response_tokens", "n_responses", "total_tokens")
# What one unit of a feature is, for "gen took 30% more per response token".
FEATURE_UNIT = {"r_max": "token of the longest response", "response_tokens": "response token",
                "n_responses": "response", "total_tokens": "token", "busiest_rank_tokens": "token of the busiest rank",
                "balanced_busiest_tokens": "token of the busiest rank after balancing"}
# The interaction of the two orders is named when above this share of |delta_s| and of A's step.
INTERACTION_SHARE, INTERACTION_STEP_SHARE = 0.05, 0.01
# A stage holding at least this share of the larger side's step stopped scaling below this speedup.
SCALING_STAGE_SHARE, STOPPED_SPEEDUP = 0.05, 1.05
# A share of the difference is given when |delta_s| is at least this share of A's step (else it is noise).
SHARE_MIN_DELTA = 0.01
# Findings name the causes above this share of |delta_s| (and of A's step).
FINDING_SHARE, FINDING_STEP_SHARE = 0.05, 0.01
CAUSE_COLUMNS = ("cause", "stage", "seconds", "share", "of_step")
# A percentage or a speedup is given over a base of at least this share of the step (else it is near zero).
NEAR_ZERO_SHARE = 0.01


@dataclass
class Side:
    """One side of the comparison: its label, model, mean step and the per-step means of its parts."""

    label: str
    run: str
    steps: int
    step_s: float
    wall_s: float
    model: Any = field(repr=False)
    workload: dict[str, float]
    ranks: int | None
    gpus: int | None
    overheads: dict[str, tuple[float, float]]   # cause -> (frequency, cost_s)
    unexplained_s: float
    model_s: float
    per_rank: bool = False
    # stage -> (intercept, {feature: seconds per unit}, features the fit dropped as not varying); the
    # model's lines, with terms borrowed from the other side (`_borrow_terms`).
    lines: dict[str, tuple[float, dict[str, float], tuple[str, ...]]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.lines:
            self.lines = {stage: (fit.intercept, dict(fit.coefficients), tuple(fit.dropped))
                          for stage, fit in self.model.stages.items()}


@dataclass
class Comparison:
    """The answer of `explain_against`; `to_dict` is the JSON of `polytrace explain --against --json`."""

    a: Side
    b: Side
    causes: list[dict]
    interaction_s: float
    findings: list[str]
    notes: list[str]
    scaling: dict | None = None
    comparability: Comparability | None = None

    @property
    def delta_s(self) -> float:
        """B's mean step minus A's."""
        return self.b.step_s - self.a.step_s

    @property
    def slowdown(self) -> float:
        """delta_s / A's mean step: 0.05 is 5% slower."""
        return self.delta_s / self.a.step_s if self.a.step_s else float("nan")

    @property
    def top_cause(self) -> dict | None:
        """The cause with the most seconds in the direction of delta_s."""
        same_way = [c for c in self.causes if c["seconds"] * self.delta_s > 0]
        return max(same_way, key=lambda c: abs(c["seconds"])) if same_way else None

    def to_dict(self) -> dict[str, Any]:
        """The JSON document as Python values (NaN and infinities as None)."""
        return _finite({
            "a": self.a.label, "b": self.b.label, "a_steps": self.a.steps, "b_steps": self.b.steps,
            "a_step_s": self.a.step_s, "b_step_s": self.b.step_s, "delta_s": self.delta_s,
            "wall_delta_s": self.b.wall_s - self.a.wall_s, "slowdown": self.slowdown,
            "order": "shapley", "interaction_s": self.interaction_s, "causes": self.causes,
            "findings": self.findings, "notes": self.notes, "scaling": self.scaling,
            "comparable": None if self.comparability is None else self.comparability.to_dict(),
        })

    def to_json(self) -> str:
        """Strict JSON text of `to_dict`."""
        return json.dumps(self.to_dict(), default=json_default, indent=2, allow_nan=False)


def _window(frame: pl.DataFrame, steps: StepRange) -> pl.DataFrame:
    keep = pl.lit(True)
    if steps.first is not None:
        keep = keep & (pl.col("step") >= steps.first)
    if steps.last is not None:
        keep = keep & (pl.col("step") <= steps.last)
    return frame.filter(keep)


def _label(name: str, steps: StepRange) -> str:
    if steps.first is None and steps.last is None:
        return name
    return f"{name} steps {'' if steps.first is None else steps.first}:{'' if steps.last is None else steps.last}"


def _mode(values: pl.Series) -> int | None:
    values = values.drop_nulls()
    return int(values.mode().sort()[0]) if values.len() else None


def _side_frame(con: duckdb.DuckDBPyConnection, run: str, steps: StepRange) -> tuple[pl.DataFrame, str, int | None]:
    info = run_info(con, run)
    frame = _window(read_workload(con, info.run_id), steps)
    label = _label(info.name, steps)
    if not explained_in_seconds(frame):
        trained = int(training_mask(frame).sum()) if frame.height else 0
        raise PolytraceError(f"{label} has {trained} timed training step{'' if trained == 1 else 's'}; comparing "
                             f"step times needs a step-time model, which needs {MIN_TRAINING_STEPS}")
    return frame, label, _ranks_from_meta(info.meta)


def _side(label: str, run: str, frame: pl.DataFrame, gpus: int | None) -> Side:
    decomposition = decompose_run(frame, training_mask(frame))
    model = decomposition.model
    warm_keys = decomposition.causes.filter(pl.col("cause") == "warmup").select("segment", "step").unique()
    warm = (frame.select("segment", "step").with_row_index("row").join(warm_keys, on=["segment", "step"])["row"]
            .to_numpy())
    is_warm = np.zeros(frame.height, dtype=bool)
    is_warm[warm] = True

    def column(name: str) -> np.ndarray:
        return np.nan_to_num(frame[name].cast(pl.Float64).fill_null(np.nan).to_numpy())

    timed = frame["wall_s"].is_not_null().to_numpy()
    validation_only = frame["validation_only"].to_numpy() & timed
    counted = timed & ~validation_only
    n = int(counted.sum())
    wall = column("wall_s")
    actual = stage_seconds(frame)
    predicted = model.predict(frame)
    modelled = [stage for stage in model.stages if stage != "update_weights"]
    model_part = sum((predicted[f"{stage}_s"].to_numpy() for stage in modelled), np.zeros(frame.height))
    residual = sum((np.nan_to_num(actual[stage]) - predicted[f"{stage}_s"].to_numpy() for stage in modelled),
                   np.zeros(frame.height))
    per_step = {
        "validation": np.where(validation_only, wall, np.where(counted, column("testing_s"), 0.0)),
        "checkpoint": np.where(counted, column("save_checkpoint_s"), 0.0),
        "weight_sync": np.where(counted, column("update_weights_s"), 0.0),
        "warmup": np.where(counted & is_warm, residual, 0.0),
    }
    overheads = {}
    for cause, values in per_step.items():
        present = values != 0
        overheads[cause] = (float(present.sum()) / n, float(values[present].mean()) if present.any() else 0.0)
    workload = {}
    for name in set(frame.columns) & {"r_max", "response_tokens", "n_responses", "total_tokens", "mean_rank_tokens",
                                      *GAP_OF}:
        values = frame[name].cast(pl.Float64).fill_null(np.nan).to_numpy()[counted]
        fill = model.typical.get(name, np.nan)
        values = np.where(np.isfinite(values), values, fill)
        workload[name] = float(values.mean()) if values.size and np.all(np.isfinite(values)) else float("nan")
    ranks = _mode(frame.filter(pl.Series(counted))["ranks"])
    per_rank = bool(frame.filter(pl.Series(counted))["per_rank_data"].fill_null(False).any())
    return Side(label=label, run=run, steps=n, step_s=float(wall[timed].sum()) / n, wall_s=float(wall[timed].sum()),
                model=model, workload=workload, ranks=ranks, gpus=gpus or ranks, overheads=overheads,
                unexplained_s=float(residual[counted & ~is_warm].sum()) / n,
                model_s=float(model_part[counted].sum()) / n, per_rank=per_rank)


def _coefficient(side: Side, stage: str, feature: str | None) -> float:
    line = side.lines.get(stage)
    if line is None:
        return 0.0
    return line[0] if feature is None else line[1].get(feature, 0.0)


def _borrow_terms(a: Side, b: Side) -> tuple[Side, Side, list[str]]:
    """Copies of the sides where a term one side's steps cannot fit, its feature not varying there (the
    longest response at the cap on every step, say), takes the other side's coefficient, and the side's
    intercept gives it back at the side's mean workload: the side's line is unchanged at its own
    workload, and its seconds per unit are not taken as 0 where the other side's workload differs.
    Also a note per borrowed term."""
    notes = []
    lines = {id(side): {stage: (line[0], dict(line[1]), line[2]) for stage, line in side.lines.items()}
             for side in (a, b)}
    for side, other in ((a, b), (b, a)):
        mine = lines[id(side)]
        for stage, (intercept, coefficients, dropped) in list(mine.items()):
            if stage not in other.lines:
                continue
            for feature, coefficient in other.lines[stage][1].items():
                level = side.workload.get(feature, np.nan)
                if feature in coefficients or feature not in dropped or not np.isfinite(level):
                    continue
                coefficients[feature] = coefficient
                intercept -= coefficient * level
                notes.append(f"{feature} did not vary over {side.label}'s steps (about {level:,.0f}), so {stage}'s "
                             f"seconds per {FEATURE_UNIT.get(feature, feature)} there are {other.label}'s")
            mine[stage] = (intercept, coefficients, dropped)
    return replace(a, lines=lines[id(a)]), replace(b, lines=lines[id(b)]), notes


def _busiest_split(a: Side, b: Side, busiest: str) -> dict[str, float] | None:
    """Δ of the mean busiest rank's tokens as fractions by cause: {dp_imbalance, token_volume, gpu_count}
    summing to 1 (None when the mean rank's tokens are unknown or the busiest did not change)."""
    ma, mb = a.workload.get("mean_rank_tokens", np.nan), b.workload.get("mean_rank_tokens", np.nan)
    ba, bb = a.workload.get(busiest, np.nan), b.workload.get(busiest, np.nan)
    if not all(np.isfinite([ma, mb, ba, bb])) or ma <= 0 or mb <= 0 or bb == ba:
        return None
    la, lb = ba / ma, bb / mb
    imbalance = (ma + mb) / 2 * (lb - la)
    rank_tokens = (la + lb) / 2 * (mb - ma)
    parts = {"dp_imbalance": imbalance, "token_volume": rank_tokens, "gpu_count": 0.0}
    if a.ranks and b.ranks and a.ranks != b.ranks:
        ta, tb = ma * a.ranks, mb * b.ranks
        volume = (tb - ta) * (1 / a.ranks + 1 / b.ranks) / 2
        scale = (1 / b.ranks - 1 / a.ranks) * (ta + tb) / 2
        parts["token_volume"] = (la + lb) / 2 * volume
        parts["gpu_count"] = (la + lb) / 2 * scale
    total = bb - ba
    return {cause: value / total for cause, value in parts.items()}


def _decompose(a: Side, b: Side) -> tuple[dict[tuple[str, str | None], float], float, dict[str, dict]]:
    """Per (cause, stage) seconds, the interaction Σ Δb·ΔW, and per stage the efficiency detail."""
    busiest = a.model.busiest_feature
    stages = [s for s in dict.fromkeys([*a.lines, *b.lines]) if s != "update_weights"]
    split = _busiest_split(a, b, busiest)
    parts: dict[tuple[str, str | None], float] = {}
    detail: dict[str, dict] = {}
    interaction = 0.0

    def add(cause: str, stage: str | None, seconds: float) -> None:
        parts[(cause, stage)] = parts.get((cause, stage), 0.0) + seconds

    floor = NEAR_ZERO_SHARE * abs(a.step_s)
    for stage in stages:
        if (stage in a.lines) != (stage in b.lines):
            # Timed by one side only: its whole seconds there are its own cause, never an efficiency.
            side, cause, sign = (b, "stage_only_in_b", 1.0) if stage in b.lines else (a, "stage_only_in_a", -1.0)
            add(cause, stage, sign * line_at(side, stage, side.workload))
            continue
        features = set()
        for side in (a, b):
            if stage in side.lines:
                features |= set(side.lines[stage][1])
        efficiency = _coefficient(b, stage, None) - _coefficient(a, stage, None)
        at_mean = {"a": _coefficient(a, stage, None), "b": _coefficient(b, stage, None), "per_unit": None}
        largest = 0.0
        for feature in sorted(features):
            wa, wb = a.workload.get(feature, np.nan), b.workload.get(feature, np.nan)
            # A feature one side lacks counts as unchanged; one both lack as 0, as the model fills it.
            wa, wb = (wa if np.isfinite(wa) else wb), (wb if np.isfinite(wb) else wa)
            wa, wb = (wa, wb) if np.isfinite(wa) else (0.0, 0.0)
            ca, cb = _coefficient(a, stage, feature), _coefficient(b, stage, feature)
            mean_w = (wa + wb) / 2
            efficiency += (cb - ca) * mean_w
            at_mean["a"] += ca * mean_w
            at_mean["b"] += cb * mean_w
            if min(ca, cb) * mean_w >= floor and (ca + cb) * mean_w > largest:
                largest = (ca + cb) * mean_w
                at_mean["per_unit"] = (feature, ca, cb)
            interaction += (cb - ca) * (wb - wa)
            workload = (ca + cb) / 2 * (wb - wa)
            if feature == "r_max":
                add("long_tail", stage, workload)
            elif feature in VOLUME_FEATURES:
                add("token_volume", stage, workload)
            elif feature in GAP_OF and split is not None:
                for cause, fraction in split.items():
                    add(cause, stage, workload * fraction)
            else:
                add("token_volume", stage, workload)
        add("efficiency", stage, efficiency)
        detail[stage] = at_mean
    return parts, interaction, detail


def line_at(side: Side, stage: str, workload: dict[str, float]) -> float:
    """The side's line of `stage` at a workload (a feature it lacks at the side's typical value, else 0)."""
    intercept, coefficients, _ = side.lines[stage]
    total = intercept
    for feature, coefficient in coefficients.items():
        level = workload.get(feature, np.nan)
        total += coefficient * (level if np.isfinite(level) else side.model.typical.get(feature, 0.0))
    return float(total)


def _overhead_parts(a: Side, b: Side) -> dict[str, dict]:
    out = {}
    for cause in OVERHEAD_CAUSES:
        (fa, ca), (fb, cb) = a.overheads[cause], b.overheads[cause]
        out[cause] = {"seconds": fb * cb - fa * ca, "frequency_a": fa, "frequency_b": fb, "cost_a_s": ca,
                      "cost_b_s": cb, "from_frequency_s": (ca + cb) / 2 * (fb - fa),
                      "from_cost_s": (fa + fb) / 2 * (cb - ca)}
    return out


def _cause_rows(a: Side, b: Side, parts: dict, overheads: dict[str, dict], detail: dict[str, dict]) -> list[dict]:
    delta = b.step_s - a.step_s
    rows = []
    for cause in WORKLOAD_CAUSES:
        mine = {stage: s for (c, stage), s in parts.items() if c == cause}
        if not mine or all(s == 0 for s in mine.values()):
            continue
        total = sum(mine.values())
        stage = max(mine, key=lambda k: mine[k] * (1 if total >= 0 else -1))
        rows.append({"cause": cause, "group": "workload", "stage": stage, "seconds": total})
    for (cause, stage), seconds in parts.items():
        if cause in STAGE_ONLY_CAUSES:
            rows.append({"cause": cause, "group": "stages", "stage": stage, "seconds": seconds})
        if cause == "efficiency" and seconds != 0:
            at = detail[stage]
            rows.append({"cause": cause, "group": "efficiency", "stage": stage, "seconds": seconds,
                         "a_at_same_workload_s": at["a"], "b_at_same_workload_s": at["b"]})
    for cause, part in overheads.items():
        if part["seconds"] != 0 or part["frequency_a"] or part["frequency_b"]:
            rows.append({"cause": cause, "group": "overhead", "stage": OVERHEAD_STAGE[cause], **part})
    rows.append({"cause": "unexplained", "group": "unexplained", "stage": None,
                 "seconds": b.unexplained_s - a.unexplained_s})
    shared = abs(delta) >= SHARE_MIN_DELTA * abs(a.step_s)
    for row in rows:
        row["share"] = row["seconds"] / delta if shared and delta else None
        row["of_step"] = row["seconds"] / a.step_s if a.step_s else None
    rows.sort(key=lambda row: abs(row["seconds"]), reverse=True)
    return rows


def _every(frequency: float) -> str:
    if frequency <= 0:
        return "never"
    every = 1 / frequency
    return "every step" if every < 1.05 else f"once every {every:,.1f} steps"


def _percent(new: float, old: float, floor: float = 0.0) -> str:
    """' (+12%)' of new against old, '' when old is below `floor` (near zero)."""
    return percent_text(relative_change(new, old, floor))


def _cause_text(row: dict, a: Side, b: Side, busiest: str, detail: dict[str, dict]) -> str:
    seconds = row["seconds"]
    head = f"{row['cause']} {'+' if seconds >= 0 else '−'}{duration(abs(seconds))} per step"
    cause = row["cause"]
    if cause == "token_volume":
        ra, rb = a.workload.get("response_tokens", np.nan), b.workload.get("response_tokens", np.nan)
        ma, mb = a.workload.get("mean_rank_tokens", np.nan), b.workload.get("mean_rank_tokens", np.nan)
        said = []
        if np.isfinite(ra) and np.isfinite(rb):
            said.append(f"response tokens per step {rb:,.0f} against {ra:,.0f}{_percent(rb, ra)}")
        ta, tb = a.workload.get("total_tokens", np.nan), b.workload.get("total_tokens", np.nan)
        per_rank = a.per_rank and b.per_rank
        if per_rank and np.isfinite(ma) and np.isfinite(mb) and a.ranks and b.ranks and a.ranks != b.ranks:
            # The mean rank's change from the rank count is gpu_count's; the volume is all ranks' tokens.
            ta, tb = ma * a.ranks, mb * b.ranks
            said.append(f"all DP ranks together held {tb:,.0f} tokens against {ta:,.0f}{_percent(tb, ta)}")
        elif per_rank and np.isfinite(ma) and np.isfinite(mb):
            said.append(f"the mean rank held {mb:,.0f} tokens against {ma:,.0f}{_percent(mb, ma)}")
        elif np.isfinite(ta) and np.isfinite(tb) and not said:
            # Without per-rank data a rank's tokens are only total / ranks: the total is what was logged.
            said.append(f"tokens per step {tb:,.0f} against {ta:,.0f}{_percent(tb, ta)}")
        return f"{head}: {'; '.join(said) or 'more tokens per step'}"
    if cause == "long_tail":
        ra, rb = a.workload.get("r_max", np.nan), b.workload.get("r_max", np.nan)
        return f"{head}: the longest response averaged {rb:,.0f} tokens against {ra:,.0f}{_percent(rb, ra)}"
    if cause == "dp_imbalance":
        la = a.workload[busiest] / a.workload["mean_rank_tokens"]
        lb = b.workload[busiest] / b.workload["mean_rank_tokens"]
        after = " after balancing" if busiest == "balanced_busiest_tokens" else ""
        return f"{head}: the busiest DP rank{after} held {lb:.2f}× the mean rank's tokens against {la:.2f}×"
    if cause == "gpu_count":
        return (f"{head}: {b.ranks} DP ranks against {a.ranks}, so each rank held a "
                f"{'smaller' if (b.ranks or 0) > (a.ranks or 0) else 'larger'} share of the batch")
    if cause == "efficiency":
        ta, tb = row["a_at_same_workload_s"], row["b_at_same_workload_s"]
        relative = relative_change(tb, ta, NEAR_ZERO_SHARE * abs(a.step_s))
        way = "slower" if tb > ta else "faster"
        change = f"{abs(relative):.0%} {way}" if relative is not None else way
        text = (f"{head}: {row['stage']} ran {change} at the same workload ({duration(tb)} against {duration(ta)} "
                f"at the two runs' mean workload)")
        per_unit = detail.get(row["stage"], {}).get("per_unit")
        if per_unit:
            feature, ca, cb = per_unit
            text += f"; {(cb - ca) / ca:+.0%} seconds per {FEATURE_UNIT.get(feature, feature)}".replace("-", "−")
        return text
    if cause in STAGE_ONLY_CAUSES:
        timed, other = (b, a) if cause == "stage_only_in_b" else (a, b)
        return (f"stage only in {'B' if timed is b else 'A'}: {row['stage']} {'+' if seconds >= 0 else '−'}"
                f"{duration(abs(seconds))} per step, timed in {timed.label}'s log only (not an efficiency: "
                f"whatever {other.label} spent on it is in its other time)")
    if cause in OVERHEAD_CAUSES:
        frequency, cost = row["from_frequency_s"], row["from_cost_s"]
        if not row["frequency_a"] or not row["frequency_b"]:
            had, other = (b, a) if row["frequency_b"] else (a, b)
            which = "frequency_b" if had is b else "frequency_a"
            cost_of = row["cost_b_s"] if had is b else row["cost_a_s"]
            return f"{head}: {had.label} has it {_every(row[which])} at {duration(cost_of)}, {other.label} never"
        changed = ("its frequency changed" if abs(frequency) > 2 * abs(cost) else
                   "its cost changed" if abs(cost) > 2 * abs(frequency) else "both its frequency and its cost changed")
        return (f"{head}: {_every(row['frequency_b'])} at {duration(row['cost_b_s'])} against "
                f"{_every(row['frequency_a'])} at {duration(row['cost_a_s'])}: {changed}")
    return f"{head}: what neither run's model explains"


def _scaling(a: Side, b: Side, busiest: str) -> dict | None:
    if not a.gpus or not b.gpus or a.gpus == b.gpus:
        return None
    fewer, more = (a, b) if a.gpus < b.gpus else (b, a)
    common = {name: (a.workload.get(name, np.nan) + b.workload.get(name, np.nan)) / 2
              for name in set(a.workload) | set(b.workload)}

    def at_common(side: Side) -> dict[str, float]:
        w = dict(common)
        m_a, m_b = a.workload.get("mean_rank_tokens", np.nan), b.workload.get("mean_rank_tokens", np.nan)
        if a.ranks and b.ranks and np.isfinite(m_a) and np.isfinite(m_b):
            w["mean_rank_tokens"] = (m_a * a.ranks + m_b * b.ranks) / 2 / side.ranks
        mean = side.workload.get("mean_rank_tokens", np.nan)
        if np.isfinite(mean) and mean > 0 and np.isfinite(side.workload.get(busiest, np.nan)):
            w[busiest] = side.workload[busiest] / mean * w["mean_rank_tokens"]
        return w

    def seconds(side: Side) -> dict[str, float]:
        w = at_common(side)
        out = {}
        for stage, (intercept, coefficients, _) in side.lines.items():
            out[stage] = intercept + sum(b_f * w.get(f, side.model.typical.get(f, 0.0))
                                         for f, b_f in coefficients.items())
        return out

    t_fewer, t_more = seconds(fewer), seconds(more)
    ideal = more.gpus / fewer.gpus
    step_more = sum(t_more.values())
    floor = NEAR_ZERO_SHARE * max(step_more, sum(t_fewer.values()))
    rows = []
    # Only a stage both sides time scales; one side's stage is its own cause (stage_only_in_a, _b).
    for stage in [s for s in t_fewer if s in t_more]:
        tf, tm = t_fewer[stage], t_more[stage]
        speedup = tf / tm if tm >= floor and tf >= floor else None
        rows.append({"stage": stage, "fewer_gpus_s": tf, "more_gpus_s": tm, "speedup": speedup,
                     "efficiency": speedup / ideal if speedup is not None else None,
                     "stopped": bool(speedup is not None and speedup < STOPPED_SPEEDUP
                                     and tm >= SCALING_STAGE_SHARE * step_more)})
    stopped = [r for r in rows if r["stopped"]]
    worst = min(stopped, key=lambda r: r["efficiency"]) if stopped else None
    return {"fewer": fewer.label, "more": more.label, "fewer_gpus": fewer.gpus, "more_gpus": more.gpus,
            "ideal_speedup": ideal, "stages": rows, "stopped_scaling": worst["stage"] if worst else None}


def compare_sides(a: Side, b: Side, comparability: Comparability | None = None) -> Comparison:
    """The decomposition of the module docstring for two prepared sides; `comparability` (the sides'
    guardrails, `diagnose.comparable`) puts the ways they differ among the first findings."""
    busiest = a.model.busiest_feature
    a, b, borrowed = _borrow_terms(a, b)
    parts, interaction, detail = _decompose(a, b)
    overheads = _overhead_parts(a, b)
    causes = _cause_rows(a, b, parts, overheads, detail)
    delta = b.step_s - a.step_s
    findings = [f"{b.label}'s mean step is {duration(b.step_s)} against {duration(a.step_s)} for {a.label}: "
                f"{'+' if delta >= 0 else '−'}{duration(abs(delta))}{_percent(b.step_s, a.step_s)} per step, "
                f"over {b.steps:,} and {a.steps:,} steps"]
    if comparability is not None and not comparability.comparable:
        findings.append(comparability.summary())
    for row in causes:
        if abs(row["seconds"]) >= max(FINDING_SHARE * abs(delta), FINDING_STEP_SHARE * a.step_s):
            findings.append(_cause_text(row, a, b, busiest, detail))
    notes = ["workload and efficiency average the two orders of the decomposition (A's model at B's workload "
             "first, and B's model at A's workload first); the causes sum to the difference of the mean steps",
             *borrowed]
    if abs(interaction) > max(INTERACTION_SHARE * abs(delta), INTERACTION_STEP_SHARE * a.step_s):
        findings.append(f"the two orders differ by {duration(abs(interaction))} per step (the interaction Σ Δb·ΔW: "
                        "the stages' cost per token changed where the workload changed too); each got half")
    scaling = _scaling(a, b, busiest)
    if scaling is not None:
        stopped = scaling["stopped_scaling"]
        text = (f"{scaling['more']} ran on {scaling['more_gpus']} GPUs against {scaling['fewer_gpus']} for "
                f"{scaling['fewer']} (ideal speedup {scaling['ideal_speedup']:.2f}×)")
        if stopped:
            row = next(r for r in scaling["stages"] if r["stage"] == stopped)
            text += f": {stopped} stopped scaling (speedup {row['speedup']:.2f}×, efficiency {row['efficiency']:.0%})"
        findings.append(text)
    return Comparison(a=a, b=b, causes=causes, interaction_s=interaction, findings=findings, notes=notes,
                      scaling=scaling, comparability=comparability)


def explain_against(con: duckdb.DuckDBPyConnection, run: str, against: str | None = None,
                    steps: StepRange | str | None = None, against_steps: StepRange | str | None = None,
                    against_con: duckdb.DuckDBPyConnection | None = None) -> Comparison:
    """Why `run` (B, in `steps`) differs from `against` (A, in `against_steps`; the same run when None)
    in mean step time: causes summing to B's mean step − A's (see the module docstring). A is read from
    `against_con` when given (a baseline kept in another store or a lake), else from `con`."""
    steps, against_steps = StepRange.of(steps), StepRange.of(against_steps)
    against = run if against is None else against
    elsewhere = against_con is not None and against_con is not con
    against_con = con if against_con is None else against_con
    frame_b, label_b, gpus_b = _side_frame(con, run, steps)
    frame_a, label_a, gpus_a = _side_frame(against_con, against, against_steps)
    if elsewhere and label_a == label_b:
        label_a = f"{label_a} (baseline)"
    if label_a == label_b:
        raise PolytraceError(f"{label_b} is compared with itself: give --against another run or --against-steps")
    side_a = _side(label_a, against, frame_a, gpus_a)
    side_b = _side(label_b, run, frame_b, gpus_b)
    notes = []
    if side_a.model.busiest_feature != side_b.model.busiest_feature:
        # The two models follow different busiest-rank columns: refit both on the one every log has.
        side_a = _side(label_a, against, frame_a.with_columns(balanced_busiest_tokens=pl.lit(None, pl.Float64)), gpus_a)
        side_b = _side(label_b, run, frame_b.with_columns(balanced_busiest_tokens=pl.lit(None, pl.Float64)), gpus_b)
        notes.append("one run's training stages follow the busiest rank after balancing, the other's before it: "
                     "both are compared on the busiest rank before balancing (global_seqlen/max)")
    for side, other in ((side_a, side_b), (side_b, side_a)):
        only = [stage for stage in side.model.stages if stage not in other.model.stages and stage != "other"]
        if only and "other" in other.model.stages:
            notes.append(f"{', '.join(only)} {'is' if len(only) == 1 else 'are'} timed in {side.label}'s log only: "
                         f"whatever time {other.label} spent on {'it' if len(only) == 1 else 'them'} is in its other "
                         "stage, and so in other's efficiency")
    guard = compare_profiles(profile_of(against_con, against, label_a, frame_a), profile_of(con, run, label_b, frame_b))
    comparison = compare_sides(side_a, side_b, guard)
    comparison.notes.extend(notes)
    modes = (_execution_mode(frame_a), _execution_mode(frame_b))
    if modes[0] != modes[1] and SYNC in modes:
        cross_mode_split(comparison, frame_a, frame_b, modes)
    return comparison


SYNC = "sync"
# The trainer's own stages: what it computes between two waits (no generation, wait, weight sync or switch).
TRAINER_STAGES = ("reward", "old_log_prob", "ref", "values", "adv", "update_actor", "update_critic")
MODE_CAUSES = ("overlap_gained", "trainer_wait", "stale_samples")


def _execution_mode(frame: pl.DataFrame) -> str:
    modes = frame["execution_mode"].drop_nulls() if "execution_mode" in frame.columns else pl.Series([], dtype=pl.String)
    return modes[0] if modes.len() else SYNC


def _mode_means(frame: pl.DataFrame) -> dict[str, float]:
    """Per timed training step (validation-only steps left out), the means the cross-mode split reads:
    step (wall), generation, wait, the trainer's stages, weight sync with switches, the share of samples
    dropped as stale."""
    rows = frame.filter(pl.col("wall_s").is_not_null() & ~pl.col("validation_only"))

    def mean(name: str) -> float:
        if name not in rows.columns or rows.height == 0:
            return 0.0
        return float(rows[name].cast(pl.Float64).fill_null(0.0).fill_nan(0.0).mean())

    dropped = rows["dropped_samples"].cast(pl.Float64).fill_nan(None) if "dropped_samples" in rows.columns else None
    share = 0.0
    if dropped is not None and dropped.drop_nulls().len():
        values = dropped.fill_null(strategy="forward").fill_null(0.0).to_numpy()
        # verl's fully async counter is cumulative; the V1 trainer logs a step's own count.
        per_step = np.diff(values, prepend=0.0) if np.all(np.diff(values) >= 0) and values[-1] > values[0] else values
        kept = rows["n_responses"].cast(pl.Float64).fill_null(np.nan).to_numpy()
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = per_step / (per_step + kept)
        share = float(np.nanmean(ratio)) if np.isfinite(ratio).any() else 0.0
    return {"step": mean("wall_s"), "gen": mean("gen_s"), "wait": mean("trainer_wait_s"),
            "train": sum(mean(f"{stage}_s") for stage in TRAINER_STAGES),
            "sync": mean("update_weights_s") + mean("switch_s"), "dropped_share": share}


def cross_mode_split(comparison: Comparison, frame_a: pl.DataFrame, frame_b: pl.DataFrame,
                     modes: tuple[str, str]) -> None:
    """Replace the causes of a comparison between a sync run and an asynchronous one by the split of the
    mean step's difference across modes, B − A, per step (each side's means over its timed training steps):

        overlap_gained  − generation of the sync side's step, which the asynchronous trainer no longer runs
                        in its step (it runs beside training): −gen_A (A sync) or +gen_B (B sync)
        trainer_wait    + the asynchronous trainer's wait for the rollout side, less what the stale share
                        of its samples cost: wait · (1 − d), d = dropped / (dropped + trained) samples
        stale_samples   wait · d: the rollout work spent on samples dropped as stale, waited for again
        efficiency      Σ trainer stages B − A: training on the trainer's share of the GPUs
        weight_sync     (update_weights + switch) B − A
        unexplained     the rest: delta − the causes above (the `other` time, validation, checkpoints)

    They sum to delta_s exactly. One-step-off priced on a sync run stays `whatif --policy one-step-off`."""
    means = {"a": _mode_means(frame_a), "b": _mode_means(frame_b)}
    a, b = comparison.a, comparison.b
    delta = b.step_s - a.step_s
    sign = {"a": -1.0, "b": 1.0}
    sync_side = "a" if modes[0] == SYNC else "b"
    async_side = "b" if sync_side == "a" else "a"
    wait, dropped = means[async_side]["wait"], means[async_side]["dropped_share"]
    parts = {
        ("overlap_gained", "mode", "gen"): sign[sync_side] * means[sync_side]["gen"],
        ("trainer_wait", "mode", "trainer_wait"): sign[async_side] * wait * (1.0 - dropped),
        ("stale_samples", "mode", "trainer_wait"): sign[async_side] * wait * dropped,
        ("efficiency", "mode", "training stages"): means["b"]["train"] - means["a"]["train"],
        ("weight_sync", "mode", "update_weights"): means["b"]["sync"] - means["a"]["sync"],
    }
    parts[("unexplained", "unexplained", None)] = delta - sum(parts.values())
    shared = abs(delta) >= SHARE_MIN_DELTA * abs(a.step_s)
    rows = []
    for (cause, group, stage), seconds in parts.items():
        rows.append({"cause": cause, "group": group, "stage": stage, "seconds": seconds,
                     "share": seconds / delta if shared and delta else None,
                     "of_step": seconds / a.step_s if a.step_s else None})
    rows.sort(key=lambda row: abs(row["seconds"]), reverse=True)
    comparison.causes = rows
    label = {"a": a.label, "b": b.label}
    gained = means[sync_side]["gen"]
    comparison.findings = [
        comparison.findings[0],
        f"{label[async_side]} runs {modes[1] if async_side == 'b' else modes[0]}: the {duration(gained)} of generation "
        f"in {label[sync_side]}'s step runs beside training instead (overlap gained), and its trainer waits "
        f"{duration(wait)} a step for the rollout side",
        f"training on the trainer's share of the GPUs: {duration(means[async_side]['train'])} a step against "
        f"{duration(means[sync_side]['train'])}",
    ]
    if dropped > 0:
        comparison.findings.append(f"{dropped:.1%} of the samples were dropped as stale: {duration(wait * dropped)} "
                                   "of the wait regenerated them")
    comparison.interaction_s = 0.0
    comparison.notes = [f"{label['a']} runs {modes[0]}, {label['b']} {modes[1]}: the difference is split across "
                            "modes (overlap gained, trainer wait, stale samples, training efficiency, weight sync), "
                            "each side's means over its timed steps, not by the workload model"]
