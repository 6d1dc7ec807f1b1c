"""Run-level findings: where the run's wall time went beyond its typical step, ranked by seconds.

Per cause:
- validation, checkpoint: every step that logged the overhead; seconds = Σ testing_s (or
  save_checkpoint_s);
- the other causes: the steps where the cause stands out from its usual level (slow or not: a
  weight sync 25 s slower than usual costs 25 s even on a light step), and the slow steps where it
  adds at least a quarter of the excess; seconds = Σ of the cause over those steps;
- dp_imbalance at its usual level (`typical: true`): Σ_k b_k · median(busiest − mean rank
  tokens) per step over every timed step, the imbalance the per-step causes count as typical;
share = seconds / Σ wall_s over the run's timed steps. Each finding carries one plain sentence.
On a run whose responses collapsed (the semantics record's collapse_step), the run's typical workload
is a median over both regimes: the long_tail and token_volume sentences then give the largest value
and the step the run collapsed from, never a ratio against that median.
"""

from __future__ import annotations

import polars as pl

from polytrace_cli.analyze.typical_step import cadence
from polytrace_cli.display import duration
from polytrace_cli.model import StepTimeModel
from polytrace_cli.model.fit import GAP_OF

# A cause is part of a slow step's story when it adds at least this share of the step's excess.
MAJOR_SHARE = 0.25


def _count(steps: list[int]) -> str:
    return f"{len(steps)} step{'s' if len(steps) != 1 else ''}"


def typical_imbalance(steps: pl.DataFrame, model: StepTimeModel, run_wall: float) -> dict | None:
    """The DP imbalance every step carries at its usual level, which the per-step causes leave out:
    per step Σ_k b_k · median(busiest − mean_rank_tokens) over the token-bound stages k, times the
    timed steps. None when the run's ranks are not known to differ (no gap) or no stage depends on
    the busiest rank."""
    feature = model.busiest_feature
    gap = model.typical.get(GAP_OF[feature], 0.0)
    slopes = {stage: fit.coefficients.get(feature, 0.0) for stage, fit in model.stages.items()}
    per_step = sum(b * gap for b in slopes.values())
    if gap <= 0 or per_step <= 0:
        return None
    stage = max(slopes, key=slopes.get)
    ratio = model.typical[feature] / model.typical["mean_rank_tokens"]
    step_list = steps["step"].to_list()
    counted = float(steps["steps_covered"].sum()) if "steps_covered" in steps.columns else len(step_list)
    balanced = " after balancing" if model.frame["busiest_after_balancing"].any() else ""
    finding = _finding("dp_imbalance", per_step * counted, run_wall, step_list,
                       f"DP imbalance at its usual level (busiest rank{balanced} {ratio:.2f}× the mean) costs "
                       f"{duration(per_step)} of every step, mostly in {stage}: {duration(per_step * counted)}")
    finding["typical"] = True
    return finding


def run_findings(steps: pl.DataFrame, causes: pl.DataFrame, frame: pl.DataFrame, slow: pl.DataFrame,
                 model: StepTimeModel, collapse_step: int | None = None) -> list[dict]:
    """Findings ranked by seconds (see the module docstring). `steps` is the decomposition's step
    frame, `causes` its per step × cause frame with `stands_out`, `slow` the slow steps, `model` the
    fitted model (typical workload and slopes), `collapse_step` the step the run's responses
    collapsed from (None: they did not)."""
    typical = model.typical
    # A row standing for k optimizer steps (TRL's `logging_steps`) counts k times.
    covered = frame.select("segment", "step", "steps_covered")
    steps = steps.join(covered, on=["segment", "step"], how="left", maintain_order="left").with_columns(
        pl.col("steps_covered").fill_null(1.0))
    run_wall = float((steps["seconds"] * steps["steps_covered"]).sum())
    findings = []
    usual_imbalance = typical_imbalance(steps, model, run_wall)
    if usual_imbalance:
        findings.append(usual_imbalance)
    for cause, column in (("validation", "testing_s"), ("checkpoint", "save_checkpoint_s")):
        rows = frame.filter((pl.col(column).fill_null(0) > 0) & pl.col("wall_s").is_not_null())
        if rows.height == 0:
            continue
        seconds = float(rows[column].sum())
        step_list = rows["step"].to_list()
        what = "validation" if cause == "validation" else "checkpoints"
        findings.append(_finding(cause, seconds, run_wall, step_list,
                                 f"{what} {cadence(step_list)} took {duration(seconds)}"))
    in_slow = causes.join(slow.select("segment", "step", "excess_s"), on=["segment", "step"], how="left")
    major = in_slow.filter(
        (pl.col("seconds") > 0) & ~pl.col("cause").is_in(["validation", "checkpoint"])
        & (pl.col("stands_out") | (pl.col("seconds") >= MAJOR_SHARE * pl.col("excess_s")).fill_null(False))
    )
    major = major.join(covered, on=["segment", "step"], how="left", maintain_order="left").with_columns(
        seconds=pl.col("seconds") * pl.col("steps_covered").fill_null(1.0))
    for (cause,), rows in major.group_by("cause", maintain_order=True):
        seconds = float(rows["seconds"].sum())
        step_list = sorted(rows["step"].to_list())
        at = frame.filter(pl.col("step").is_in(step_list))
        findings.append(_finding(cause, seconds, run_wall, step_list,
                                 _sentence(cause, seconds, step_list, at, rows, typical, model.busiest_feature,
                                           collapse_step)))
    findings.sort(key=lambda f: f["seconds"], reverse=True)
    return findings


