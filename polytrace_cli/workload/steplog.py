"""Per-step workloads and stage seconds of a verl run drawn from a known step-time model.

The model (one `StepTimeModel`), per training step s with its drawn workload:

    gen_s          = (a_gen + b_tail · r_max + b_vol · response_tokens) · warm-up · ε
    k_s            = (a_k + b_k · busiest_rank_tokens) · ε          for each token stage k
                     (old_log_prob, ref, update_actor; values, update_critic with a critic);
                     with `balance_batch` the batch is trained as verl balances it, and the
                     busiest rank is the one after balancing (global_seqlen/balanced_max)
    reward_s       = (a_reward + b_reward · n_responses) · ε
    adv_s          = a_adv · ε
    update_weights_s = weight_sync_s · ε                             (every step, when set)
    testing_s      = validate_s · ε        on validation steps (every `validate_every`, and the last step)
    save_checkpoint_s = checkpoint_s · ε   on checkpoint steps (every `checkpoint_every`, and the last step)
    step_s         = Σ stages + rest_s · ε (+ testing_s + save_checkpoint_s when `step_includes_overheads`)

ε is an independent lognormal(0, noise_sigma) factor per stage and step.

Drift and level shifts, for runs whose costs move for no workload reason:

    cost_drift     (stage, f): the stage's per-unit coefficients (b_tail and b_vol for gen, b_k for a
                   token stage, b_reward) are multiplied by 1 + (f − 1) · (s − 1) / (steps − 1): 1 on
                   step 1, f on the last step
    level_shifts   (step, stage, seconds): from that step on the stage takes `seconds` more (before ε;
                   a negative shift is floored so that the stage keeps at least 10 % of its time)
    rank_dispatch  which rank loads set the token stages' time: "contiguous" (verl's dispatch, logged as
                   global_seqlen/max), "balanced" (after verl's balance_batch, logged as
                   global_seqlen/balanced_max) or "even" (every rank at the mean: ideal balance)
    truncate_responses_at  every drawn response cut at this many tokens (the same draws as without it:
                   two logs that differ only in it differ only by the cut) Warm-up multiplies
generation on the first `warmup_steps` steps, by `warmup_slowdown` on step 1 falling linearly to 1,
and again from the first step after `resume_after` (the job stops after saving a checkpoint at that
step and is started again from it).

The workload of a step comes from a length model and `WorkloadSpec` (`synth.draw_step`: prompt
groups of n responses with drift and a cap). The groups are dealt to DP ranks in contiguous chunks
as verl's dispatch does; a rank's tokens are its prompt + response tokens (verl's `global_seqlen`).

Injected causes, (step, cause, size), change one step:

    long_tail     one response of the step becomes `size` tokens (default: the cap)
    token_volume  every response is multiplied by `size` (default 2), clipped at the cap
    dp_imbalance  the heaviest prompt groups go to rank 0 until busiest/mean reaches `size` (default 1.6)
    unexplained   generation takes `size` times (default 2) what its workload explains
    validation    a validation on this step taking `size` seconds (default validate_s)
    checkpoint    a checkpoint on this step taking `size` seconds (default checkpoint_s)
    weight_sync   the weight sync takes `size` more seconds (default 4 · weight_sync_s)
    warmup        generation is `size` times slower (default warmup_slowdown), as after a resume

The truth of a cause on a step (`cause_<cause>_s`) is the seconds its stage took with it minus
the seconds it would have taken without it, the rest of the step (noise included) unchanged;
`cause_<cause>_stage` names the stage holding it (for token_volume, which touches generation and
every token stage, the one holding most of it). Scheduled validation, checkpoints and warm-up
steps carry their truth too; natural variation of the workload carries none.

Two settings change every step, to write runs that differ from another in one factor:
`response_scale` multiplies every response (clipped at the cap) and `imbalance` deals every step's
prompt groups so that the busiest rank holds `imbalance` × the mean rank's tokens (as a balancing
that leaves that much imbalance would). They carry no per-step truth: they are the run's configuration.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from polytrace_cli.analyze.partition import lpt
from polytrace_cli.errors import PolytraceError
from polytrace_cli.workload.distributions import LengthModel
from polytrace_cli.workload.synth import WorkloadSpec, draw_step

CAUSES = ("long_tail", "token_volume", "dp_imbalance", "validation", "checkpoint", "weight_sync", "warmup",
          "unexplained")
TOKEN_STAGES = ("old_log_prob", "ref", "values", "update_actor", "update_critic")
# Stage columns in the order verl times them within a step.
STAGES = ("gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor",
          "update_weights", "testing", "save_checkpoint")
RANK_DISPATCHES = ("contiguous", "balanced", "even")
WORKLOAD_COLUMNS = ("r_max", "response_tokens", "total_tokens", "busiest_rank_tokens", "mean_rank_tokens",
                    "n_responses")


@dataclass(frozen=True)
class Injection:
    """A cause injected at one step; size None takes the cause's default (see the module docstring)."""

    step: int
    cause: str
    size: float | None = None


def parse_injection(text: str) -> Injection:
    """`STEP:CAUSE[:SIZE]`, e.g. `120:long_tail` or `40:dp_imbalance:1.8`."""
    match = re.fullmatch(r"\s*(\d+):([a-z_]+)(?::([0-9.eE+-]+))?\s*", text)
    if not match:
        raise PolytraceError(f"--inject takes STEP:CAUSE[:SIZE], not {text!r}")
    step, cause, size = int(match[1]), match[2], match[3]
    if cause not in CAUSES:
        raise PolytraceError(f"unknown cause {cause!r} in --inject {text!r} (known: {', '.join(CAUSES)})")
    try:
        value = float(size) if size is not None else None
    except ValueError:
        raise PolytraceError(f"the size in --inject {text!r} is not a number") from None
    return Injection(step, cause, value)


