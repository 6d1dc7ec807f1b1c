"""What a run would have cost under another policy, from its fitted step-time model.

The run as it was is the model's own replay: for every timed training step, each modelled stage
at the step's logged workload (`StepTimeModel.predict`, the rest included), plus the step's logged
testing and checkpoint seconds; a validation-only step adds its logged wall time. `baseline_s` is
the sum over steps. A policy changes the workload, the schedule or the pipeline, the same model
predicts the run again, and saving_s = baseline_s − predicted_s. A saving therefore only comes
from a quantity in the model of a stage that sets the step's time: generation waits for the
longest response (b_tail · r_max) and for the token volume (b_vol · response_tokens); the forward
and update stages wait for the busiest DP rank (b_k · busiest_rank_tokens). `saving_se_s` is the
bootstrap standard error of the saving: the fitted steps and the logged overheads resampled, the
model refitted and the policy priced again on each draw (`simulate.uncertainty`; 0 for the exact
no-validation); a term the fit could not see bounds the saving instead (`RunContext.predict`).

The policies (their assumptions are the docstrings of the functions named `_policy_<name>`):

    balance              busiest_rank_tokens → mean_rank_tokens
    no-validation        no testing seconds, no validation-only steps (exact from the log)
    validate-every=K     testing on steps with step % K = 0 and on the last step, each at the
                         median logged testing seconds
    checkpoint-every=K   the same for checkpoints
    max-response-len=N   responses cut at N tokens
    partial-rollout=F    each step's rollout stops at the F quantile of its lengths, the rest is
                         carried to the next step
    one-step-off[=G]     rollout of step t+1 overlaps training of step t, a share G of the GPUs
                         (default 0.5) generating and 1 − G training
    gpu-split=G          an asynchronous run with a share G of its GPUs on the rollout side
    staleness=K          an asynchronous run whose rollout may run K model versions ahead
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import duckdb
import numpy as np
import polars as pl

from polytrace_cli.analyze.semantics import crash_clause, record_of, semantics_notes
from polytrace_cli.errors import PolytraceError
from polytrace_cli.jsontext import json_text
from polytrace_cli.model import StepTimeModel, fit_model, read_workload, run_info, training_mask
from polytrace_cli.model.fit import TRAINING_STAGES, float_values, values_or
from polytrace_cli.simulate.lengths import FITTED_BASIS, StepLengths, step_lengths
from polytrace_cli.simulate.uncertainty import bootstrap_contexts, bootstrap_standard_error

SCENARIO_COLUMNS = ("policy", "predicted_s", "saving_s", "saving_se_s", "saving_share", "note")
DEFAULT_ROLLOUT_SHARE = 0.5
# Largest share of a saving that a term the fit could not see may leave unknown (see RunContext.predict).
UNSEEN_TERM_TOLERANCE = 0.05
UNSEEN_RUN_TOLERANCE = 0.001


# Seconds below which the two ends of a saving's range print as one number (to 0.1 s): no range.
SAME_SECONDS = 0.05

@dataclass(frozen=True)
class Policy:
    """A parsed policy: its name and its value (K, N, F or G; None when it takes none)."""

    name: str
    value: float | None = None

    @property
    def text(self) -> str:
        """The policy as written on the command line."""
        if self.value is None:
            return self.name
        value = float(self.value)
        return f"{self.name}={int(value)}" if value.is_integer() else f"{self.name}={value:g}"


def parse_policy(text: str) -> Policy:
    """`NAME` or `NAME=VALUE` (see POLICY_HELP); a malformed policy is a PolytraceError."""
    match = re.fullmatch(r"\s*([a-z-]+)\s*(?:=\s*([0-9.eE+-]+)\s*)?", text)
    if not match:
        raise PolytraceError(f"--policy takes one of {POLICY_HELP}; not {text!r}")
    name, raw = match[1], match[2]
    if raw is None:
        if name not in _PLAIN_POLICIES:
            if name in _INTEGER_POLICIES | _SHARE_POLICIES:
                raise PolytraceError(f"--policy {name} needs a value: {name}=...")
            raise PolytraceError(f"unknown policy {name!r}; the policies are {POLICY_HELP}")
        return Policy(name)
    if name not in _INTEGER_POLICIES | _SHARE_POLICIES:
        raise PolytraceError(f"unknown policy {text!r}; the policies are {POLICY_HELP}")
    try:
        value = float(raw)
    except ValueError:
        raise PolytraceError(f"--policy {name} takes a number, not {raw!r}") from None
    least = 0 if name in _FROM_ZERO else 1
    if name in _INTEGER_POLICIES and (value < least or not value.is_integer()):
        raise PolytraceError(f"--policy {name} takes a whole number ≥ {least}, not {raw}")
    upper_ok = value < 1 if name in ("one-step-off", "gpu-split") else value <= 1
    if name in _SHARE_POLICIES and not (value > 0 and upper_ok):
        raise PolytraceError(f"--policy {name} takes a share between 0 and 1, not {raw}")
    return Policy(name, value)


@dataclass(frozen=True)
class Scenario:
    """A policy's predicted wall time and its saving against the replay (None when the run's data
    cannot support the number, with the reason in `note`), and per-stage seconds."""

    policy: str
    predicted_s: float | None
    saving_s: float | None
    saving_share: float | None
    stages: dict[str, float] = field(default_factory=dict)
    note: str | None = None
    saving_se_s: float | None = None

    def to_dict(self) -> dict:
        """{"policy", "predicted_s", "saving_s", "saving_share", "saving_se_s", "stages", "note"}."""
        return {"policy": self.policy, "predicted_s": self.predicted_s, "saving_s": self.saving_s,
                "saving_share": self.saving_share, "saving_se_s": self.saving_se_s, "stages": self.stages,
                "note": self.note}


@dataclass(frozen=True)
class WhatIfResult:
    """The replay of the run as it was (`baseline_s`, per stage), its logged wall time, the
    scenarios."""

    run: str
    steps: int
    actual_s: float
    baseline_s: float
    stages: dict[str, float]
    scenarios: list[Scenario]
    notes: list[str] = field(default_factory=list)  # what the run's semantics record says of its numbers

    def table(self) -> pl.DataFrame:
        """One row per scenario (columns `SCENARIO_COLUMNS`), the replay first; the replay's note
        carries the run's notes."""
        replay_note = "; ".join([f"logged wall time {self.actual_s:,.1f} s", *self.notes])
        rows = [("as logged (replay)", self.baseline_s, 0.0, 0.0, 0.0, replay_note)]
        rows += [(s.policy, s.predicted_s, s.saving_s, s.saving_se_s, s.saving_share, s.note) for s in self.scenarios]
        schema = {"policy": pl.String, "predicted_s": pl.Float64, "saving_s": pl.Float64, "saving_se_s": pl.Float64,
                  "saving_share": pl.Float64, "note": pl.String}
        return pl.DataFrame(rows, schema=schema, orient="row")

    def to_dict(self) -> dict:
        """{"run", "steps", "actual_s", "baseline_s", "stages", "scenarios": [...], "notes": [...]}."""
        return {"run": self.run, "steps": self.steps, "actual_s": self.actual_s, "baseline_s": self.baseline_s,
                "stages": self.stages, "scenarios": [s.to_dict() for s in self.scenarios], "notes": self.notes}

    def to_json(self) -> str:
        """JSON text of `to_dict`, as `polytrace whatif --json` prints it."""
        return json_text(self.to_dict())


