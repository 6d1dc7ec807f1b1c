"""What bounds a run, per window of steps: the rollout side, the trainer, or the overheads between them.

Read from the logged timers of the run's training steps (warm-up and restarts left out: a first step
waits for an empty queue), per step, with wall = the step's wall time (`wall_s`):

    wait_s          the trainer waiting for a trainable batch: trainer_wait_s (verl's timing_s/gen in
                    the modes where it is the wait, timing_s/wait_prev_gen, ...); 0 when not logged
    overhead_s      update_weights_s + switch_s: weight sync and the hybrid GPUs' mode switches, time in
                    which neither side computes
    rollout_idle_s  the rollout side idle in the step's window: wall − rollout_s − overhead_s (rollout_s:
                    its busy seconds for the step's data, verl's rollouter/active_time or one-step-off's
                    generate_sequences), ≥ 0; without rollout_s, rollout_idle_ratio · wall − overhead_s
                    from the logged ratio (said in `source`); unknown without either

Idle ratios are recomputed from those timers, not trusted: trainer idle = wait_s / wall, rollout idle =
1 − rollout_s / wall; the logged ratios stand beside them, and a note names a gap above 0.1.

The bound of a set of steps is the largest of the three means, with that mean as its seconds per step:

    rollout-bound   mean wait_s             the trainer waits while the rollout is busy
    train-bound     mean rollout_idle_s     the rollout idles (done early, or throttled by the
                                            staleness limit: either way the trainer sets the pace)
    overhead-bound  mean overhead_s         weight sync and switches exceed both

(`workload.async_pipeline.bound_of`, the rule the generator's truth is computed by.) A sync run
(generation, then training, on the same GPUs) has no overlap: its bound is the largest of generation
(gen_s: rollout-bound), the training stages (train-bound) and the weight sync (overhead-bound), each
its mean seconds per step.

Windows are WINDOW consecutive training steps (the last one takes the remainder when it holds at least
half a window, else joins the one before). Rules of thumb beside the bound, where the framework gives
one: one-step-off (verl docs/advance/one_step_off.md) — a high wait with long-tail lengths (the step's
longest response ≥ LONG_TAIL_RATIO × its mean) says shorten the tail (more rollout GPUs will not help);
with uniform lengths, add rollout GPUs. Every asynchronous mode (verl#7601's rule): trainer idle high
with rollout idle low says rollout is the bottleneck; both high says synchronization or data-pipeline
overhead; rollout idle high with trainer idle low says give the trainer more of the GPUs (verl
docs/advance/fully_async.md).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from polytrace_cli.semantics.execution_mode import ONE_STEP_OFF, SYNC
from polytrace_cli.workload.async_pipeline import BOUNDS, bound_of

WINDOW = 20
UNTOLD = ("what bounds the run cannot be told: its log holds neither the trainer's wait for a batch nor the "
          "rollout side's busy time or idle ratio")
LONG_TAIL_RATIO = 3.0
# An idle ratio is "high" above this share of the step (verl#7601's rule of thumb), and a logged ratio
# is said to disagree with the recomputed one beyond RATIO_GAP.
HIGH_IDLE, RATIO_GAP = 0.2, 0.1
TRAINING_STAGES = ("reward", "old_log_prob", "ref", "values", "adv", "update_actor", "update_critic")


def _values(frame: pl.DataFrame, name: str) -> np.ndarray:
    if name not in frame.columns:
        return np.full(frame.height, np.nan)
    return frame[name].cast(pl.Float64).fill_null(np.nan).to_numpy()


def _zero(values: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(values), values, 0.0)


def step_parts(frame: pl.DataFrame, mode: str) -> dict[str, np.ndarray]:
    """Per row of a workload frame: wait_s, overhead_s, rollout_idle_s (NaN: unknown), the recomputed and
    logged idle ratios, and for a sync run gen_s and train_s (see the module docstring)."""
    wall = _values(frame, "wall_s")
    overhead = _zero(_values(frame, "update_weights_s")) + _zero(_values(frame, "switch_s"))
    parts = {"wall_s": wall, "overhead_s": overhead}
    if mode == SYNC:
        parts["wait_s"] = _zero(_values(frame, "gen_s"))
        parts["rollout_idle_s"] = sum(_zero(_values(frame, f"{stage}_s")) for stage in TRAINING_STAGES)
        return parts
    wait = _zero(_values(frame, "trainer_wait_s"))
    rollout = _values(frame, "rollout_s")
    logged_rollout_ratio = _values(frame, "rollout_idle_ratio")
    from_busy = np.maximum(wall - rollout - overhead, 0.0)
    from_ratio = np.maximum(logged_rollout_ratio * wall - overhead, 0.0)
    parts.update(
        wait_s=wait,
        rollout_idle_s=np.where(np.isfinite(rollout), from_busy, from_ratio),
        trainer_idle_ratio=np.where(wall > 0, wait / wall, np.nan),
        rollout_idle_ratio=np.where(np.isfinite(rollout) & (wall > 0), 1.0 - rollout / wall, np.nan),
        logged_trainer_idle_ratio=_values(frame, "trainer_idle_ratio"),
        logged_rollout_idle_ratio=logged_rollout_ratio,
        rollout_s=rollout,
    )
    return parts


def _mean(values: np.ndarray) -> float | None:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else None


def _summary(frame: pl.DataFrame, parts: dict[str, np.ndarray], rows: np.ndarray, mode: str) -> dict:
    """The bound of the steps at `rows` (indices into the frame) with its seconds and parts."""
    pick = {name: values[rows] for name, values in parts.items()}
    wait, overhead = _mean(pick["wait_s"]) or 0.0, _mean(pick["overhead_s"]) or 0.0
    idle = _mean(pick["rollout_idle_s"])
    bound, seconds = bound_of(wait, idle if idle is not None else -1.0, overhead)
    steps = frame["step"].to_numpy()[rows]
    out = {"first_step": int(steps.min()), "last_step": int(steps.max()), "steps": int(rows.size),
           "bound": bound, "seconds_per_step": seconds, "step_s": _mean(pick["wall_s"])}
    if mode == SYNC:
        out.update(gen_s=wait, train_s=idle, overhead_s=overhead)
        return out
    out.update(wait_s=wait, rollout_idle_s=idle, overhead_s=overhead,
               trainer_idle_ratio=_mean(pick["trainer_idle_ratio"]),
               rollout_idle_ratio=_mean(pick["rollout_idle_ratio"]),
               logged_trainer_idle_ratio=_mean(pick["logged_trainer_idle_ratio"]),
               logged_rollout_idle_ratio=_mean(pick["logged_rollout_idle_ratio"]))
    if idle is None:
        out["bound"], out["seconds_per_step"] = bound_of(wait, -1.0, overhead)
    return out


def _windows(count: int) -> list[np.ndarray]:
    """Consecutive index blocks of WINDOW (the remainder a block of its own when ≥ WINDOW / 2)."""
    starts = list(range(0, count, WINDOW))
    blocks = [np.arange(start, min(start + WINDOW, count)) for start in starts]
    if len(blocks) > 1 and blocks[-1].size < WINDOW / 2:
        tail = blocks.pop()
        blocks[-1] = np.concatenate([blocks[-1], tail])
    return blocks


def _long_tailed(frame: pl.DataFrame, rows: np.ndarray) -> bool | None:
    r_max, tokens, n = (_values(frame, name)[rows] for name in ("r_max", "response_tokens", "n_responses"))
    ratio = r_max / (tokens / n)
    ratio = ratio[np.isfinite(ratio)]
    return bool(np.median(ratio) >= LONG_TAIL_RATIO) if ratio.size else None


def rule_of_thumb(summary: dict, mode: str, long_tailed: bool | None) -> str | None:
    """The framework's own advice for this bound (see the module docstring), or None."""
    if mode == SYNC:
        return None
    trainer_idle, rollout_idle = summary.get("trainer_idle_ratio"), summary.get("rollout_idle_ratio")
    if trainer_idle is None and summary.get("step_s"):
        trainer_idle = summary["wait_s"] / summary["step_s"]
    if rollout_idle is None and summary.get("rollout_idle_s") is not None and summary.get("step_s"):
        rollout_idle = (summary["rollout_idle_s"] + summary["overhead_s"]) / summary["step_s"]
    if summary["bound"] == "rollout-bound" and mode == ONE_STEP_OFF and long_tailed is not None:
        return ("verl one-step-off: a high wait_prev_gen with long-tail lengths says shorten the tail (stopping "
                "criteria, a lower length cap); more rollout GPUs will not help" if long_tailed else
                "verl one-step-off: a high wait_prev_gen with uniform lengths says add rollout GPUs")
    if trainer_idle is None or rollout_idle is None:
        return None
    if trainer_idle > HIGH_IDLE and rollout_idle > HIGH_IDLE:
        return ("both sides idle over a fifth of the step: synchronization or data-pipeline overhead, not either "
                "side's speed, bounds it (verl#7601)")
    if trainer_idle > HIGH_IDLE:
        return "trainer idle high, rollout idle low: rollout is the bottleneck; give it more of the GPUs (verl#7601)"
    if rollout_idle > HIGH_IDLE:
        return ("rollout idle high, trainer idle low: the trainer is the bottleneck; give it more of the GPUs, or "
                "allow more staleness (verl docs/advance/fully_async.md)")
    return None