@dataclass(frozen=True)
class StepTimeModel:
    """The true coefficients (seconds, seconds per token or per response) and schedule of a run."""

    a_gen: float = 20.0
    b_tail: float = 0.012              # s per token of the step's longest response
    b_vol: float = 2.0e-5              # s per response token of the step
    token_stages: tuple[tuple[str, float, float], ...] = (
        ("old_log_prob", 5.0, 1.5e-5), ("ref", 5.0, 1.5e-5), ("update_actor", 10.0, 4.5e-5))
    a_reward: float = 2.0
    b_reward: float = 0.02             # s per response
    a_adv: float = 0.3
    weight_sync_s: float | None = 5.0  # None: the log has no timing_s/update_weights
    rest_s: float = 0.5
    noise_sigma: float = 0.03
    warmup_steps: int = 2
    warmup_slowdown: float = 1.8
    validate_every: int | None = None
    validate_s: float = 120.0
    validate_before_train: bool = True
    checkpoint_every: int | None = None
    checkpoint_s: float = 60.0
    step_includes_overheads: bool = True  # verl <= 0.7: timing_s/step includes testing and save_checkpoint
    balance_batch: bool = False        # trainer.balance_batch: the token stages follow the balanced busiest rank
    max_prompt_length: int = 2048
    injections: tuple[Injection, ...] = field(default_factory=tuple)
    resume_after: int | None = None    # the job stops after this step's checkpoint and resumes from it
    cost_drift: tuple[tuple[str, float], ...] = ()
    level_shifts: tuple[tuple[int, str, float], ...] = ()
    rank_dispatch: str = "contiguous"
    truncate_responses_at: int | None = None  # every response cut at this many tokens after it is drawn
    response_scale: float = 1.0        # every response of every step × this (clipped at the cap): longer answers
    imbalance: float | None = None     # every step: busiest rank / mean rank after balancing (None: verl's dispatch)
    # Asynchronous execution (`workload.async_pipeline`): the mode as verl prints it, the rollout's share of
    # the GPUs, the staleness limit in model versions, and the seconds of the hybrid GPUs' mode switches
    # per step (separate-async).
    mode: str = "sync"
    rollout_gpu_share: float = 0.5
    staleness_limit: int = 1
    switch_s: float | None = None

    def coefficients(self) -> dict:
        """The model as a JSON-able dict (what truth.json records)."""
        document = asdict(self)
        document["token_stages"] = {name: {"a": a, "b": b} for name, a, b in self.token_stages}
        document["injections"] = [asdict(i) for i in self.injections]
        document["cost_drift"] = {stage: factor for stage, factor in self.cost_drift}
        document["level_shifts"] = [{"step": step, "stage": stage, "seconds": seconds}
                                    for step, stage, seconds in self.level_shifts]
        return document


def _check(model: StepTimeModel, spec: WorkloadSpec) -> None:
    if model.mode not in MODES:
        raise PolytraceError(f"unknown execution mode {model.mode!r} (known: {', '.join(MODES)})")
    if model.mode != "sync":
        if model.injections or model.validate_every or model.checkpoint_every or model.resume_after:
            raise PolytraceError(f"a {model.mode} log is written without injected causes, validation, checkpoints "
                                 "or a resume (their truth is that of a colocated step)")
        if not 0.0 < model.rollout_gpu_share < 1.0:
            raise PolytraceError(f"--rollout-gpu-share is between 0 and 1, not {model.rollout_gpu_share}")
        if model.staleness_limit < 0:
            raise PolytraceError(f"--staleness-limit counts model versions, at least 0, not {model.staleness_limit}")
    if spec.steps < 1 or spec.batch < 1 or spec.n < 1 or spec.dp_ranks < 1:
        raise PolytraceError("steps, batch, n and dp ranks must all be at least 1")
    if spec.multiturn:
        raise PolytraceError("verl step logs are written for single-turn workloads; drop --multiturn")
    for every, name in ((model.validate_every, "--validate-every"), (model.checkpoint_every, "--checkpoint-every")):
        if every is not None and every < 1:
            raise PolytraceError(f"{name} must be at least 1, not {every}")
    unknown = {name for name, _, _ in model.token_stages} - set(TOKEN_STAGES)
    if unknown:
        raise PolytraceError(f"unknown token stage(s) {sorted(unknown)} (known: {', '.join(TOKEN_STAGES)})")
    if model.resume_after is not None and not 1 <= model.resume_after < spec.steps:
        raise PolytraceError(f"--resume-after must be a step before the last (1..{spec.steps - 1}), "
                             f"not {model.resume_after}")
    if model.rank_dispatch not in RANK_DISPATCHES:
        raise PolytraceError(f"unknown rank dispatch {model.rank_dispatch!r} (known: {', '.join(RANK_DISPATCHES)})")
    drifting = {stage for stage, _ in model.cost_drift} | {stage for _, stage, _ in model.level_shifts}
    if drifting - {"gen", "reward", "adv", *TOKEN_STAGES}:
        raise PolytraceError(f"drift and level shifts apply to gen, reward, adv and the token stages, not "
                             f"{sorted(drifting - {'gen', 'reward', 'adv', *TOKEN_STAGES})}")
    if not model.response_scale > 0:
        raise PolytraceError(f"response_scale is a positive multiplier, not {model.response_scale}")
    if model.imbalance is not None and model.rank_dispatch != "contiguous":
        raise PolytraceError("imbalance sets the loads of verl's dispatch: it needs rank_dispatch 'contiguous'")
    if model.balance_batch and (model.imbalance is not None or model.rank_dispatch == "even"):
        raise PolytraceError("balance_batch trains the balanced loads: it takes neither imbalance nor rank_dispatch 'even'")
    if model.imbalance is not None and not (spec.dp_ranks >= 2 and 1.0 < model.imbalance <= spec.dp_ranks):
        raise PolytraceError(f"imbalance is busiest/mean over at least 2 DP ranks, between 1 and {spec.dp_ranks}, "
                             f"not {model.imbalance}")
    for injection in model.injections:
        if injection.cause not in CAUSES:
            raise PolytraceError(f"unknown cause {injection.cause!r} (known: {', '.join(CAUSES)})")
        if not 1 <= injection.step <= spec.steps:
            raise PolytraceError(f"--inject step {injection.step} is outside the run's steps 1..{spec.steps}")
        if injection.cause == "dp_imbalance":
            if spec.dp_ranks < 2:
                raise PolytraceError("dp_imbalance needs at least 2 DP ranks (--dp-ranks)")
            size = injection.size if injection.size is not None else 1.6
            if not 1.0 < size <= spec.dp_ranks:
                raise PolytraceError(f"dp_imbalance size is busiest/mean, between 1 and {spec.dp_ranks}, not {size}")
        if injection.cause in ("token_volume", "unexplained", "warmup") and injection.size is not None \
                and injection.size <= 0:
            raise PolytraceError(f"{injection.cause} size is a positive multiplier, not {injection.size}")
        if injection.cause in ("validation", "checkpoint", "weight_sync") and injection.size is not None \
                and injection.size < 0:
            raise PolytraceError(f"{injection.cause} size is seconds, not {injection.size}")
        if injection.cause == "long_tail" and injection.size is not None and injection.size < 1:
            raise PolytraceError(f"long_tail size is the longest response in tokens, not {injection.size}")