@dataclass
class RunPlan:
    """Per training step, the seconds of each stage (`stages`, the model's stage names, the rest
    as `other`) and of each logged overhead; `validation_only_s` is the wall time of the
    validation-only steps. `total` adds them up; a pipeline policy may add a negative `overlap`."""

    steps: np.ndarray
    stages: dict[str, np.ndarray]
    testing: np.ndarray
    checkpoint: np.ndarray
    validation_only_s: float
    # Optimizer steps each row stands for (`steps_covered`: a TRL row logged every k steps holds their
    # mean); None: one each.
    covered: np.ndarray | None = None

    def by_stage(self) -> dict[str, float]:
        """Seconds per stage over the run, overheads included (they add up to `total`): Σ over rows of
        a stage's seconds × the steps the row stands for."""
        weights = self.covered if self.covered is not None else 1.0
        out = {name: float(np.sum(np.asarray(values) * weights)) for name, values in self.stages.items()}
        out["testing"] = float(self.testing.sum() + self.validation_only_s)
        out["save_checkpoint"] = float(self.checkpoint.sum())
        return out

    @property
    def total(self) -> float:
        """Σ over steps and stages."""
        return float(sum(self.by_stage().values()))

    def with_stages(self, stages: dict[str, np.ndarray]) -> "RunPlan":
        """The same schedule with other stage seconds."""
        return RunPlan(self.steps, stages, self.testing, self.checkpoint, self.validation_only_s, self.covered)


class NotSupported(Exception):
    """The run's data cannot support this policy's number; the message says why."""