def run_bounds(frame: pl.DataFrame, training: pl.Series, mode: str | None) -> dict | None:
    """{'mode', 'run': the run's bound, 'windows': one per WINDOW training steps, 'notes'}, each bound with
    its seconds per step and parts (module docstring); None without at least 2 timed training steps, or for
    an asynchronous run that logs neither side's timers (`UNTOLD`)."""
    mode = mode or SYNC
    mask = training.fill_null(False).to_numpy() & np.isfinite(_values(frame, "wall_s"))
    rows = np.flatnonzero(mask)
    if rows.size < 2:
        return None
    parts = step_parts(frame, mode)
    if mode != SYNC and not (np.isfinite(_values(frame, "trainer_wait_s")[rows]).any()
                             or np.isfinite(parts["rollout_idle_s"][rows]).any()):
        return None  # neither side's timers: what bounds the run cannot be told (UNTOLD)
    notes = []
    if mode != SYNC and not np.isfinite(parts["rollout_idle_s"][rows]).any():
        notes.append("the rollout side's busy time and idle ratio are not logged: train-bound cannot be told, so "
                     "the bound is the larger of the trainer's wait and the overheads")
    if mode != SYNC and not np.isfinite(parts["rollout_s"][rows]).any() \
            and np.isfinite(parts["logged_rollout_idle_ratio"][rows]).any():
        notes.append("the rollout's idle time is read from its logged idle ratio (its busy seconds are not logged)")
    run = _summary(frame, parts, rows, mode)
    run["rule"] = rule_of_thumb(run, mode, _long_tailed(frame, rows))
    for name, label in (("trainer_idle_ratio", "trainer"), ("rollout_idle_ratio", "rollout")):
        logged, recomputed = run.get(f"logged_{name}"), run.get(name)
        if logged is not None and recomputed is not None and abs(logged - recomputed) > RATIO_GAP:
            notes.append(f"the logged {label} idle ratio ({logged:.2f}) differs from the one its timers give "
                         f"({recomputed:.2f}): the timers' is used")
    windows = []
    for block in _windows(rows.size):
        window = _summary(frame, parts, rows[block], mode)
        window["rule"] = rule_of_thumb(window, mode, _long_tailed(frame, rows[block]))
        windows.append(window)
    return {"mode": mode, "run": run, "windows": windows, "notes": notes}