def _rank_chunks(groups: int, ranks: int) -> list[np.ndarray]:
    """verl's dispatch: the batch split into `ranks` contiguous chunks of prompt groups."""
    return np.array_split(np.arange(groups), ranks)


def _imbalanced_chunks(group_tokens: np.ndarray, ranks: int, ratio: float) -> list[np.ndarray]:
    """Rank 0 takes the heaviest groups until its load reaches ratio × the mean rank load; the other
    ranks share the rest by longest-processing-time."""
    target = ratio * group_tokens.sum() / ranks
    order = np.argsort(-group_tokens, kind="stable")
    loads = np.cumsum(group_tokens[order])
    # The prefix whose load is closest to the target (at least one group, and one left for each other rank).
    take = int(np.clip(np.argmin(np.abs(loads - target)) + 1, 1, len(order) - (ranks - 1)))
    rest = order[take:]
    bins = [rest[np.array(b, dtype=np.int64)] for b in lpt(group_tokens[rest].tolist(), ranks - 1)]
    return [order[:take], *bins]


def _snake_loads(sequence_tokens: np.ndarray, ranks: int) -> np.ndarray:
    """Rank loads after balancing as verl's balance_batch does (equal sequence counts per rank): the
    sequences sorted longest first and dealt in snake order 0, 1, ..., k−1, k−1, ..., 0, 0, 1, ..."""
    ordered = np.sort(sequence_tokens)[::-1]
    position = np.arange(ordered.size) % (2 * ranks)
    rank = np.where(position < ranks, position, 2 * ranks - 1 - position)
    return np.bincount(rank, weights=ordered, minlength=ranks)


def _warmup_factor(model: StepTimeModel, step: int) -> float:
    """Generation slowdown of scheduled warm-up: warmup_slowdown on the first step of the job (step 1,
    and the step after `resume_after`), linearly down to 1 after warmup_steps."""
    started = step - model.resume_after if model.resume_after is not None and step > model.resume_after else step
    if model.warmup_steps < 1 or started > model.warmup_steps:
        return 1.0
    return 1.0 + (model.warmup_slowdown - 1.0) * (model.warmup_steps - started + 1) / model.warmup_steps


def _drift_factor(model: StepTimeModel, stage: str, step: int, steps: int) -> float:
    """The multiplier of a stage's per-unit coefficients on a step (`cost_drift`)."""
    for name, factor in model.cost_drift:
        if name == stage:
            return 1.0 + (factor - 1.0) * (step - 1) / max(steps - 1, 1)
    return 1.0


def _shifted(model: StepTimeModel, stage: str, step: int, seconds: float) -> float:
    """The stage's seconds with every level shift that started on or before the step (`level_shifts`)."""
    extra = sum(size for start, name, size in model.level_shifts if name == stage and step >= start)
    return max(seconds + extra, 0.1 * seconds)


def is_validation_step(model: StepTimeModel, step: int, steps: int) -> bool:
    """Scheduled validation: every validate_every steps and on the last step (verl's test_freq)."""
    return model.validate_every is not None and (step % model.validate_every == 0 or step == steps)


def is_checkpoint_step(model: StepTimeModel, step: int, steps: int) -> bool:
    """Scheduled checkpoint: every checkpoint_every steps and on the last step (verl's save_freq)."""
    return model.checkpoint_every is not None and (step % model.checkpoint_every == 0 or step == steps)