@dataclass
class RunContext:
    """Everything a policy reads: the run, its workload frame (training steps only), fitted model,
    replay plan, and (loaded on demand) its response lengths."""

    con: duckdb.DuckDBPyConnection
    run_id: int
    meta: dict
    frame: pl.DataFrame
    model: StepTimeModel
    plan: RunPlan
    _lengths: StepLengths | None = None
    predicted_workload: pl.DataFrame | None = None
    caveats: list[str] = field(default_factory=list)
    training_scale: float | None = None
    # Workloads a policy derives from the frame and the lengths alone, by (policy, value): the
    # bootstrap's draws share the frame and the lengths, so they share these too.
    workloads: dict = field(default_factory=dict)

    def workload(self, key: tuple, derive: Callable[[], object]):
        """The workload `derive()` computes from the frame and the lengths, computed once per key."""
        if key not in self.workloads:
            self.workloads[key] = derive()
        return self.workloads[key]

    def predict(self, frame: pl.DataFrame) -> dict[str, np.ndarray]:
        """Per-stage seconds of the model at a modified workload frame.

        A fit drops a feature that did not vary over the fitted steps (always c): the stage's
        intercept a then holds its effect, a = a₀ + b·c with a₀, b ≥ 0, so b ∈ [0, a/c], and a
        policy that changes the feature by D = Σ (before − after) saves b·D more than the model
        says: between 0 and a·D/c. When these ranges together are wider than both
        UNSEEN_TERM_TOLERANCE of the saving the model's terms give and UNSEEN_RUN_TOLERANCE of
        the run, the number is unsupported (NotSupported, naming the range); otherwise it stands
        and `caveats` names the range."""
        predicted = self.model.predict(frame)
        self.predicted_workload = frame
        stages = {stage: predicted[f"{stage}_s"].to_numpy() for stage in self.model.stages}
        low = high = 0.0
        unseen = []
        for stage, fit in self.model.stages.items():
            for name in fit.dropped:
                if name not in frame.columns or not _changed(self.frame[name], frame[name]):
                    continue
                constant = self.model.typical.get(name, float("nan"))
                shift = float((self.frame[name].fill_null(constant) - frame[name].fill_null(constant)).sum())
                bound = fit.intercept * shift / constant if constant > 0 else float("inf") * np.sign(shift)
                low, high = low + min(0.0, bound), high + max(0.0, bound)
                unseen.append(f"{name} did not vary over the fitted steps (always {constant:,.0f}), so the model "
                              f"of {stage} cannot tell what changing it saves")
        if unseen and high - low >= SAME_SECONDS:  # a range that shows as one number says nothing
            partial = self.plan.total - self.plan.with_stages(stages).total
            span = f"between {partial + low:,.1f} s and {partial + high:,.1f} s"
            negligible = max(UNSEEN_TERM_TOLERANCE * abs(partial), UNSEEN_RUN_TOLERANCE * self.plan.total)
            if not high - low <= negligible:
                raise NotSupported(f"{'; '.join(unseen)}: the saving lies {span}")
            self.caveats.append(f"{'; '.join(unseen)}: the saving lies {span}")
        return stages

    def lengths(self) -> StepLengths:
        """Each training step's response lengths (see `simulate.lengths`)."""
        if self._lengths is None:
            self._lengths = step_lengths(self.con, self.run_id, self.frame, self.meta)
        return self._lengths


def _changed(before: pl.Series, after: pl.Series) -> bool:
    old, new = float_values(before), float_values(after)
    both = np.isfinite(old) & np.isfinite(new)
    return bool(np.any(np.abs(new[both] - old[both]) > 1e-9 * np.maximum(np.abs(old[both]), 1.0)))


def _overhead_cost(values: np.ndarray, what: str) -> float:
    logged = values[values > 0]
    if not logged.size:
        raise NotSupported(f"the run logs no {what}: its cost is unknown")
    return float(np.median(logged))


def _schedule(steps: np.ndarray, every: int) -> np.ndarray:
    """Steps with step % every == 0, and the last step (verl's test_freq / save_freq rule)."""
    scheduled = steps % every == 0
    if steps.size:
        scheduled[np.argmax(steps)] = True
    return scheduled


def _policy_balance(ctx: RunContext, policy: Policy) -> tuple[RunPlan, str | None]:
    """DP load perfectly balanced: every rank gets the mean rank's tokens, so the busiest rank the
    training stages follow (busiest_rank_tokens, or global_seqlen/balanced_max when verl's own
    balancing sets their time: `StepTimeModel.busiest_feature`) becomes mean_rank_tokens in every
    stage whose model uses it (the forward and update stages; generation, which waits for the
    longest response, is unchanged). The balancing itself is assumed free and not to change which
    responses are generated."""
    frame = ctx.frame
    feature = ctx.model.busiest_feature
    if not (frame[feature] > frame["mean_rank_tokens"]).any():
        raise NotSupported("no step logs a busiest DP rank above the mean rank (global_seqlen/max and "
                           "/mean, or per-sample DP ranks): the run's imbalance is unknown")
    balanced = frame.with_columns(**{name: pl.col("mean_rank_tokens")
                                     for name in {feature, "busiest_rank_tokens"}})
    note = "from the busiest rank after verl's balancing" if frame["busiest_after_balancing"].any() else None
    return ctx.plan.with_stages(ctx.predict(balanced)), note


