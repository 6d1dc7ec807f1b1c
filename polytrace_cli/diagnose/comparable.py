"""Whether two sides of a comparison (two runs, or two windows of runs) compare like for like, and why not.

Every comparison of step times reads this first: `explain --against`, `compare`, `check --baseline`,
the report's runs of one task compared and `watch --baseline`. A side's profile holds what decides it:

    framework   runs.framework (verl, trl, openrlhf, ...)
    model       runs.model, else the run meta's `model` (verl's actor_rollout_ref.model.path,
                OpenRLHF's --pretrain)
    estimator   the run meta's `adv_estimator` (verl's algorithm.adv_estimator, OpenRLHF's
                --advantage_estimator)
    critic      whether the run trains a critic: it times a critic stage (values, update_critic) or
                logs a key only a critic writes (one its format names CRITIC_ONLY)
    gpus        the run meta's GPU count (n_gpus, else nnodes × n_gpus_per_node), else the DP ranks
    stages      the stages it times that have a workload line (gen, reward, old_log_prob, ref,
                values, adv, update_actor, update_critic), or `whole_step` when it times none;
                overheads (testing, save_checkpoint, update_weights) and `other` are not stages
                here: they are compared as frequency × cost
    per_rank    whether its steps carry per-rank data (global_seqlen or per-rank samples), without
                which a rank's tokens are total / ranks and DP imbalance cannot be told

Two sides differ where both profiles know a fact and the facts disagree (an unknown model is no
difference); each difference is named with both values. A stage timed by one side only is its own
cause (`stage_only_in_a`, `stage_only_in_b`), never an efficiency: whatever the other side spent on
it hides in its `other` time.

A percentage of change is only given over a base that is not near zero: `relative_change(new, old,
floor)` is (new − old) / |old| when |old| ≥ floor, else None.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb
import polars as pl

from polytrace_cli.model import MODELLED_STAGES, run_info
from polytrace_cli.store.sql import fetch_first

# Stages with a workload line that a comparison judges; the overheads and `other` are compared otherwise.
LINED_STAGES = tuple(stage for stage in MODELLED_STAGES if stage != "update_weights")
CRITIC_STAGES = ("values", "update_critic")
# The canonical name the formats give keys only a run that trains a critic logs (verl's value metrics and
# critic worker, OpenRLHF's critic loss; each framework's names.py).
CRITIC_ONLY = "critic_only"
DIFFERENCE_KINDS = ("framework", "algorithm", "estimator", "model", "gpus", "stages")


@dataclass(frozen=True)
class Profile:
    """What decides whether a side compares with another (see the module docstring)."""

    label: str
    framework: str | None = None
    model: str | None = None
    estimator: str | None = None
    critic: bool = False
    gpus: int | None = None
    stages: tuple[str, ...] = ()
    per_rank: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The profile as JSON-ready values."""
        return {"label": self.label, "framework": self.framework, "model": self.model, "estimator": self.estimator,
                "critic": self.critic, "gpus": self.gpus, "stages": list(self.stages), "per_rank": self.per_rank}


@dataclass(frozen=True)
class Difference:
    """One way two sides differ: its kind (`DIFFERENCE_KINDS`), each side's value, and the sentence."""

    kind: str
    a: Any
    b: Any
    text: str

    def to_dict(self) -> dict[str, Any]:
        """The difference as JSON-ready values."""
        return {"kind": self.kind, "a": self.a, "b": self.b, "text": self.text}


@dataclass(frozen=True)
class Comparability:
    """Whether two sides compare: their profiles and every difference found (none: they compare)."""

    a: Profile
    b: Profile
    differences: tuple[Difference, ...] = field(default_factory=tuple)

    @property
    def comparable(self) -> bool:
        """True when the sides differ in nothing that `DIFFERENCE_KINDS` names."""
        return not self.differences

    @property
    def only_in_a(self) -> tuple[str, ...]:
        """Stages A times and B does not."""
        return tuple(s for s in self.a.stages if s not in self.b.stages)

    @property
    def only_in_b(self) -> tuple[str, ...]:
        """Stages B times and A does not."""
        return tuple(s for s in self.b.stages if s not in self.a.stages)

    @property
    def reasons(self) -> list[str]:
        """One sentence per difference."""
        return [d.text for d in self.differences]

    def summary(self) -> str:
        """One line: 'they compare' or the differences joined."""
        if self.comparable:
            return f"{self.b.label} and {self.a.label} compare: same framework, algorithm, model, GPUs and stages"
        return f"{self.b.label} and {self.a.label} do not compare like for like: " + "; ".join(self.reasons)

    def to_dict(self) -> dict[str, Any]:
        """`comparable`, the differences and both profiles, as JSON-ready values."""
        return {"comparable": self.comparable, "differences": [d.to_dict() for d in self.differences],
                "a": self.a.to_dict(), "b": self.b.to_dict()}


def _algorithm(profile: Profile) -> str:
    return "PPO with a critic" if profile.critic else "no critic"