def step_table(length_model: LengthModel, spec: WorkloadSpec, model: StepTimeModel) -> pl.DataFrame:
    """One row per training step 1..spec.steps: the workload (`WORKLOAD_COLUMNS`, length statistics as
    verl logs them, per-rank loads), the true seconds per stage (`<stage>_s`, null when the stage did not
    run), `step_s`, and per cause `cause_<cause>_s` / `cause_<cause>_stage` (0 and null without it).
    Seeded by spec.seed: the workload, the noise and nothing else."""
    _check(model, spec)
    workload_rng = np.random.default_rng([spec.seed, 0])
    noise_rng = np.random.default_rng([spec.seed, 1])
    cap = spec.max_response_len
    by_step: dict[int, list[Injection]] = {}
    for injection in model.injections:
        by_step.setdefault(injection.step, []).append(injection)
    rows = []
    for step in range(1, spec.steps + 1):
        prompts, responses = draw_step(length_model, spec, workload_rng, step - 1)
        prompts = np.minimum(prompts, model.max_prompt_length)
        responses = responses.astype(np.int64)
        if model.truncate_responses_at is not None:
            responses = np.minimum(responses, model.truncate_responses_at)
        if model.response_scale != 1.0:
            scaled_run = np.maximum(np.rint(responses * model.response_scale), 1).astype(np.int64)
            responses = np.minimum(scaled_run, cap) if cap else scaled_run
        noise = np.exp(noise_rng.normal(0.0, model.noise_sigma, len(STAGES) + 1))
        eps = dict(zip((*STAGES, "rest"), noise.tolist()))
        injected = {i.cause: i.size for i in by_step.get(step, [])}
        causes = {cause: 0.0 for cause in CAUSES}
        stage_of = {cause: None for cause in CAUSES}

        def gen_model(resp: np.ndarray) -> float:
            drift = _drift_factor(model, "gen", step, spec.steps)
            seconds = model.a_gen + drift * (model.b_tail * float(resp.max()) + model.b_vol * float(resp.sum()))
            return _shifted(model, "gen", step, seconds)

        def rank_loads(resp: np.ndarray, chunks: list[np.ndarray]) -> np.ndarray:
            group_tokens = prompts * spec.n + resp.sum(axis=1)
            return np.array([group_tokens[c].sum() for c in chunks], dtype=np.int64)

        def token_seconds(busiest: float) -> dict[str, float]:
            return {name: _shifted(model, name, step, a + b * _drift_factor(model, name, step, spec.steps) * busiest)
                    * eps[name] for name, a, b in model.token_stages}

        # Workload causes, applied in a fixed order; each one's truth is measured against the workload
        # just before it.
        chunks = _rank_chunks(spec.batch, spec.dp_ranks)
        plain_responses = responses.copy()
        if "token_volume" in injected:
            size = injected["token_volume"] if injected["token_volume"] is not None else 2.0
            scaled = np.maximum(np.rint(responses * size), 1).astype(np.int64)
            responses = np.minimum(scaled, cap) if cap else scaled
        if "long_tail" in injected:
            size = injected["long_tail"]
            longest = int(size) if size is not None else (int(cap) if cap else 4 * int(responses.max()))
            if cap:
                longest = min(longest, int(cap))
            before_tail = responses.copy()
            responses = responses.copy()
            responses.flat[int(np.argmax(responses))] = max(longest, int(responses.max()))
        if model.imbalance is not None:
            chunks = _imbalanced_chunks(prompts * spec.n + responses.sum(axis=1), spec.dp_ranks, model.imbalance)
        if "dp_imbalance" in injected:
            size = injected["dp_imbalance"] if injected["dp_imbalance"] is not None else 1.6
            group_tokens = prompts * spec.n + responses.sum(axis=1)
            balanced_chunks = chunks
            chunks = _imbalanced_chunks(group_tokens, spec.dp_ranks, size)
        warm = _warmup_factor(model, step)
        if "warmup" in injected:
            warm *= injected["warmup"] if injected["warmup"] is not None else model.warmup_slowdown
        slower = 1.0
        if "unexplained" in injected:
            slower = injected["unexplained"] if injected["unexplained"] is not None else 2.0

        loads = rank_loads(responses, chunks)
        busiest, mean_load = float(loads.max()), float(loads.sum()) / spec.dp_ranks
        per_sequence = (np.repeat(prompts, spec.n) + responses.ravel()).astype(np.int64)
        balanced = _snake_loads(per_sequence, spec.dp_ranks)
        timing_busiest = busiest
        if model.balance_batch or ("dp_imbalance" not in injected and model.rank_dispatch == "balanced"):
            timing_busiest = float(max(balanced))
        elif "dp_imbalance" not in injected and model.rank_dispatch == "even":
            timing_busiest = mean_load
        seconds: dict[str, float | None] = {stage: None for stage in STAGES}
        seconds["gen"] = gen_model(responses) * warm * slower * eps["gen"]
        seconds.update(token_seconds(timing_busiest))
        reward_drift = _drift_factor(model, "reward", step, spec.steps)
        seconds["reward"] = _shifted(model, "reward", step, model.a_reward + reward_drift * model.b_reward
                                     * responses.size) * eps["reward"]
        seconds["adv"] = _shifted(model, "adv", step, model.a_adv) * eps["adv"]
        if model.weight_sync_s is not None or "weight_sync" in injected:
            extra = 0.0
            if "weight_sync" in injected:
                extra = injected["weight_sync"] if injected["weight_sync"] is not None else 4 * (model.weight_sync_s or 5.0)
                causes["weight_sync"], stage_of["weight_sync"] = extra, "update_weights"
            seconds["update_weights"] = (model.weight_sync_s or 0.0) * eps["update_weights"] + extra
        validation = is_validation_step(model, step, spec.steps) or "validation" in injected
        if validation:
            size = injected.get("validation")
            seconds["testing"] = size if size is not None else model.validate_s * eps["testing"]
            causes["validation"], stage_of["validation"] = seconds["testing"], "testing"
        checkpoint = (is_checkpoint_step(model, step, spec.steps) or "checkpoint" in injected
                      or step == model.resume_after)
        if checkpoint:
            size = injected.get("checkpoint")
            seconds["save_checkpoint"] = size if size is not None else model.checkpoint_s * eps["save_checkpoint"]
            causes["checkpoint"], stage_of["checkpoint"] = seconds["save_checkpoint"], "save_checkpoint"

        # Truth of each cause: this step's seconds minus the same step without the cause.
        if warm != 1.0:
            causes["warmup"], stage_of["warmup"] = gen_model(responses) * (warm - 1.0) * slower * eps["gen"], "gen"
        if slower != 1.0:
            causes["unexplained"], stage_of["unexplained"] = gen_model(responses) * warm * (slower - 1.0) * eps["gen"], "gen"
        if "long_tail" in injected:
            causes["long_tail"] = model.b_tail * float(responses.max() - before_tail.max()) * warm * slower * eps["gen"]
            stage_of["long_tail"] = "gen"
        if "dp_imbalance" in injected and not model.balance_batch:
            even = float(rank_loads(responses, balanced_chunks).max())
            by_stage = {name: b * _drift_factor(model, name, step, spec.steps) * (busiest - even) * eps[name]
                        for name, _, b in model.token_stages}
            causes["dp_imbalance"] = sum(by_stage.values())
            stage_of["dp_imbalance"] = max(by_stage, key=by_stage.get) if by_stage else None
        if "token_volume" in injected:
            # Measured on the scaled responses before a long tail on the same step, in verl's dispatch.
            scaled = before_tail if "long_tail" in injected else responses
            dispatch = _rank_chunks(spec.batch, spec.dp_ranks)
            extra_busiest = float(rank_loads(scaled, dispatch).max() - rank_loads(plain_responses, dispatch).max())
            by_stage = {"gen": (gen_model(scaled) - gen_model(plain_responses)) * warm * slower * eps["gen"]}
            by_stage.update({name: b * _drift_factor(model, name, step, spec.steps) * extra_busiest * eps[name]
                             for name, _, b in model.token_stages})
            causes["token_volume"] = sum(by_stage.values())
            stage_of["token_volume"] = max(by_stage, key=by_stage.get)

        step_s = sum(seconds[s] for s in STAGES if seconds[s] is not None and s not in ("testing", "save_checkpoint"))
        step_s += model.rest_s * eps["rest"]
        if model.step_includes_overheads:
            step_s += (seconds["testing"] or 0.0) + (seconds["save_checkpoint"] or 0.0)

        row = {
            "step": step,
            "r_max": int(responses.max()),
            "response_tokens": int(responses.sum()),
            "total_tokens": int(loads.sum()),
            "busiest_rank_tokens": int(loads.max()),
            "mean_rank_tokens": mean_load,
            "n_responses": int(responses.size),
            "min_rank_tokens": int(loads.min()),
            "balanced_min_rank_tokens": int(min(balanced)),
            "balanced_max_rank_tokens": int(max(balanced)),
            "response_length_mean": float(responses.mean()),
            "response_length_min": int(responses.min()),
            "response_clip_ratio": float(np.mean(responses >= cap)) if cap else 0.0,
            "prompt_length_mean": float(np.repeat(prompts, spec.n).mean()),
            "prompt_length_max": int(prompts.max()),
            "prompt_length_min": int(prompts.min()),
            "prompt_clip_ratio": float(np.mean(prompts >= model.max_prompt_length)),
            **{f"{stage}_s": seconds[stage] for stage in STAGES},
            "step_s": step_s,
            "is_validation": validation,
            "is_checkpoint": checkpoint,
            "is_warmup": warm != 1.0,
        }
        for cause in CAUSES:
            row[f"cause_{cause}_s"] = causes[cause]
            row[f"cause_{cause}_stage"] = stage_of[cause]
        rows.append(row)
    schema = {name: pl.Float64 for name in rows[0]}
    schema.update({name: pl.Int64 for name in ("step", "r_max", "response_tokens", "total_tokens", "busiest_rank_tokens",
                                               "n_responses", "min_rank_tokens", "balanced_min_rank_tokens",
                                               "balanced_max_rank_tokens", "response_length_min",
                                               "prompt_length_max", "prompt_length_min")})
    schema.update({name: pl.Boolean for name in ("is_validation", "is_checkpoint", "is_warmup")})
    schema.update({f"cause_{cause}_stage": pl.String for cause in CAUSES})
    frame = pl.DataFrame(rows, schema=schema, orient="row")
    return frame if model.mode == "sync" else _asynchronous(frame, model)