def _policy_no_validation(ctx: RunContext, policy: Policy) -> tuple[RunPlan, str | None]:
    """No validation: the logged testing seconds of every step and the validation-only steps are
    removed; nothing else changes. Exact from the log."""
    plan = ctx.plan
    cut = record_of(ctx.con, ctx.run_id)["truncated_steps"]
    if cut and not (plan.testing.any() or plan.validation_only_s):
        raise NotSupported(f"no validation time survives: {len(cut)} step line(s) were cut short (wandb cuts "
                           "output.log lines at 4,096 characters), so the validation timers printed after the cut "
                           "are lost and the validation time is unknown")
    note = None if plan.testing.any() or plan.validation_only_s else "the run logs no validation"
    return RunPlan(plan.steps, plan.stages, np.zeros_like(plan.testing), plan.checkpoint, 0.0, plan.covered), note


def _policy_validate_every(ctx: RunContext, policy: Policy) -> tuple[RunPlan, str | None]:
    """Validation every K steps: on the steps with step % K = 0 and on the last step (verl's
    test_freq rule), each taking the median of the logged testing seconds; validation-only steps
    (e.g. before training) are kept as logged."""
    plan = ctx.plan
    cost = _overhead_cost(plan.testing, "validation")
    testing = np.where(_schedule(plan.steps, int(policy.value)), cost, 0.0)
    return RunPlan(plan.steps, plan.stages, testing, plan.checkpoint, plan.validation_only_s, plan.covered), \
        f"{int((testing > 0).sum())} validations at {cost:,.1f} s"


def _policy_checkpoint_every(ctx: RunContext, policy: Policy) -> tuple[RunPlan, str | None]:
    """A checkpoint every K steps: on the steps with step % K = 0 and on the last step (verl's
    save_freq rule), each taking the median of the logged checkpoint seconds."""
    plan = ctx.plan
    cost = _overhead_cost(plan.checkpoint, "checkpoint")
    checkpoint = np.where(_schedule(plan.steps, int(policy.value)), cost, 0.0)
    return RunPlan(plan.steps, plan.stages, plan.testing, checkpoint, plan.validation_only_s, plan.covered), \
        f"{int((checkpoint > 0).sum())} checkpoints at {cost:,.1f} s"


def _rank_tokens(frame: pl.DataFrame, total_tokens: np.ndarray) -> dict[str, np.ndarray]:
    """Rank token sums for a new step total: the mean scales with the total, and the busiest rank
    (as logged, and after verl's balancing) keeps its logged ratio to the mean."""
    old_total = float_values(frame["total_tokens"])
    ratio = np.where(old_total > 0, total_tokens / np.where(old_total > 0, old_total, 1.0), 1.0)
    return {name: frame[name].cast(pl.Float64).to_numpy() * ratio
            for name in ("mean_rank_tokens", "busiest_rank_tokens", "balanced_busiest_tokens") if name in frame.columns}


def _need_lengths(ctx: RunContext) -> StepLengths:
    lengths = ctx.lengths()
    if lengths.known < ctx.frame.height:
        raise NotSupported(f"{ctx.frame.height - lengths.known} of {ctx.frame.height} steps have no length "
                           "distribution (per-sample traces, or a logged mean, max and response count)")
    return lengths


def capped_workload(frame: pl.DataFrame, lengths: list[np.ndarray], cap: float) -> pl.DataFrame:
    """The workload frame with every response cut at `cap` tokens: r_max → min(r_max, cap);
    response_tokens and total_tokens − Σ max(len − cap, 0); rank sums scaled with the total."""
    cut = np.array([np.maximum(x - cap, 0.0).sum() for x in lengths])
    total = float_values(frame["total_tokens"]) - cut
    return frame.with_columns(
        r_max=pl.min_horizontal(pl.col("r_max"), pl.lit(cap)),
        response_tokens=pl.col("response_tokens") - pl.Series(cut),
        total_tokens=pl.Series(total),
        **{name: pl.Series(values) for name, values in _rank_tokens(frame, total).items()},
    )


def _policy_max_response_len(ctx: RunContext, policy: Policy) -> tuple[RunPlan, str | None]:
    """Responses cut at N tokens: r_max → min(r_max, N), response_tokens and total_tokens lose
    Σ max(len − N, 0) over the step's lengths, and the rank sums shrink with the total (the cut
    tokens assumed spread over the ranks in proportion to their load). The responses are otherwise
    the same (a shorter cap may change what the policy learns to write: not modelled)."""
    lengths = _need_lengths(ctx)
    changed = ctx.workload((policy.name, policy.value),
                           lambda: capped_workload(ctx.frame, lengths.lengths, float(policy.value)))
    return ctx.plan.with_stages(ctx.predict(changed)), f"lengths from {lengths.basis}"


