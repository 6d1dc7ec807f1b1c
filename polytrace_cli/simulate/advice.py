"""The parameters a "what would help" list proposes, chosen from the run's own data.

    max-response-len=N   N = the (1 − CUT_SHARE) quantile of the run's training response lengths
                         (per-sample traces, else the per-step fitted distributions of
                         `simulate.lengths`), rounded up to a whole token and never below the mean
                         response; proposed only when some response is longer than N
    validate-every=K     when validation takes more than OVERHEAD_SHARE of the run's wall time:
                         K = k · ⌈share / TARGET_OVERHEAD_SHARE⌉ with k the logged interval (the median
                         gap between validating steps), so that validation falls to about
                         TARGET_OVERHEAD_SHARE; needs two validations to know k. The share it would
                         take is stated from the count verl's rule gives (every K-th step and the last)
    checkpoint-every=K   the same for checkpoints
    one-step-off=G       the rollout share among ONE_STEP_OFF_SHARES whose predicted wall time is the
                         lowest (`choose_rollout_share`, from the priced scenarios)

Each choice carries the sentence that says why, with the numbers it rests on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import duckdb
import numpy as np

CUT_SHARE = 0.05
OVERHEAD_SHARE = 0.05
TARGET_OVERHEAD_SHARE = 0.02
ONE_STEP_OFF_SHARES = (0.25, 0.375, 0.5, 0.625, 0.75)


@dataclass(frozen=True)
class Choice:
    """A proposed policy (as `--policy` takes it) and why its parameter is what it is."""

    policy: str
    why: str


def response_cap(lengths: list[np.ndarray | None]) -> Choice | None:
    """max-response-len at the (1 − CUT_SHARE) quantile of the pooled lengths, never below their mean;
    None when no length is known or nothing would be cut."""
    known = [x for x in lengths if x is not None and len(x)]
    if not known:
        return None
    pooled = np.concatenate(known)
    mean = float(pooled.mean())
    cap = max(math.ceil(float(np.quantile(pooled, 1.0 - CUT_SHARE))), math.ceil(mean))
    cut = float(np.mean(pooled > cap))
    if cut == 0.0:
        return None
    return Choice(f"max-response-len={cap}", f"cuts the longest {cut:.1%} of the responses (those above {cap:,} "
                                             f"tokens; the mean response is {mean:,.0f})")


def overhead_interval(steps: np.ndarray, seconds: np.ndarray, wall_s: float, name: str, option: str) -> Choice | None:
    """`option`=K for an overhead (testing or checkpoint seconds per step, 0 where none) taking more than
    OVERHEAD_SHARE of the wall time (see the module docstring); None otherwise."""
    logged = seconds > 0
    if wall_s <= 0 or logged.sum() < 2:
        return None
    share = float(seconds.sum()) / wall_s
    if share <= OVERHEAD_SHARE:
        return None
    every = int(np.median(np.diff(np.sort(steps[logged]))))
    if every < 1:
        return None
    proposed = every * math.ceil(share / TARGET_OVERHEAD_SHARE)
    # verl's rule: every K-th step and the last one
    scheduled = int(np.sum(steps % proposed == 0)) + int(steps.max() % proposed != 0)
    after = share * scheduled / int(logged.sum())
    return Choice(f"{option}={proposed}", f"{name} takes {share:.1%} of the run's wall time every {every} steps; "
                                          f"every {proposed} ({scheduled} times) it would take about {after:.1%}")


def choose_rollout_share(savings: dict[float, float | None]) -> float | None:
    """The rollout share with the largest predicted saving (None when none is priced)."""
    priced = {share: saving for share, saving in savings.items() if saving is not None}
    return max(priced, key=lambda share: (priced[share], -abs(share - 0.5))) if priced else None


def advised_policies(con: duckdb.DuckDBPyConnection, run: str | int) -> list[Choice]:
    """The data-chosen max-response-len, validate-every and checkpoint-every of a run with step
    timings (those its data supports; see the module docstring)."""
    from polytrace_cli.simulate.policies import run_context

    ctx, _, actual, _ = run_context(con, run)
    out = []
    lengths = ctx.lengths()
    cap = response_cap(lengths.lengths)
    if cap is not None:
        out.append(cap)
    steps = ctx.plan.steps
    for seconds, name, option in ((ctx.plan.testing, "validation", "validate-every"),
                                  (ctx.plan.checkpoint, "checkpointing", "checkpoint-every")):
        choice = overhead_interval(steps, seconds, actual, name, option)
        if choice is not None:
            out.append(choice)
    return out