# Execution modes the generator writes, as verl prints them (`_asynchronous`, `metric_records`).
MODES = ("sync", "one-step-off", "fully-async", "separate-async")
TRAINER_STAGES = ("reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor")


def _asynchronous(frame: pl.DataFrame, model: StepTimeModel) -> pl.DataFrame:
    """The colocated steps run through the asynchronous pipeline (`async_pipeline.simulate`): generation on
    the rollout's share of the GPUs, the trainer stages on the rest, the staleness limit (one-step-off: 1).
    gen_s becomes null (the rollout's seconds are rollout_s) and the trainer stages take their seconds on
    the trainer's GPUs; the rows gain the pipeline's truth (wait, rollout busy and idle, idle ratios,
    staleness, bound and its seconds)."""
    from polytrace_cli.workload.async_pipeline import simulate

    limit = 1 if model.mode == "one-step-off" else model.staleness_limit
    share = model.rollout_gpu_share
    trainer = [c for c in TRAINER_STAGES if frame[f"{c}_s"].is_not_null().any()]
    train = sum(frame[f"{c}_s"].fill_null(0).to_numpy() for c in trainer)
    sync = frame["update_weights_s"].fill_null(0).to_numpy()
    switch = np.full(frame.height, model.switch_s or 0.0)
    rest = frame["step_s"].to_numpy() - frame["gen_s"].to_numpy() - train - sync
    run = simulate(frame["gen_s"].to_numpy(), train, rest, sync, share, limit, switch)
    scaled = {f"{c}_s": pl.col(f"{c}_s") / (1.0 - share) for c in trainer}
    return frame.with_columns(
        **scaled, gen_s=pl.lit(None, dtype=pl.Float64),
        trainer_wait_s=pl.Series(run["wait_s"]), rollout_s=pl.Series(run["rollout_s"]),
        rollout_active_s=pl.Series(run["rollout_active_s"]), rollout_idle_s=pl.Series(run["rollout_idle_s"]),
        rollout_idle_ratio=pl.Series(run["rollout_idle_ratio"]),
        trainer_idle_ratio=pl.Series(run["trainer_idle_ratio"]), staleness=pl.Series(run["staleness"]),
        throttled=pl.Series(run["throttled"] > 0), switch_s=pl.Series(switch),
        compute_s=pl.Series(run["compute_s"]), step_s=pl.Series(run["step_s"]),
        bound=pl.Series(run["bound"].tolist(), dtype=pl.String), bound_s=pl.Series(run["bound_s"]),
    )


def _async_records(row: dict, model: StepTimeModel, stale_so_far: float, batch_responses: int
                   ) -> tuple[list[tuple[str, float, str]], list[list[tuple[str, float, str]]]]:
    """(the timers of the step's metric line, further lines logged at the same step) as verl of the run's
    mode prints them: one-step-off's wait_prev_gen, generate_sequences (the rollout's own generation of
    the batch) and sync_rollout_weights inside the step (verl one_step_off_policy/ray_trainer.py,
    docs/advance/one_step_off.md); the fully async policy's gen (the wait) and idle ratio in the step
    line, its param_sync after the step and outside its total, and the rollouter's active time and idle
    ratio on their own line (fully_async_trainer.py, fully_async_rollouter.py, detach_utils.py); the V1
    trainer's gen (the wait), update_weights, switch_to_rollout and off-policy staleness
    (docs/advance/v1_async_trainer.md)."""
    stages = [(f"timing_s/{stage}", row[f"{stage}_s"], PLAIN) for stage in TRAINER_STAGES if row[f"{stage}_s"] is not None]
    wait, sync = row["trainer_wait_s"], row["update_weights_s"] or 0.0
    if model.mode == "one-step-off":
        timers = [("timing_s/wait_prev_gen", wait, PLAIN), ("timing_s/generate_sequences", row["rollout_s"], PLAIN),
                  ("timing_s/sync_rollout_weights", sync, PLAIN), *stages, ("timing_s/step", row["step_s"], PLAIN)]
        return timers, []
    if model.mode == "fully-async":
        logged_step = row["step_s"] - sync
        timers = [("timing_s/gen", wait, PLAIN), *stages, ("timing_s/step", logged_step, PLAIN),
                  ("fully_async/count/stale_samples_processed", stale_so_far, PLAIN),
                  ("fully_async/count/dropped_stale_samples", 0, PLAIN),
                  ("trainer/idle_ratio", wait / logged_step, PLAIN)]
        later = [[("timing_s/wait_last_valid", 0.0, PLAIN), ("timing_s/param_sync", sync, PLAIN)],
                 [("rollouter/active_time", row["rollout_active_s"], PLAIN),
                  ("rollouter/version_time", row["step_s"], PLAIN),
                  ("rollouter/idle_ratio", row["rollout_idle_ratio"], PLAIN)]]
        return timers, later
    staleness = row["staleness"]
    timers = [("timing_s/gen", wait, PLAIN), *stages, ("timing_s/update_weights", sync, PLAIN),
              *([("timing_s/switch_to_rollout", row["switch_s"], PLAIN)] if model.switch_s else []),
              ("timing_s/step", row["step_s"], PLAIN),
              ("training/off_policy/trajectory_staleness/mean", staleness, PLAIN),
              ("training/off_policy/trajectory_staleness/max", staleness, PLAIN),
              ("training/off_policy/trajectory_spans/max", 1, PLAIN)]
    return timers, []