def partial_rollout_workload(frame: pl.DataFrame, lengths: list[np.ndarray], share: float) -> tuple[pl.DataFrame, int]:
    """The workload frame under partial rollout (see `_policy_partial_rollout`), and how many
    responses are still unfinished after the last step."""
    n = frame["n_responses"].to_numpy()
    prompt_per_response = (frame["total_tokens"].to_numpy() - frame["response_tokens"].to_numpy()) / n
    carried_left, carried_full = np.empty(0), np.empty(0)
    columns = {name: np.zeros(frame.height) for name in ("r_max", "response_tokens", "total_tokens",
                                                          "n_responses")}
    for row, new in enumerate(lengths):
        horizon = float(np.quantile(new, share))
        left = np.concatenate([carried_left, new])
        full = np.concatenate([carried_full, new])
        decoded = np.minimum(left, horizon)
        done = left <= horizon
        columns["r_max"][row] = decoded.max()
        columns["response_tokens"][row] = decoded.sum()
        columns["n_responses"][row] = done.sum()
        columns["total_tokens"][row] = full[done].sum() + done.sum() * prompt_per_response[row]
        carried_left, carried_full = left[~done] - horizon, full[~done]
    changed = frame.with_columns(
        **{name: pl.Series(values) for name, values in columns.items()},
        **{name: pl.Series(values) for name, values in _rank_tokens(frame, columns["total_tokens"]).items()},
    )
    return changed, int(carried_left.size)


def _policy_partial_rollout(ctx: RunContext, policy: Policy) -> tuple[RunPlan, str | None]:
    """Partial rollout: step t's generation stops once its new responses reach h_t = the F
    quantile of their lengths. Every response still unfinished (new or carried from earlier steps)
    has decoded min(remaining, h_t) tokens this step and is carried on with the rest. Per step:
    r_max = the longest decoding this step, response_tokens = tokens decoded this step; the
    training stages see the responses that finished (full length, with the step's mean prompt),
    so n_responses and total_tokens are theirs and the rank sums scale with the total. Responses
    unfinished at the last step are dropped. Carried responses are one or more steps off-policy
    (their effect on learning is not modelled); lengths are as logged."""
    if "gen" not in ctx.model.stages:
        raise NotSupported("the run logs no generation time: the rollout cannot be modelled")
    lengths = _need_lengths(ctx)
    changed, unfinished = ctx.workload((policy.name, policy.value),
                                       lambda: partial_rollout_workload(ctx.frame, lengths.lengths, float(policy.value)))
    note = f"lengths from {lengths.basis}"
    if lengths.basis == FITTED_BASIS:
        note += (" (each step's F quantile then rests on the fitted shape, which a mean and a max do not pin "
                 "down: per-sample traces make it exact)")
    if unfinished:
        note += f"; {unfinished} responses unfinished at the end are dropped"
    return ctx.plan.with_stages(ctx.predict(changed)), note


def pipelined_wall(gen: np.ndarray, train: np.ndarray) -> float:
    """One-step-off over a run of T steps, rollout of step t+1 beside training of step t:
    gen_1 + Σ_{t<T} max(gen_{t+1}, train_t) + train_T (the serial parts not included)."""
    if not gen.size:
        return 0.0
    return float(gen[0] + np.maximum(gen[1:], train[:-1]).sum() + train[-1])


def split_generation(fixed: np.ndarray, tail: np.ndarray, volume: np.ndarray, switch: np.ndarray,
                     share: float) -> np.ndarray:
    """Generation on a share G of the GPUs, no longer colocated with training:
    fixed − switch + tail + volume / G. The tail (b_tail · r_max: the longest response decodes one
    token after another) does not shorten with more GPUs and does not lengthen with fewer; the volume
    (b_vol · response_tokens) is throughput-bound; the colocated engine's switch (waking, resharding,
    offloading: gen_s − generate_sequences_s) disappears."""
    return np.maximum(fixed - switch, 0.0) + tail + volume / share