def compare_profiles(a: Profile, b: Profile) -> Comparability:
    """Every difference between two profiles (see the module docstring), in `DIFFERENCE_KINDS` order."""
    found = []

    def known_and_different(kind: str, x, y, text: str) -> None:
        if x is not None and y is not None and x != y:
            found.append(Difference(kind, x, y, text))

    known_and_different("framework", a.framework, b.framework,
                        f"framework {b.framework} in {b.label} against {a.framework} in {a.label}")
    if a.critic != b.critic:
        with_critic, without = (a, b) if a.critic else (b, a)
        found.append(Difference("algorithm", _algorithm(a), _algorithm(b),
                                f"{with_critic.label} trains a critic and {without.label} does not"))
    known_and_different("estimator", a.estimator, b.estimator,
                        f"advantage estimator {b.estimator} in {b.label} against {a.estimator} in {a.label}")
    known_and_different("model", a.model, b.model, f"model {b.model} in {b.label} against {a.model} in {a.label}")
    known_and_different("gpus", a.gpus, b.gpus, f"{b.gpus} GPUs in {b.label} against {a.gpus} in {a.label}")
    if set(a.stages) != set(b.stages):
        only_a = [s for s in a.stages if s not in b.stages]
        only_b = [s for s in b.stages if s not in a.stages]
        parts = [f"{', '.join(only)} timed in {side.label} only" for only, side in ((only_b, b), (only_a, a)) if only]
        found.append(Difference("stages", list(a.stages), list(b.stages), "; ".join(parts)))
    return Comparability(a, b, tuple(found))


def timed_stages(frame: pl.DataFrame) -> tuple[str, ...]:
    """The stages with a workload line that the workload frame times on some step (`LINED_STAGES`),
    or ('whole_step',) when it times none but logs a step time."""
    stages = tuple(s for s in LINED_STAGES if f"{s}_s" in frame.columns and frame[f"{s}_s"].is_not_null().any())
    if stages:
        return stages
    return ("whole_step",) if "wall_s" in frame.columns and frame["wall_s"].is_not_null().any() else ()


def logs_critic_keys(con: duckdb.DuckDBPyConnection, run_id: int) -> bool:
    """Whether the run logged a key only a critic writes (one its format names `CRITIC_ONLY`)."""
    row = fetch_first(con, "SELECT EXISTS (SELECT 1 FROM named_step_metrics WHERE run_id = ? AND canonical = ?)",
                      [run_id, CRITIC_ONLY])
    return bool(row and row[0])


def _gpus(meta: dict, frame: pl.DataFrame) -> int | None:
    from polytrace_cli.model.workload import _ranks_from_meta

    gpus = _ranks_from_meta(meta)
    if gpus is not None:
        return gpus
    ranks = frame["ranks"].drop_nulls() if "ranks" in frame.columns else pl.Series(dtype=pl.Int64)
    return int(ranks.mode().sort()[0]) if ranks.len() else None


def _text(value) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def profile_of(con: duckdb.DuckDBPyConnection, run: str | int, label: str, frame: pl.DataFrame) -> Profile:
    """The profile of a side: the run's facts from its row and meta, its window's stages and per-rank
    data from `frame` (its workload frame, `model.read_workload`, cut to the window)."""
    info = run_info(con, run)
    row = fetch_first(con, "SELECT framework, model FROM runs WHERE run_id = ?", [info.run_id]) or (None, None)
    meta = info.meta
    stages = timed_stages(frame)
    critic = any(s in stages for s in CRITIC_STAGES) or logs_critic_keys(con, info.run_id)
    per_rank = bool("per_rank_data" in frame.columns and frame["per_rank_data"].fill_null(False).any())
    return Profile(label=label, framework=_text(row[0]) or _text(meta.get("framework")),
                   model=_text(row[1]) or _text(meta.get("model")), estimator=_text(meta.get("adv_estimator")),
                   critic=critic, gpus=_gpus(meta, frame), stages=stages, per_rank=per_rank)


def comparability(con_a: duckdb.DuckDBPyConnection, run_a: str | int, label_a: str, frame_a: pl.DataFrame,
                  con_b: duckdb.DuckDBPyConnection, run_b: str | int, label_b: str,
                  frame_b: pl.DataFrame) -> Comparability:
    """Whether side B (run_b's `frame_b`, read from con_b) compares with side A (see the module docstring)."""
    return compare_profiles(profile_of(con_a, run_a, label_a, frame_a), profile_of(con_b, run_b, label_b, frame_b))


def relative_change(new: float, old: float, floor: float) -> float | None:
    """(new − old) / |old|, or None when |old| is below `floor` (a percentage over a base near zero
    says nothing) or either is not finite."""
    import math

    if not (math.isfinite(new) and math.isfinite(old)) or abs(old) < max(floor, 1e-12):
        return None
    return (new - old) / abs(old)


def percent_text(change: float | None) -> str:
    """' (+12%)', ' (−3.4%)', or '' when there is no change to give."""
    if change is None:
        return ""
    text = f" ({change:+.1%})" if abs(change) < 0.1 else f" ({change:+.0%})"
    return text.replace("-", "−")


def runs_comparability(con: duckdb.DuckDBPyConnection, run_a: str, run_b: str, steps=None) -> Comparability:
    """Whether run B compares with run A over `steps` (a StepRange, None for every step): their profiles
    from each run's workload frame in the range (`model.read_workload`)."""
    from polytrace_cli.model import read_workload

    frames = []
    for run in (run_a, run_b):
        frame = read_workload(con, run)
        if steps is not None and steps.first is not None:
            frame = frame.filter(pl.col("step") >= steps.first)
        if steps is not None and steps.last is not None:
            frame = frame.filter(pl.col("step") <= steps.last)
        frames.append(frame)
    return compare_profiles(profile_of(con, run_a, run_a, frames[0]), profile_of(con, run_b, run_b, frames[1]))