# ---------------------------------------------------------------------------------------------------
# Writers: the frame as verl prints and files it.

LOG_FORMATS = ("verl-console", "verl-jsonl")
STYLES = ("repr", "fixed")   # verl >= 0.5 prints reprs (np.float64(...)); <= 0.4 prints every value with .3f
# A verl version class: (console style, whether timing_s/step includes testing and save_checkpoint).
VERL_VERSIONS = {"0.4": ("fixed", True), "0.5": ("repr", True), "0.8": ("repr", False)}
# A value's type as verl's metrics dict holds it, which decides its repr in a 0.5+ console line.
PLAIN, NP_FLOAT, NP_INT = "float", "np.float64", "np.int64"
CONSOLE_NAME = "train.log"
JSONL_NAME = "metrics.jsonl"
RAY_PREFIX = "(TaskRunner pid=27182) "
WORKER_PREFIX = "(WorkerDict pid=31415, ip=10.0.0.2) "


@dataclass
class StepLogResult:
    files: list[Path] = field(default_factory=list)
    steps: int = 0
    frame: pl.DataFrame | None = None
    notes: list[str] = field(default_factory=list)


def _learning_curves(steps: int, seed: int) -> dict[str, np.ndarray]:
    """Plausible learning metrics (independent of the timing truth): score rising from 0.25 towards
    0.6, entropy falling, small noisy losses. Drawn from their own seeded stream."""
    rng = np.random.default_rng([seed, 2])
    x = np.arange(1, steps + 1)
    rise = 1.0 - np.exp(-x / max(steps / 3.0, 1.0))
    score = np.clip(0.25 + 0.35 * rise + rng.normal(0, 0.02, steps), 0.0, 1.0)
    return {
        "score": score,
        "val_score": np.clip(score + 0.05 + rng.normal(0, 0.01, steps), 0.0, 1.0),
        "entropy": 0.6 - 0.3 * rise + rng.normal(0, 0.01, steps),
        "pg_loss": rng.normal(0.0, 0.02, steps),
        "pg_clipfrac": np.abs(rng.normal(0.002, 0.0005, steps)),
        "ppo_kl": np.abs(rng.normal(1e-4, 3e-5, steps)),
        "grad_norm": rng.lognormal(-1.0, 0.3, steps),
        "advantages_max": 2.0 + np.abs(rng.normal(0, 0.2, steps)),
        "mfu": np.clip(rng.normal(0.32, 0.02, steps), 0.01, 1.0),
        "memory_gb": 60.0 + rng.normal(0, 1.5, steps),
    }


def metric_records(frame: pl.DataFrame, spec: WorkloadSpec, model: StepTimeModel) -> list[tuple[int, list[tuple[str, float, str]]]]:
    """Per logged step, the (key, value, type) triples verl's trainer logs, in its order: balance
    metrics, actor updates, validation (on validation steps), step counters, data metrics, timings,
    throughput. A validation before training logs step 0 with the validation keys alone.

    perf/throughput = total_tokens / (time_per_step · n_gpus), n_gpus = dp_ranks · tp_size, so
    that n_gpus can be read back from the log as total_num_tokens / (throughput · time_per_step)."""
    curves = _learning_curves(frame.height, spec.seed)
    n_gpus = spec.dp_ranks * spec.tp_size
    val_key = f"val-core/{spec.task}/reward/mean@1"
    records: list[tuple[int, list[tuple[str, float, str]]]] = []
    stale = 0.0  # samples trained at least one model version stale, so far (fully async's counter)
    if model.validate_before_train and model.validate_every is not None:
        records.append((0, [(val_key, float(np.clip(curves["val_score"][0] - 0.1, 0, 1)), NP_FLOAT)]))
    for index, row in enumerate(frame.iter_rows(named=True)):
        c = {name: float(values[index]) for name, values in curves.items()}
        pairs: list[tuple[str, float, str]] = [
            ("global_seqlen/min", row["min_rank_tokens"], NP_INT),
            ("global_seqlen/max", row["busiest_rank_tokens"], NP_INT),
            ("global_seqlen/minmax_diff", row["busiest_rank_tokens"] - row["min_rank_tokens"], NP_INT),
            ("global_seqlen/balanced_min", row["balanced_min_rank_tokens"], NP_INT),
            ("global_seqlen/balanced_max", row["balanced_max_rank_tokens"], NP_INT),
            ("global_seqlen/mean", row["mean_rank_tokens"], NP_FLOAT),
            ("actor/entropy", c["entropy"], NP_FLOAT),
            ("actor/pg_loss", c["pg_loss"], NP_FLOAT),
            ("actor/pg_clipfrac", c["pg_clipfrac"], NP_FLOAT),
            ("actor/ppo_kl", c["ppo_kl"], NP_FLOAT),
            ("actor/grad_norm", c["grad_norm"], NP_FLOAT),
            ("perf/mfu/actor", c["mfu"], NP_FLOAT),
            ("perf/max_memory_allocated_gb", c["memory_gb"], NP_FLOAT),
            ("actor/lr", 1e-06, PLAIN),
        ]
        if row["is_validation"]:
            pairs.append((val_key, c["val_score"], NP_FLOAT))
        pairs += [
            ("training/global_step", row["step"], PLAIN),
            ("training/epoch", 0, PLAIN),
            ("critic/score/mean", c["score"], NP_FLOAT),
            ("critic/score/max", 1.0, NP_FLOAT),
            ("critic/score/min", 0.0, NP_FLOAT),
            ("critic/rewards/mean", c["score"], NP_FLOAT),
            ("critic/advantages/mean", 0.0, NP_FLOAT),
            ("critic/advantages/max", c["advantages_max"], NP_FLOAT),
            ("critic/advantages/min", -c["advantages_max"], NP_FLOAT),
            ("response_length/mean", row["response_length_mean"], NP_FLOAT),
            ("response_length/max", float(row["r_max"]), NP_FLOAT),
            ("response_length/min", float(row["response_length_min"]), NP_FLOAT),
            ("response_length/clip_ratio", row["response_clip_ratio"], NP_FLOAT),
            ("prompt_length/mean", row["prompt_length_mean"], NP_FLOAT),
            ("prompt_length/max", float(row["prompt_length_max"]), NP_FLOAT),
            ("prompt_length/min", float(row["prompt_length_min"]), NP_FLOAT),
            ("prompt_length/clip_ratio", row["prompt_clip_ratio"], NP_FLOAT),
        ]
        later: list[list[tuple[str, float, str]]] = []
        if model.mode == "sync":
            pairs += [(f"timing_s/{stage}", row[f"{stage}_s"], PLAIN) for stage in STAGES if row[f"{stage}_s"] is not None]
            pairs.append(("timing_s/step", row["step_s"], PLAIN))
        else:
            stale += row["n_responses"] if row["staleness"] >= 1 else 0
            timers, later = _async_records(row, model, stale, row["n_responses"])
            pairs += timers
        pairs += [
            ("perf/total_num_tokens", row["total_tokens"], PLAIN),
            ("perf/time_per_step", row["step_s"], PLAIN),
            ("perf/throughput", row["total_tokens"] / (row["step_s"] * n_gpus), PLAIN),
        ]
        records.append((row["step"], pairs))
        records.extend((row["step"], line) for line in later)
    return records