def _policy_one_step_off(ctx: RunContext, policy: Policy) -> tuple[RunPlan, str | None]:
    """One-step-off pipeline: rollout of step t+1 runs during training of step t, on split GPUs: a
    share G generates (default 0.5) and 1 − G trains. Generation becomes
    `split_generation` of the model's terms: a_gen − switch + b_tail · r_max + b_vol · response_tokens / G,
    the switch being the logged gen_s − generate_sequences_s when verl logs generate_sequences (else
    kept, and the note says so). Each token stage becomes a_k + b_k · busiest_rank_tokens · S with S =
    `training_scale` when it is given (measured: the training stages' seconds on 1 − G of the GPUs over
    their seconds on all of them), else 1/(1 − G): each training rank holds 1/(1 − G) times the tokens,
    an assumption (the run cannot measure its training on fewer GPUs; less than linear scaling makes
    the pipeline faster than predicted). Reward and
    advantage are unchanged; the weight sync, the rest, validation and checkpoints stay serial.
    Over the run: wall = `pipelined_wall` + Σ serial, train_t = Σ of the training-side stages. The
    one-step staleness of the rollout is not modelled."""
    model = ctx.model
    if "gen" not in model.stages:
        raise NotSupported("the run logs no generation time: the pipeline cannot be modelled")
    share = DEFAULT_ROLLOUT_SHARE if policy.value is None else float(policy.value)
    frame = ctx.frame
    gen_fit = model.stages["gen"]
    busiest_feature = model.busiest_feature
    flat = [(stage, name) for stage, name in (("gen", "response_tokens"),
                                              *((s, busiest_feature) for s in TRAINING_STAGES))
            if stage in model.stages and name not in model.stages[stage].coefficients]
    if flat:
        stage, name = flat[0]
        raise NotSupported(f"the model of {stage} has no {name} term (not logged, or it did not vary over the "
                           "fitted steps), so its throughput-bound part cannot be told from its constant part")
    stages = {name: values.copy() for name, values in ctx.plan.stages.items()}
    volume = gen_fit.coefficients.get("response_tokens", 0.0) * values_or(
        frame["response_tokens"], model.typical.get("response_tokens", 0.0))
    logged_switch = float_values(frame["gen_s"]) - float_values(frame["generate_sequences_s"])
    switch = np.where(np.isfinite(logged_switch), np.maximum(logged_switch, 0.0), 0.0)
    stages["gen"] = split_generation(stages["gen"] - volume, np.zeros(frame.height), volume, switch, share)
    training_side = [s for s in ("reward", *TRAINING_STAGES, "adv") if s in stages]
    scale = ctx.training_scale if ctx.training_scale is not None else 1.0 / (1.0 - share)
    for stage in TRAINING_STAGES:
        if stage in stages:
            fit = model.stages[stage]
            busy = fit.coefficients.get(busiest_feature, 0.0) * values_or(
                frame[busiest_feature], model.typical.get(busiest_feature, 0.0))
            stages[stage] = stages[stage] + busy * (scale - 1.0)
    gen = stages["gen"]
    train = np.sum([stages[s] for s in training_side], axis=0) if training_side else np.zeros(frame.height)
    stages["overlap"] = np.zeros(frame.height)
    stages["overlap"][0] = pipelined_wall(gen, train) - gen.sum() - train.sum()
    tail = gen_fit.coefficients.get("r_max", 0.0) * values_or(frame["r_max"], model.typical.get("r_max", 0.0))
    decoding = float(tail.sum() + volume.sum())
    note = (f"{share:g} of the GPUs generate, {1 - share:g} train; the longest-response term is "
            f"{tail.sum() / decoding:.0%} of the fitted decoding and is not shortened, the token volume is "
            f"scaled by 1/{share:g}" if decoding > 0 else f"{share:g} of the GPUs generate, {1 - share:g} train")
    if np.isfinite(logged_switch).any():
        note += f"; the colocation switch ({float(switch.sum()):,.0f} s logged over the run) disappears"
    else:
        note += "; verl's generate_sequences is not logged, so the colocation switch inside gen is kept"
    if ctx.training_scale is None:
        note += f"; the training stages' token terms scaled by 1/{1 - share:g} (assumed, not measured)"
    else:
        note += f"; the training stages' token terms scaled by {scale:g} (as measured and given)"
    return ctx.plan.with_stages(stages), note


ASYNC_TRAINER_STAGES = ("reward", *TRAINING_STAGES, "adv")