def _finding(cause: str, seconds: float, run_wall: float, steps: list[int], text: str) -> dict:
    share = seconds / run_wall if run_wall > 0 else None
    if share is not None:
        text += f", {share:.1%} of the run" if share >= 0.0005 else ", under 0.1% of the run"
    return {"cause": cause, "seconds": seconds, "share": share, "steps": steps, "text": text}


def _sentence(cause: str, seconds: float, steps: list[int], at: pl.DataFrame, rows: pl.DataFrame,
              typical: dict[str, float], busiest: str, collapse_step: int | None = None) -> str:
    count, lost = _count(steps), duration(seconds)
    collapsed = f"the run's responses collapsed from step {collapse_step:,}" if collapse_step is not None else None
    if cause == "long_tail":
        longest = at["r_max"].max()
        usual = typical.get("r_max", float("nan"))
        against = collapsed or f"typical longest {usual:,.0f}"
        return f"long responses (up to {longest:,.0f} tokens, {against}) slowed {count} by {lost}"
    if cause == "token_volume":
        if collapsed:
            more = f" (up to {at['response_tokens'].max():,.0f} response tokens, {collapsed})"
        else:
            ratio = (at["response_tokens"] / typical["response_tokens"]).max() if "response_tokens" in typical else None
            more = f" (up to {ratio:.1f}× the typical response tokens)" if ratio is not None else ""
        return f"batches with more tokens than usual{more} slowed {count} by {lost}"
    if cause == "dp_imbalance":
        worst = (at[busiest] / at["mean_rank_tokens"]).max()
        usual = typical[busiest] / typical["mean_rank_tokens"]
        return (f"one DP rank held far more tokens than the others (busiest/mean up to {worst:.2f}, typically "
                f"{usual:.2f}) in {count}: {lost}")
    if cause == "weight_sync":
        return f"weight sync ran slower than usual in {count}: {lost} more"
    if cause == "rollout_wait":
        # What the rollout side did on those steps, beside the wait: its busy seconds and the longest response
        # (the rollout's tail), never a generation cause of the trainer's step.
        busy = at["rollout_s"].max() if "rollout_s" in at.columns else None
        longest = at["r_max"].max()
        detail = [f"the rollout busy up to {duration(busy)}" if busy is not None else None,
                  f"longest response up to {longest:,.0f} tokens (typical {typical['r_max']:,.0f})"
                  if longest is not None and "r_max" in typical else None]
        shown = "; ".join(part for part in detail if part)
        return (f"the trainer waited longer than usual for the rollout side in {count}: {lost} more"
                + (f" ({shown})" if shown else ""))
    if cause == "mode_switch":
        return f"the GPUs' switches between rollout and training ran slower than usual in {count}: {lost} more"
    if cause == "warmup":
        return f"warm-up ({count} at the start{' and after restarts' if at['segment'].max() else ''}) took {lost} more"
    stage = rows.group_by("stage").agg(pl.col("seconds").sum()).sort("seconds", descending=True)["stage"][0]
    verb = "ran slower than its workload explains" if len(steps) == 1 else "ran slower than their workload explains"
    return f"{count} {verb} (mostly in {stage}): {lost}"