def bound_sentence(bounds: dict) -> str:
    """One line for the run's bound: 'rollout-bound: the trainer waits 41 s a step for the rollout side'."""
    run = bounds["run"]
    seconds = run["seconds_per_step"]
    if bounds["mode"] == SYNC:
        what = {"rollout-bound": "generation takes", "train-bound": "the training stages take",
                "overhead-bound": "weight sync takes"}[run["bound"]]
        return f"{run['bound']} (sync, no overlap): {what} {seconds:,.1f} s of a {run['step_s']:,.1f} s step"
    what = {"rollout-bound": "the trainer waits", "train-bound": "the rollout side idles",
            "overhead-bound": "weight sync and switches take"}[run["bound"]]
    return f"{run['bound']} ({bounds['mode']}): {what} {seconds:,.1f} s of a {run['step_s']:,.1f} s step"


def bound_finding(bounds: dict | None) -> tuple[float, float | None, int, list[int], str] | None:
    """An asynchronous run's bound as a finding: (seconds = its seconds per step × the steps it was measured
    on, share = its seconds per step / the mean step, the steps, their numbers, the sentence with the
    framework's rule of thumb); None for a sync run or without bounds."""
    if not bounds or bounds["mode"] == SYNC:
        return None
    run = bounds["run"]
    rule = f"; {run['rule']}" if run.get("rule") else ""
    steps = [step for window in bounds["windows"] for step in range(window["first_step"], window["last_step"] + 1)]
    share = run["seconds_per_step"] / run["step_s"] if run["step_s"] else None
    return run["seconds_per_step"] * run["steps"], share, run["steps"], steps, f"{bound_sentence(bounds)}{rule}"


__all__ = ["bound_finding", "BOUNDS", "WINDOW", "bound_sentence", "rule_of_thumb", "run_bounds", "step_parts"]
