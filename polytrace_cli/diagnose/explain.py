"""`explain_run`: why a run's steps took the time they took, per step and for the run.

With step timings (console, JSONL, wandb or TensorBoard logs):
1. fit the run's step-time model (`polytrace_cli.model`) on its training steps;
2. warm-up = the leading steps of each segment whose residual (actual − model at the step's
   workload) is above median + 3.5·1.4826·MAD of the training residuals (and > 5% of the expected
   step); when warm-up steps were in the fit, refit without them;
3. decompose every step's excess over the expected step into causes (`decompose`);
4. slow steps (`thresholds.slow_steps`): excess > 5% of the expected step, and above the robust
   threshold of the training steps' excess or with one cause standing out from its local level;
5. findings ranked by seconds (`findings`);
6. what bounds the run, per window of steps (`bounds`): rollout-bound, train-bound or overhead-bound,
   each with its seconds per step, read from the execution mode's timers;
7. the typical step (`typical_step`): its median time and where it goes, in one sentence.
Per-sample traces add, to a slow step's long_tail and dp_imbalance causes, the busiest DP rank and
the longest samples.

Without timings (PolyTrace traces alone) the lengths give what they can, in tokens: per step the
longest response against the run's median longest, and the busiest DP rank against the mean.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import polars as pl

from polytrace_cli.analyze.semantics import crash_clause, record_of, semantics_notes
from polytrace_cli.diagnose.bounds import UNTOLD, run_bounds
from polytrace_cli.analyze.typical_step import typical_steps
from polytrace_cli.diagnose.decompose import decompose, residual_seconds, step_causes
from polytrace_cli.diagnose.drilldown import sample_detail
from polytrace_cli.diagnose.findings import duration, run_findings
from polytrace_cli.diagnose.held_by import with_held_by
from polytrace_cli.diagnose.telemetry import ranked_with, telemetry_findings
from polytrace_cli.diagnose.thresholds import MAD_SCALE, ROBUST_Z, Threshold, slow_steps, warmup_steps
from polytrace_cli.errors import PolytraceError
from polytrace_cli.jsontext import json_default
from polytrace_cli.model import StepTimeModel, fit_model, overheads_included, read_workload, run_info, training_mask

# Fewer timed training steps than this cannot support a model of several terms per stage.
MIN_TRAINING_STEPS = 8
NEEDS_TIMINGS = "seconds need step timings: a verl console, JSONL, wandb or TensorBoard log of this run"


@dataclass
class Explanation:
    """The answer of `explain_run`. `basis` is 'seconds' (a model was fitted) or 'tokens' (lengths
    only); `steps` and `findings` follow the JSON layout of `polytrace explain --json`."""

    run: str
    basis: str
    steps: list[dict]
    findings: list[dict]
    notes: list[str] = field(default_factory=list)
    slow_rule: str | None = None
    expected_s: float | None = None
    run_seconds: float | None = None
    slow_steps: int = 0
    model: StepTimeModel | None = field(default=None, repr=False)
    bounds: dict | None = None
    typical_step: dict | None = None  # `analyze.typical_step.typical_step` without its run; None untimed
    # The notes that say what the run's numbers mean (its semantics record), which a reader needs first.
    caveats: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The JSON document as Python values (NaN and infinities as None)."""
        document = {"run": self.run, "basis": self.basis, "expected_s": self.expected_s,
                    "run_seconds": self.run_seconds, "slow_steps": self.slow_steps, "slow_rule": self.slow_rule,
                    "steps": self.steps, "findings": self.findings, "notes": self.notes, "bounds": self.bounds,
                    "typical_step": self.typical_step}
        if self.model is not None:
            document["model"] = {stage: {"intercept": fit.intercept, **fit.coefficients, "steps": fit.steps}
                                 for stage, fit in self.model.stages.items()}
        return _finite(document)

    def to_json(self) -> str:
        """Strict JSON text of `to_dict`."""
        return json.dumps(self.to_dict(), default=json_default, indent=2, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def explained_in_seconds(frame: pl.DataFrame) -> bool:
    """Whether `explain_run` fits the run's step-time model (basis 'seconds'): its workload frame
    (`read_workload`) has at least MIN_TRAINING_STEPS timed training steps (`training_mask`)."""
    return int(training_mask(frame).sum()) >= MIN_TRAINING_STEPS


def explain_run(con: duckdb.DuckDBPyConnection, run: str | int, step: int | None = None,
                top: int | None = None) -> Explanation:
    """Explain a run (see the module docstring). `step` asks for that step alone (slow or not);
    `top` keeps the K largest findings and the K slowest steps."""
    if top is not None and top < 1:
        raise PolytraceError("--top takes a positive number")
    info = run_info(con, run)
    frame = read_workload(con, info.run_id)
    if frame.height == 0:
        raise PolytraceError(f"run {info.name} has no steps: neither step metrics nor samples"
                             f"{crash_clause(con, info.run_id)}")
    if step is not None and step not in set(frame["step"].to_list()):
        first, last = frame["step"].min(), frame["step"].max()
        raise PolytraceError(f"run {info.name} has no step {step} (steps {first}–{last})")
    mask = training_mask(frame)
    if explained_in_seconds(frame):
        explanation = _explain_seconds(con, info, frame, mask, step, top)
        typical = typical_steps(con, [info.run_id]).get(info.name)
        explanation.typical_step = {k: v for k, v in typical.items() if k != "run"} if typical else None
        return with_held_by(con, info.run_id, explanation)
    trained = int(mask.sum())
    few = (f"{trained} timed training step{'' if trained == 1 else 's'} (a step-time model needs "
           f"{MIN_TRAINING_STEPS})")
    notes = [NEEDS_TIMINGS] if int(frame["wall_s"].is_not_null().sum()) == 0 else [
        f"only {few}, so seconds are not estimated"]
    if frame["r_max"].is_null().all():
        raise PolytraceError(f"run {info.name} has {few} and no response lengths: nothing to explain"
                             f"{crash_clause(con, info.run_id)}")
    caveats = semantics_notes(record_of(con, info.run_id))
    explanation = _explain_tokens(con, info, frame, step, top, notes + caveats)
    explanation.caveats = caveats
    return with_held_by(con, info.run_id, explanation)


@dataclass
class RunDecomposition:
    """Steps 1–4 of the module docstring for one run: the fitted model, its training mask (warm-up
    left out), the expected step, the decomposition's step frame (`decompose.STEP_COLUMNS`), its
    per step × cause frame with `stands_out`, the slow flags over the step frame and the slow rule."""

    model: StepTimeModel
    mask: pl.Series
    expected: float
    steps: pl.DataFrame
    causes: pl.DataFrame
    slow_flags: np.ndarray
    slow_rule: str


def decompose_run(frame: pl.DataFrame, mask: pl.Series) -> RunDecomposition:
    """Fit, find warm-up (refitting without it), decompose every timed step and flag the slow ones."""
    model = fit_model(frame, mask)
    expected = model.predict_typical()["step"]
    expected_all = np.full(frame.height, expected)
    residual = residual_seconds(frame, model)
    warm = warmup_steps(frame, residual, expected_all, Threshold.robust(residual[mask.to_numpy()]))
    if (warm & mask.to_numpy()).any():
        mask = mask & pl.Series(~warm)
        model = fit_model(frame, mask)
        expected = model.predict_typical()["step"]
    steps, parts = decompose(frame, model, warm)
    causes = step_causes(parts)
    slow_flags, standout, slow_rule = slow_steps(steps, causes, frame.filter(mask))
    causes = causes.join(standout, on=["segment", "step", "cause"], how="left") \
        .with_columns(pl.col("stands_out").fill_null(False))
    return RunDecomposition(model, mask, expected, steps, causes, slow_flags, slow_rule)


def _explain_seconds(con, info, frame: pl.DataFrame, mask: pl.Series, step: int | None,
                     top: int | None) -> Explanation:
    run = decompose_run(frame, mask)
    model, mask, expected, steps, causes = run.model, run.mask, run.expected, run.steps, run.causes
    slow_rule = run.slow_rule
    slow = steps.filter(pl.Series(run.slow_flags))
    record = record_of(con, info.run_id)
    findings = run_findings(steps, causes, frame, slow, model, record["collapse_step"])
    # A logged row standing for k optimizer steps (TRL's `logging_steps`) counts k times.
    run_seconds = float(steps.join(frame.select("segment", "step", "steps_covered"), on=["segment", "step"],
                                   how="left").select(pl.col("seconds") * pl.col("steps_covered").fill_null(1.0))
                        .to_series().sum())
    findings = ranked_with(findings, telemetry_findings(con, info.run_id, run_seconds))
    bounds = run_bounds(frame, mask, record.get("execution_mode"))
    untold = bounds is None and record.get("execution_mode") not in (None, "sync")
    if step is not None:
        chosen = steps.filter(pl.col("step") == step)
        if chosen.height == 0:
            raise PolytraceError(f"step {step} of run {info.name} has no step time")
    else:
        chosen = slow.sort("excess_s", descending=True)
        if top is not None:
            chosen = chosen.head(top)
    detail = sample_detail(con, info.run_id, chosen["step"].to_list())
    wanted = causes.join(chosen.select("segment", "step"), on=["segment", "step"])
    by_step = {key: part for key, part in wanted.group_by("segment", "step", maintain_order=True)}
    empty = causes.clear()
    slow_keys = set(slow.select("segment", "step").iter_rows())
    rollout = _rollout_side(frame, mask)
    step_rows = [_step_row(row, by_step.get((row["segment"], row["step"]), empty), detail,
                           (row["segment"], row["step"]) in slow_keys, rollout)
                 for row in chosen.iter_rows(named=True)]
    notes = [f"expected step {duration(expected)} (the model at the run's median workload, no validation or "
             f"checkpoint), fitted on {int(mask.sum())} training steps"]
    estimated = con.execute("SELECT count(DISTINCT step) FROM step_flags WHERE run_id = ? AND flag = 'tqdm_estimate'",
                            [info.run_id]).fetchall()[0][0]
    if estimated:
        notes.append(f"{estimated} step time{'s are' if estimated != 1 else ' is'} estimated from the training "
                     "progress bar (the log has no metric lines for them)")
    for told, timer, present in zip(overheads_included(con, info.run_id), ("testing", "save_checkpoint"),
                                    (frame["has_testing"].any(), frame["has_checkpoint"].any())):
        if told is None and present:
            notes.append(f"whether timing_s/step includes timing_s/{timer} cannot be told from this log; "
                         "taken as included (verl up to 0.7)")
    if frame["busiest_after_balancing"].any():
        notes.append("verl balanced the batch across ranks: the training stages follow global_seqlen/balanced_max, "
                     "not global_seqlen/max; the imbalance before balancing does not set their time")
    caveats = semantics_notes(record)
    notes += caveats
    if untold:
        notes.append(UNTOLD)
    if frame["workload_basis"].is_null().all():
        notes.append("the log has no response lengths or token counts: every stage is fitted as a constant, so "
                     "long_tail, token_volume and dp_imbalance cannot be told apart from unexplained time")
    return Explanation(
        run=info.name, basis="seconds", steps=step_rows, findings=findings[:top] if top else findings,
        notes=notes, slow_rule=slow_rule, expected_s=expected,
        run_seconds=run_seconds,
        slow_steps=int(slow.height), model=model, bounds=bounds, caveats=caveats,
    )


def _rollout_side(frame: pl.DataFrame, mask: pl.Series) -> dict:
    """What the rollout side did, for a `rollout_wait` cause: per (segment, step) its busy seconds
    (rollout_s) and longest response (r_max), and their medians over the training steps (key None)."""
    if "rollout_s" not in frame.columns or frame["trainer_wait_s"].is_null().all():
        return {}
    columns = frame.select("segment", "step", "rollout_s", "r_max")
    trained = columns.filter(mask)
    out = {(row["segment"], row["step"]): (row["rollout_s"], row["r_max"]) for row in columns.iter_rows(named=True)}
    out[None] = (trained["rollout_s"].median(), trained["r_max"].median())
    return out


def _step_row(row: dict, mine: pl.DataFrame, detail: dict[int, dict], slow: bool, rollout: dict | None = None) -> dict:
    """One step of the JSON: its seconds and its causes, those standing out from their usual level
    first, each group largest first. A `rollout_wait` cause carries the rollout side's busy seconds and
    longest response at the step beside their typical values (`_rollout_side`): what the wait came from."""
    listed = []
    for cause in mine.sort(["stands_out", "seconds"], descending=True).iter_rows(named=True):
        entry = {"cause": cause["cause"], "seconds": cause["seconds"], "stage": cause["stage"],
                 "stands_out": cause["stands_out"]}
        more = detail.get(row["step"])
        if more and cause["cause"] == "long_tail" and cause["seconds"] > 0:
            entry["samples"] = more["tail_samples"]
        if more and cause["cause"] == "dp_imbalance" and cause["seconds"] > 0 and more["busiest_rank"]:
            entry["rank"] = more["busiest_rank"]
        if cause["cause"] == "rollout_wait" and rollout:
            (busy, longest), (usual_busy, usual_longest) = rollout.get((row["segment"], row["step"]), (None, None)), \
                rollout[None]
            entry["rollout"] = {"rollout_s": busy, "typical_rollout_s": usual_busy, "r_max": longest,
                                "typical_r_max": usual_longest}
        listed.append(entry)
    return {"step": row["step"], "segment": row["segment"], "seconds": row["seconds"],
            "expected_s": row["expected_s"], "excess_s": row["excess_s"], "slow": slow, "causes": listed}


def _explain_tokens(con, info, frame: pl.DataFrame, step: int | None, top: int | None,
                    notes: list[str]) -> Explanation:
    lengths = frame.filter(pl.col("r_max").is_not_null() & ~pl.col("validation_only"))
    r_max = lengths["r_max"].to_numpy()
    gap = (lengths["busiest_rank_tokens"] - lengths["mean_rank_tokens"]).to_numpy()
    tail_rule = Threshold.robust(r_max)
    has_ranks = bool(np.nanmax(gap, initial=0) > 0)
    gap_rule = Threshold.robust(gap) if has_ranks else None
    typical_r = tail_rule.median
    typical_gap = gap_rule.median if gap_rule else 0.0
    tail_flags = tail_rule.above(r_max, np.full(r_max.size, typical_r))
    gap_flags = (gap_rule.above(gap, lengths["mean_rank_tokens"].to_numpy()) if gap_rule
                 else np.zeros(r_max.size, dtype=bool))
    flagged = tail_flags | gap_flags
    too_few = lengths.height < MIN_TRAINING_STEPS
    if too_few:
        flagged[:] = False
        tail_flags[:], gap_flags[:] = False, False
        notes.append(f"{lengths.height} step{' is' if lengths.height == 1 else 's are'} too few for a robust "
                     f"threshold (it needs {MIN_TRAINING_STEPS}): every step is listed and none is called unusual")
    if step is not None:
        chosen = lengths.filter(pl.col("step") == step)
    else:
        chosen = lengths if too_few else lengths.filter(pl.Series(flagged))
    if step is None and not too_few:
        chosen = chosen.sort("r_max", descending=True)
        if top is not None:
            chosen = chosen.head(top)
    detail = sample_detail(con, info.run_id, chosen["step"].to_list())
    step_rows = []
    for row in chosen.iter_rows(named=True):
        causes = [{"cause": "long_tail", "tokens": row["r_max"] - typical_r, "stage": "gen",
                   "r_max": row["r_max"]}]
        if has_ranks:
            causes.append({"cause": "dp_imbalance", "tokens": row["busiest_rank_tokens"] - row["mean_rank_tokens"]
                           - typical_gap, "stage": "gen",
                           "busiest_over_mean": row["busiest_rank_tokens"] / row["mean_rank_tokens"]})
        more = detail.get(row["step"])
        if more:
            causes[0]["samples"] = more["tail_samples"]
            if has_ranks and more["busiest_rank"]:
                causes[1]["rank"] = more["busiest_rank"]
        causes.sort(key=lambda c: c["tokens"], reverse=True)
        slow = bool(flagged[(lengths["step"] == row["step"]).to_numpy()].any())
        ranked = bool(row["per_rank_data"])
        step_rows.append({"step": row["step"], "segment": row["segment"], "seconds": None, "expected_s": None,
                          "excess_s": None, "slow": slow, "r_max": row["r_max"],
                          "busiest_rank_tokens": row["busiest_rank_tokens"] if ranked else None,
                          "mean_rank_tokens": row["mean_rank_tokens"] if ranked else None, "causes": causes})
    findings = []
    tail_steps = lengths.filter(pl.Series(tail_flags))["step"].to_list()
    if tail_steps:
        longest = float(np.max(r_max))
        findings.append({"cause": "long_tail", "seconds": None, "share": None, "steps": tail_steps,
                         "tokens": float(np.sum(r_max[tail_flags] - typical_r)),
                         "text": f"{len(tail_steps)} step{'s' if len(tail_steps) != 1 else ''} had a longest "
                                 f"response far above the typical {typical_r:,.0f} tokens (up to {longest:,.0f})"})
    if has_ranks:
        ratio = (lengths["busiest_rank_tokens"] / lengths["mean_rank_tokens"]).to_numpy()
        worst = int(np.nanargmax(ratio))
        findings.append({"cause": "dp_imbalance", "seconds": None, "share": None,
                         "steps": lengths.filter(pl.Series(gap_flags))["step"].to_list(),
                         "tokens": float(np.nansum(gap)),
                         "text": f"the busiest DP rank held {np.nanmedian(ratio):.2f}× the mean rank's tokens in a "
                                 f"typical step (worst {ratio[worst]:.2f} at step {lengths['step'][worst]})"})
    rule = (f"longest response > median + {ROBUST_Z}·{MAD_SCALE}·MAD = {tail_rule.value:,.0f} tokens"
            + (f"; busiest − mean rank tokens > {gap_rule.value:,.0f}" if gap_rule else ""))
    return Explanation(run=info.name, basis="tokens", steps=step_rows, findings=findings[:top] if top else findings,
                       notes=notes, slow_rule=None if too_few else rule, slow_steps=int(flagged.sum()))