def _async_setting(ctx: RunContext) -> tuple[float, int, str]:
    """(the rollout's share of the GPUs, the staleness limit, the mode) of an asynchronous run, from its
    printed config: rollout.n_gpus_per_node × rollout.nnodes against trainer.n_gpus_per_node ×
    trainer.nnodes; async_training.staleness_threshold (fully-async), 1 (one-step-off),
    trainer.v1.sampler.max_off_policy_threshold (the V1 modes)."""
    mode = ctx.frame["execution_mode"].drop_nulls()
    mode = mode[0] if mode.len() else "sync"
    if mode == "sync":
        raise NotSupported("the run is sync (colocated): price a pipeline with --policy one-step-off")
    meta = ctx.meta
    rollout = (meta.get("rollout_n_gpus_per_node") or 0) * (meta.get("rollout_nnodes") or 1)
    trainer = (meta.get("n_gpus_per_node") or 0) * (meta.get("nnodes") or 1)
    if not rollout or not trainer:
        raise NotSupported("the run's rollout and trainer GPUs are not printed (rollout.n_gpus_per_node, "
                           "trainer.n_gpus_per_node): its split cannot be told")
    limit = {"one-step-off": 1}.get(mode, meta.get("staleness_threshold", meta.get("max_off_policy_threshold")))
    if not isinstance(limit, (int, float)):
        raise NotSupported("the run's staleness limit is not printed (async_training.staleness_threshold)")
    return rollout / (rollout + trainer), int(limit), mode


def _pipeline(ctx: RunContext, plan: RunPlan, share: float, limit: int) -> tuple[np.ndarray, str]:
    """Per step, the step time `workload.async_pipeline.simulate` gives the run at another rollout share and
    staleness limit, from the replay's trainer stages C_s (on 1 − p0 of the GPUs) and the rollout's seconds
    R_s per batch (on p0): rollout_s when logged, else wait + C + rest (the rollout-bound steady state)."""
    from polytrace_cli.workload.async_pipeline import simulate

    p0, _, _ = _async_setting(ctx)
    stages = plan.stages
    train = np.sum([stages[s] for s in ASYNC_TRAINER_STAGES if s in stages], axis=0)
    rest = stages.get("other", np.zeros(train.size))
    sync = stages.get("update_weights", np.zeros(train.size)) + stages.get("switch", np.zeros(train.size))
    wait = stages.get("trainer_wait", np.zeros(train.size))
    logged = float_values(ctx.frame["rollout_s"]) if "rollout_s" in ctx.frame.columns else np.full(train.size, np.nan)
    source = "the logged rollout seconds"
    if not np.isfinite(logged).all():
        source = "the trainer's wait + its stages (rollout seconds not logged: taken as the rollout-bound steady state)"
        logged = np.where(np.isfinite(logged), logged, wait + train + rest)
    run = simulate(logged * p0, train * (1.0 - p0), rest, sync, share, limit)
    return run["step_s"], source


def _policy_async(ctx: RunContext, policy: Policy) -> tuple[RunPlan, str | None]:
    """Another rollout/trainer GPU split (`gpu-split=G`) or staleness limit (`staleness=K`) of an asynchronous
    run: the run is put through the pipeline (`workload.async_pipeline`) at its own split p0 and limit K0
    and at the new one, and the difference of the two pipelines' step times is added to the replay (a
    stage `pipeline`), so the model's error in replaying the pipeline cancels. Assumptions: the rollout's
    seconds scale as p0 / G and the trainer's as (1 − p0) / (1 − G) (linear scaling: a long tail that does
    not shorten with more GPUs makes more rollout GPUs worth less than predicted); the weight sync pauses
    the rollout; stale samples are waited for, never dropped; the staleness of the samples is not priced
    in learning."""
    p0, k0, mode = _async_setting(ctx)
    share = p0 if policy.name == "staleness" else float(policy.value)
    limit = int(policy.value) if policy.name == "staleness" else (1 if mode == "one-step-off" else k0)
    if policy.name == "staleness" and mode == "one-step-off":
        raise NotSupported("one-step-off is a staleness limit of 1 by construction: price fully-async instead")
    own, source = _pipeline(ctx, ctx.plan, p0, k0)
    other, _ = _pipeline(ctx, ctx.plan, share, limit)
    stages = {name: values.copy() for name, values in ctx.plan.stages.items()}
    stages["pipeline"] = other - own
    note = (f"the run as it ran: {p0:.2f} of the GPUs on the rollout, staleness limit {k0}; priced at {share:.2f} "
            f"and {limit}; R_s from {source}; rollout seconds × {p0:.2f}/{share:.2f}, trainer stages × "
            f"{1 - p0:.2f}/{1 - share:.2f} (linear scaling, assumed)")
    return ctx.plan.with_stages(stages), note