def _value_text(value: float, kind: str, style: str) -> str:
    if style == "fixed":
        return f"{value:.3f}"
    if isinstance(value, int) or kind == NP_INT:
        return f"np.int64({int(value)})" if kind == NP_INT else str(int(value))
    text = repr(float(value))
    return f"np.float64({text})" if kind == NP_FLOAT else text


def _tqdm_line(done: int, total: int, elapsed: float, per_step: float) -> str:
    """A `Training Progress` bar as tqdm draws it: percent, a 10-cell bar, n/total, elapsed<remaining, rate."""
    fraction = done / total if total else 1.0
    cells = fraction * 10
    full = int(cells)
    partial = " ▏▎▍▌▋▊▉"[int((cells - full) * 8)] if full < 10 else ""
    bar = ("█" * full + partial).ljust(10)

    def clock(seconds: float) -> str:
        seconds = int(round(seconds))
        hours, rest = divmod(seconds, 3600)
        return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60:02d}:{rest % 60:02d}"

    return (f"Training Progress: {int(fraction * 100):3d}%|{bar}| {done}/{total} "
            f"[{clock(elapsed)}<{clock(per_step * (total - done))}, {per_step:.2f}s/it]")


def _head_lines(spec: WorkloadSpec, model: StepTimeModel, style: str) -> list[str]:
    """What a verl job prints before its first step: the command line, Ray's start, the resolved config
    (pprinted), a warning from a worker."""
    balancing = model.balance_batch or model.rank_dispatch == "balanced"  # verl's balance_batch ran
    settings = [
        "algorithm.adv_estimator=grpo", f"data.train_batch_size={spec.batch}",
        f"data.max_prompt_length={model.max_prompt_length}",
        *([f"data.max_response_length={spec.max_response_len}"] if spec.max_response_len else []),
        "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct", f"actor_rollout_ref.rollout.n={spec.n}",
        "actor_rollout_ref.rollout.name=vllm", f"trainer.n_gpus_per_node={spec.dp_ranks * spec.tp_size}",
        "trainer.nnodes=1", f"trainer.test_freq={model.validate_every or -1}",
        f"trainer.save_freq={model.checkpoint_every or -1}", f"trainer.total_training_steps={spec.steps}",
        f"trainer.experiment_name=synthetic-{spec.task}", f"trainer.balance_batch={balancing}",
    ]
    entry = "verl.trainer.main_ppo"
    if model.mode != "sync":
        # The rollout's and the trainer's own GPUs, as the asynchronous recipes print them (the share rounded
        # to whole GPUs).
        total = spec.dp_ranks * spec.tp_size
        rollout_gpus = min(max(int(round(total * model.rollout_gpu_share)), 1), max(total - 1, 1))
        settings = [f"trainer.n_gpus_per_node={max(total - rollout_gpus, 1)}" if item.startswith("trainer.n_gpus_per_node=")
                    else item for item in settings]
        settings += [f"rollout.n_gpus_per_node={rollout_gpus}", "rollout.nnodes=1"]
    if model.mode == "one-step-off":
        entry = "verl.experimental.one_step_off_policy.main_ppo"
    elif model.mode == "fully-async":
        entry = "verl.experimental.fully_async_policy.fully_async_main"
        settings += [f"async_training.staleness_threshold={model.staleness_limit}",
                     "async_training.trigger_parameter_sync_step=1", "async_training.partial_rollout=False"]
    elif model.mode == "separate-async":
        settings += ["trainer.use_v1=True", "trainer.v1.trainer_mode=separate_async",
                     f"trainer.v1.sampler.max_off_policy_threshold={model.staleness_limit}"]
    prefix = RAY_PREFIX if style == "repr" else "(main_task pid=27182) "
    return [
        f"+ python3 -m {entry} " + " ".join(settings),
        "2026-01-05 10:00:00,123\tINFO worker.py:1821 -- Started a local Ray instance.",
        f"{prefix}{{'actor_rollout_ref': {{'actor': {{'ppo_mini_batch_size': {max(spec.batch // 4, 1)}}},",
        f"{prefix}                       'rollout': {{'n': {spec.n}, 'tensor_model_parallel_size': {spec.tp_size}}}}},",
        f"{prefix} 'data': {{'max_prompt_length': {model.max_prompt_length},",
        f"{prefix}          'max_response_length': {spec.max_response_len or 'None'},",
        f"{prefix}          'train_batch_size': {spec.batch}}},",
        f"{prefix} 'trainer': {{'balance_batch': {balancing}, 'n_gpus_per_node': {spec.dp_ranks * spec.tp_size},",
        f"{prefix}             'nnodes': 1}}}}",
        f"{WORKER_PREFIX}/usr/local/lib/python3.10/dist-packages/torch/utils/checkpoint.py:92: UserWarning: "
        "None of the inputs have requires_grad=True. Gradients will be None",
        f"{WORKER_PREFIX}  warnings.warn(",
    ]


CRASHES = ("oom", "nccl_timeout")


def crash_lines(crash: str, prefix: str = RAY_PREFIX) -> list[str]:
    """What a verl job prints when it dies: a worker's traceback ending in a CUDA out-of-memory error
    (`oom`) or an NCCL watchdog timeout (`nccl_timeout`)."""
    if crash not in CRASHES:
        raise PolytraceError(f"unknown crash {crash!r} (known: {', '.join(CRASHES)})")
    error = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity"
             " of 79.15 GiB of which 1.02 GiB is free." if crash == "oom" else
             "torch.distributed.DistBackendError: [Rank 0] Watchdog caught collective operation timeout:"
             " WorkNCCL(SeqNum=4021, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.")
    return [
        f"{prefix}Traceback (most recent call last):",
        f'{prefix}  File "verl/trainer/main_ppo.py", line 64, in main',
        f"{prefix}    run_ppo(config)",
        f'{prefix}  File "verl/workers/fsdp_workers.py", line 512, in update_actor',
        f"{prefix}    metrics = self.actor.update_policy(data=data)",
        f"{prefix}{error}",
    ]


