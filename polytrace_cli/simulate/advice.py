"""The parameters a "what would help" list proposes, chosen from the run's own data.

    max-response-len=N   N = the (1 − CUT_SHARE) quantile of the run's training response lengths
                         (per-sample traces, else the per-step fitted distributions of
                         `simulate.lengths`), rounded up to a whole token and never below the mean
                         response; proposed only when some response is longer than N, N is at least
                         the run's typical length (the median over steps of the mean response), and
                         the run's responses did not collapse (its semantics record's collapse_step):
                         a cap read from collapsed lengths would cut the responses the run should write
    validate-every=K     when validation takes more than OVERHEAD_SHARE of the run's wall time:
                         K = k · ⌈share / TARGET_OVERHEAD_SHARE⌉ with k the logged interval (the median
                         gap between validating steps), so that validation falls to about
                         TARGET_OVERHEAD_SHARE; needs two validations to know k. The share it would
                         take is stated from the count verl's rule gives (every K-th step and the last)
    checkpoint-every=K   the same for checkpoints
    one-step-off=G       the rollout share among ONE_STEP_OFF_SHARES whose predicted wall time is the
                         lowest (`choose_rollout_share`, from the priced scenarios)

Each choice carries the sentence that says why, with the numbers it rests on.

`priced_policies` prices FIXED_POLICIES, the data-chosen ones and one-step-off at each of
ONE_STEP_OFF_SHARES (the best kept) on the run's step-time model, for the report's "what would help"
and `explain`'s levers alike.
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


def response_cap(lengths: list[np.ndarray | None], collapsed: bool = False) -> Choice | None:
    """max-response-len at the (1 − CUT_SHARE) quantile of the pooled lengths, never below their mean;
    None when no length is known, nothing would be cut, the run collapsed, or the cap would sit below the
    typical length (the median of the per-step mean lengths)."""
    known = [x for x in lengths if x is not None and len(x)]
    if not known or collapsed:
        return None
    pooled = np.concatenate(known)
    mean = float(pooled.mean())
    cap = max(math.ceil(float(np.quantile(pooled, 1.0 - CUT_SHARE))), math.ceil(mean))
    cut = float(np.mean(pooled > cap))
    typical = float(np.median([float(x.mean()) for x in known]))
    if cut == 0.0 or cap < typical:
        return None
    return Choice(f"max-response-len={cap}", f"cuts the longest {cut:.1%} of the responses (above {cap:,} tokens; "
                                             f"mean {mean:,.0f})")


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
    return Choice(f"{option}={proposed}", f"{name} every {every} steps takes {share:.1%} of the wall time; "
                                          f"every {proposed} ({scheduled} times) about {after:.1%}")


def choose_rollout_share(savings: dict[float, float | None]) -> float | None:
    """The rollout share with the largest predicted saving (None when none is priced)."""
    priced = {share: saving for share, saving in savings.items() if saving is not None}
    return max(priced, key=lambda share: (priced[share], -abs(share - 0.5))) if priced else None


def advised_policies(con: duckdb.DuckDBPyConnection, run: str | int) -> list[Choice]:
    """The data-chosen max-response-len, validate-every and checkpoint-every of a run with step
    timings (those its data supports; see the module docstring)."""
    from polytrace_cli.analyze.semantics import record_of
    from polytrace_cli.simulate.policies import run_context

    ctx, _, actual, _ = run_context(con, run)
    out = []
    lengths = ctx.lengths()
    cap = response_cap(lengths.lengths, collapsed=record_of(con, ctx.run_id)["collapse_step"] is not None)
    if cap is not None:
        out.append(cap)
    steps = ctx.plan.steps
    for seconds, name, option in ((ctx.plan.testing, "validation", "validate-every"),
                                  (ctx.plan.checkpoint, "checkpointing", "checkpoint-every")):
        choice = overhead_interval(steps, seconds, actual, name, option)
        if choice is not None:
            out.append(choice)
    return out


# The policies priced for every run with step timings; the data-chosen ones (`advised_policies`) are added.
FIXED_POLICIES = ("balance", "no-validation", "partial-rollout=0.9")


@dataclass(frozen=True)
class Priced:
    """The run's what-if (`simulate.WhatIfResult`) with one-step-off kept at its best share, and per
    policy why its parameter is what it is (the data-chosen ones and one-step-off)."""

    result: object
    scenarios: list
    why: dict[str, str]


def priced_policies(con: duckdb.DuckDBPyConnection, run: str | int) -> Priced:
    """FIXED_POLICIES, `advised_policies` and one-step-off at each of ONE_STEP_OFF_SHARES priced on the
    run's step-time model (`whatif_run`), one-step-off kept at the share of the GPUs with the largest
    predicted saving (all shares' first, with its note, when none is priced)."""
    from polytrace_cli import simulate

    why = {choice.policy: choice.why for choice in advised_policies(con, run)}
    policies = [*FIXED_POLICIES, *why, *(f"one-step-off={share:g}" for share in ONE_STEP_OFF_SHARES)]
    result = simulate.whatif_run(con, run, policies)
    splits = {float(s.policy.split("=")[1]): s for s in result.scenarios if s.policy.startswith("one-step-off=")}
    rest = [s for s in result.scenarios if not s.policy.startswith("one-step-off=")]
    best = choose_rollout_share({share: s.saving_s for share, s in splits.items()})
    if best is None:
        scenarios = [*rest, next(iter(splits.values()))] if splits else rest
    else:
        tried = ", ".join(f"{share:g}" for share in splits)
        why[splits[best].policy] = f"{best:g} of the GPUs generating: the lowest predicted wall time of {tried}"
        scenarios = [*rest, splits[best]]
    return Priced(result, scenarios, why)


# A lever saves at least this share of the run (the report's table holds its rows to the same).
MIN_LEVER_SHARE = 0.005


def levers(con: duckdb.DuckDBPyConnection, run: str | int, top: int = 3) -> list[dict]:
    """The `top` policies of `priced_policies` that save the most, each at least MIN_LEVER_SHARE of the run,
    largest first: `{policy, saving_s, saving_se_s, saving_share, why, note}`."""
    priced = priced_policies(con, run)
    saving = [s for s in priced.scenarios if s.saving_s is not None and (s.saving_share or 0) >= MIN_LEVER_SHARE]
    saving.sort(key=lambda s: -s.saving_s)
    return [{"policy": s.policy, "saving_s": s.saving_s, "saving_se_s": s.saving_se_s, "saving_share": s.saving_share,
             "why": priced.why.get(s.policy), "note": s.note} for s in saving[:top]]