# Every policy, once: its name, what it takes after the name (`=K`, `=N`: a whole number ≥ 1; `=F`, `=G`: a
# share; in brackets: optional) and how it changes the run's plan.
POLICY_TABLE: tuple[tuple[str, str, Callable[[RunContext, Policy], tuple[RunPlan, str | None]]], ...] = (
    ("balance", "", _policy_balance),
    ("no-validation", "", _policy_no_validation),
    ("validate-every", "=K", _policy_validate_every),
    ("checkpoint-every", "=K", _policy_checkpoint_every),
    ("max-response-len", "=N", _policy_max_response_len),
    ("partial-rollout", "=F", _policy_partial_rollout),
    ("one-step-off", "[=G]", _policy_one_step_off),
    ("gpu-split", "=G", _policy_async),
    ("staleness", "=K", _policy_async),
)
POLICIES = {name: plan for name, _, plan in POLICY_TABLE}
POLICY_HELP = ", ".join(name + takes for name, takes, _ in POLICY_TABLE)
_INTEGER_POLICIES = {name for name, takes, _ in POLICY_TABLE if takes.strip("[]") in ("=K", "=N")}
_SHARE_POLICIES = {name for name, takes, _ in POLICY_TABLE if takes.strip("[]") in ("=F", "=G")}
_PLAIN_POLICIES = {name for name, takes, _ in POLICY_TABLE if not takes or takes.startswith("[")}
# Whole-number policies for which 0 is a value (a staleness limit of 0: no version ahead).
_FROM_ZERO = {"staleness"}


def run_context(con: duckdb.DuckDBPyConnection, run: str | int) -> tuple[RunContext, str, float, int]:
    """The run's policy context (training steps, fitted model, replay), its name, its logged wall time
    and its step count."""
    info = run_info(con, run)
    full = read_workload(con, info.run_id)
    timed = full.filter(pl.col("wall_s").is_not_null())
    steps = timed.filter(~pl.col("validation_only"))
    if steps.is_empty():
        raise PolytraceError(f"run {info.name!r} logs no step time or stage timer: nothing to replay"
                             f"{crash_clause(con, info.run_id)}")
    mask = training_mask(steps)
    if not mask.any():
        raise PolytraceError(f"run {info.name!r} has no steady training step to fit the model on")
    model = fit_model(steps, mask)
    predicted = model.predict(steps)
    plan = RunPlan(
        steps["step"].to_numpy(),
        {stage: predicted[f"{stage}_s"].to_numpy() for stage in model.stages},
        steps["testing_s"].fill_null(0).to_numpy(),
        steps["save_checkpoint_s"].fill_null(0).to_numpy(),
        float(timed.filter(pl.col("validation_only"))["wall_s"].sum()),
        steps["steps_covered"].to_numpy() if (steps["steps_covered"] != 1).any() else None,
    )
    ctx = RunContext(con, info.run_id, info.meta, steps, model, plan)
    return ctx, info.name, float((timed["wall_s"] * timed["steps_covered"]).sum()), steps.height


def whatif_run(con: duckdb.DuckDBPyConnection, run: str | int, policies: list[str | Policy],
               training_scale: float | None = None) -> WhatIfResult:
    """Predict the run's wall time under each policy against the replay (see the module docstring);
    `training_scale` is one-step-off's measured slowdown of the training stages' token terms on their
    share of the GPUs (1/(1 − G) when not given)."""
    parsed = [p if isinstance(p, Policy) else parse_policy(p) for p in policies]
    if not parsed:
        raise PolytraceError(f"name at least one --policy: {POLICY_HELP}")
    if training_scale is not None and not training_scale > 0:
        raise PolytraceError(f"the training scale is a positive factor, not {training_scale}")
    ctx, name, actual, steps = run_context(con, run)
    ctx.training_scale = training_scale
    baseline = ctx.plan.total
    scenarios = []
    draws: list[RunContext] | None = None
    for policy in parsed:
        ctx.predicted_workload, ctx.caveats = None, []
        try:
            plan, note = POLICIES[policy.name](ctx, policy)
        except NotSupported as reason:
            scenarios.append(Scenario(policy.text, None, None, None, {}, str(reason)))
            continue
        note = "; ".join([*([note] if note else []), *ctx.caveats]) or None
        predicted = plan.total
        saving = baseline - predicted
        if policy.name == "no-validation":
            error = 0.0
        else:
            draws = bootstrap_contexts(ctx) if draws is None else draws
            error = bootstrap_standard_error(_draw_savings(draws, ctx, policy))
        scenarios.append(Scenario(policy.text, predicted, saving, saving / baseline if baseline else None,
                                  plan.by_stage(), note, error))
    return WhatIfResult(name, steps, actual, baseline, ctx.plan.by_stage(), scenarios,
                        semantics_notes(record_of(con, ctx.run_id)))


def _draw_savings(draws: list[RunContext], ctx: RunContext, policy: Policy) -> list[float]:
    """The policy's saving on each bootstrap draw against the draw's own replay (a draw the policy
    cannot price is left out)."""
    savings = []
    for draw in draws:
        draw._lengths, draw.predicted_workload, draw.caveats = ctx._lengths, None, []
        try:
            plan, _ = POLICIES[policy.name](draw, policy)
        except NotSupported:
            continue
        savings.append(draw.plan.total - plan.total)
    return savings