def console_text(frame: pl.DataFrame, spec: WorkloadSpec, model: StepTimeModel, style: str = "repr",
                 crash_after: int | None = None, crash: str = "oom") -> str:
    """The trainer's stdout: head lines, then per step its `step:N - key:value - ...` line and the
    progress bar, as verl >= 0.5 (`style="repr"`) or <= 0.4 (`style="fixed"`, every value `.3f`) prints it.
    With `crash_after`, the job dies after that step's lines with `crash_lines(crash)`."""
    if style not in STYLES:
        raise PolytraceError(f"unknown console style {style!r} (known: {', '.join(STYLES)})")
    prefix = RAY_PREFIX if style == "repr" else "(main_task pid=27182) "
    lines = _head_lines(spec, model, style)
    elapsed, first = 0.0, 1
    records = metric_records(frame, spec, model)
    before_train = records[0] if records and records[0][0] == 0 else None
    for step, pairs in records:
        body = " - ".join(f"{key}:{_value_text(value, kind, style)}" for key, value, kind in pairs)
        lines.append(f"{prefix}step:{step} - {body}")
        if step == 0 or not any(key == "timing_s/step" for key, _, _ in pairs):
            continue  # a validation before training, or a line the step logs apart (a weight sync)
        step_s = next(value for key, value, _ in pairs if key == "perf/time_per_step")
        elapsed += step_s
        lines.append(_tqdm_line(step, spec.steps, elapsed, elapsed / (step - first + 1)))
        if any(key == "timing_s/save_checkpoint" for key, _, _ in pairs):
            lines.append(f"{prefix}local_global_step_folder: checkpoints/synthetic/{spec.task}/global_step_{step}")
        if step == model.resume_after:
            # The job is stopped and started again: it loads the checkpoint, validates before training
            # at the loaded step (as verl does), and counts on from the next step.
            lines.append("*** SIGTERM received at time=1767607200 on cpu 0 (pid 27182) ***")
            lines += _head_lines(spec, model, style)
            lines.append(f"{prefix}Load from checkpoint folder: checkpoints/synthetic/{spec.task}/global_step_{step}")
            if before_train is not None:
                key, value, kind = before_train[1][0]
                lines.append(f"{prefix}step:{step} - {key}:{_value_text(value, kind, style)}")
            elapsed, first = 0.0, step + 1
        if step == crash_after:
            lines += crash_lines(crash, prefix)
            break
    return "\n".join(lines) + "\n"


def jsonl_text(frame: pl.DataFrame, spec: WorkloadSpec, model: StepTimeModel) -> str:
    """verl's file logger: one `{"step": N, "data": {key: value, ...}}` line per logged step."""
    lines = []
    records = metric_records(frame, spec, model)
    for step, pairs in records:
        data = {key: (int(value) if kind == NP_INT or isinstance(value, int) else float(value)) for key, value, kind in pairs}
        lines.append(json.dumps({"step": step, "data": data}))
        if step == model.resume_after and records[0][0] == 0:
            key, value, _ = records[0][1][0]  # the resumed job validates before training at the loaded step
            lines.append(json.dumps({"step": step, "data": {key: float(value)}}))
    return "\n".join(lines) + "\n"


def truth_document(frame: pl.DataFrame, spec: WorkloadSpec, model: StepTimeModel) -> dict:
    """truth.json: the model's coefficients and schedule, the workload shape, and the per-step frame."""
    return {"format": "polytrace-steplog-truth/1", "model": model.coefficients(), "workload": asdict(spec),
            "steps": frame.to_dicts()}


def ineffective_injections(frame: pl.DataFrame, model: StepTimeModel) -> list[str]:
    """A note for each injected cause whose truth is 0 s at its step: it changed nothing there (a
    long tail no longer than the step's longest response, which the cap may already reach)."""
    notes = []
    for injection in model.injections:
        rows = frame.filter(pl.col("step") == injection.step)
        column = f"cause_{injection.cause}_s"
        if rows.height and column in rows.columns and not rows[column][0]:
            why = (": the step's longest response is already that long (the cap, when no size is given);"
                   " give a larger size or a higher --max-response-len" if injection.cause == "long_tail" else "")
            notes.append(f"step {injection.step}: {injection.cause} added no time{why}")
    return notes


def write_step_log(length_model: LengthModel, spec: WorkloadSpec, model: StepTimeModel, out_dir: str | Path,
                   formats: tuple[str, ...] = ("verl-console",), style: str = "repr",
                   truth: str | Path | None = None) -> StepLogResult:
    """Draw the steps (`step_table`) and write them into out_dir as `train.log` (verl-console) and/or
    `metrics.jsonl` (verl-jsonl); with `truth`, the truth goes to that file (.csv: the frame; otherwise
    truth.json's document)."""
    unknown = [f for f in formats if f not in LOG_FORMATS]
    if unknown:
        raise PolytraceError(f"unknown log format {unknown[0]!r} (known: {', '.join(LOG_FORMATS)})")
    if style not in STYLES:
        raise PolytraceError(f"unknown console style {style!r} (known: {', '.join(STYLES)})")
    frame = step_table(length_model, spec, model)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    result = StepLogResult(steps=frame.height, frame=frame, notes=ineffective_injections(frame, model))
    if "verl-console" in formats:
        path = out / CONSOLE_NAME
        path.write_text(console_text(frame, spec, model, style), encoding="utf-8")
        result.files.append(path)
    if "verl-jsonl" in formats:
        path = out / JSONL_NAME
        path.write_text(jsonl_text(frame, spec, model), encoding="utf-8")
        result.files.append(path)
    if truth is not None:
        path = Path(truth)
        if not path.parent.exists():
            raise PolytraceError(f"cannot write {path}: folder {path.parent} does not exist")
        if path.suffix.lower() == ".csv":
            frame.write_csv(path)
        else:
            path.write_text(json.dumps(truth_document(frame, spec, model), indent=1) + "\n", encoding="utf-8")
        result.files.append(path)
    return result
