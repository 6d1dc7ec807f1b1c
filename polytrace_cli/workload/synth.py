"""Synthesize PolyTrace-format workload traces from a length model.

Writes, per workload step N, `packed_lengths_step_N.jsonl` (one line per prompt per DP rank),
`reward_timings_step_N.jsonl` (one line per DP rank), and for multi-turn tasks
`multiturn_workload_step_N.jsonl`; DAPO-style tasks also get `dapo_filter_indices.jsonl`.
Everything is drawn from one seeded numpy Generator, so a seed fixes the output byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from polytrace_cli.workload.distributions import LengthModel, Marginal
from polytrace_cli.errors import PolytraceError


@dataclass(frozen=True)
class WorkloadSpec:
    """The shape of a synthetic workload."""

    task: str
    steps: int = 4
    batch: int = 32          # prompts per step
    n: int = 8               # responses per prompt
    dp_ranks: int = 2
    tp_size: int = 1
    max_response_len: int | None = None
    drift: float = 0.0       # relative change of response length per step (centred on the middle step)
    seed: int = 0
    multiturn: bool = False
    dapo: bool = False
    reward_timings: bool = True


@dataclass
class SynthResult:
    files: list[Path] = field(default_factory=list)
    samples: int = 0
    trajectories: int = 0


def drift_factor(spec: WorkloadSpec, step: int) -> float:
    """Response-length multiplier of a step: (1 + drift)^(step − (steps − 1)/2).

    Centred on the middle step, so that a model fitted to a whole run (pooled over its steps) keeps
    its pooled lengths while the steps drift apart by the requested rate.
    """
    try:
        return (1.0 + spec.drift) ** (step - (spec.steps - 1) / 2)
    except OverflowError:  # far from the middle of a very long run
        return float("inf")


def draw_step(model: LengthModel, spec: WorkloadSpec, rng: np.random.Generator, step: int) -> tuple[np.ndarray, np.ndarray]:
    """Prompt lengths (batch,) and response lengths (batch, n) of one step (`LengthModel.sample_groups`),
    scaled by the step's drift factor; responses already at the cap stay there, the others are clipped to it."""
    prompts, responses = model.sample_groups(rng, spec.batch, spec.n, spec.max_response_len)
    factor = drift_factor(spec, step)
    if factor != 1.0:
        # Far from the middle of a long run the factor may overflow to inf or underflow to 0.
        ceiling = spec.max_response_len or np.iinfo(np.int32).max
        scaled = np.clip(np.rint(responses * factor), 1, ceiling).astype(np.int64)
        if spec.max_response_len:
            scaled = np.where(responses >= spec.max_response_len, spec.max_response_len,
                              np.minimum(scaled, spec.max_response_len))
        responses = scaled
    return prompts, responses


def _packed_text(step: int, spec: WorkloadSpec, prompts: np.ndarray, responses: np.ndarray) -> str:
    dp_of_prompt = np.arange(spec.batch) % spec.dp_ranks
    lines = []
    for dp in range(spec.dp_ranks):
        for local, index in enumerate(np.flatnonzero(dp_of_prompt == dp)):
            outputs = ", ".join(map(str, responses[index].tolist()))
            lines.append(
                f'{{"step": {step}, "rank": {dp * spec.tp_size}, "dp_rank": {dp}, "tp_rank": 0, '
                f'"local_index": {local}, "input": {int(prompts[index])}, "output": [{outputs}], '
                f'"n_sampling": {spec.n}, "validate": false}}'
            )
    return "\n".join(lines) + "\n"


def _rewards_text(step: int, spec: WorkloadSpec, responses: np.ndarray, rng: np.random.Generator) -> str:
    dp_of_prompt = np.arange(spec.batch) % spec.dp_ranks
    lines = []
    for dp in range(spec.dp_ranks):
        mine = responses[dp_of_prompt == dp].ravel()
        # Reward time grows with the tokens to verify, with heavy-tailed sandbox noise.
        seconds = 5.0 + 4e-5 * mine.sum() * rng.lognormal(0.0, 0.4)
        lines.append(json.dumps({
            "step": step, "rank": dp * spec.tp_size, "tp_rank": 0, "dp_rank": dp, "batch_size": int(mine.size),
            "reward_time_s": round(float(seconds), 6), "response_sum": int(mine.sum()),
            "response_mean": float(mine.mean()), "response_max": int(mine.max()), "validate": False,
        }))
    return "\n".join(lines) + "\n"


def _dapo_text(spec: WorkloadSpec, rng: np.random.Generator) -> str:
    """DAPO dynamic sampling: generate batches until train_batch_size prompts with mixed rewards are kept."""
    train_batch = max(spec.batch // 3, 1)
    lines, trainer_step, kept_so_far, gen_index = [], 1, 0, 1
    for workload_step in range(spec.steps):
        kept = np.flatnonzero(rng.random(spec.batch) < 0.35)
        used = kept[: max(train_batch - kept_so_far, 0)]
        lines.append(json.dumps({
            "workload_step": workload_step, "trainer_step": trainer_step, "gen_batch_index": gen_index,
            "prompt_count": spec.batch, "n_sampling": spec.n, "train_batch_size": train_batch,
            "num_prompt_in_batch_before": kept_so_far, "kept_prompt_count": int(kept.size),
            "used_prompt_count": int(used.size), "kept_prompt_indices": kept.tolist(),
            "used_prompt_indices": used.tolist(),
        }))
        kept_so_far += int(used.size)
        gen_index += 1
        if kept_so_far >= train_batch:
            trainer_step, kept_so_far, gen_index = trainer_step + 1, 0, 1
    return "\n".join(lines) + "\n"


def sequence_draw(rng: np.random.Generator, multiturn: dict) -> tuple[list[int], list[int]]:
    """Token counts of one tool-calling session from the published sequence models: a call count k
    from `turns_pmf`, then the feature vector ~ N(mean, covariance) of the k-call model; returns
    [input_1..input_k] and [output_1..output_k], rounded and at least 1."""
    turn_values = np.array([int(k) for k in multiturn["turns_pmf"]])
    turn_probs = np.array(list(multiturn["turns_pmf"].values()), float)
    calls = int(rng.choice(turn_values, p=turn_probs / turn_probs.sum()))
    model = multiturn["sequence_models"][str(calls)]
    vector = rng.multivariate_normal(np.asarray(model["mean"], float), np.asarray(model["covariance"], float),
                                     method="eigh")
    value = dict(zip(model["names"], vector.tolist()))
    inputs = [max(1, int(round(value[f"input_{i}"]))) for i in range(1, calls + 1)]
    outputs = [max(1, int(round(value[f"output_{i}"]))) for i in range(1, calls + 1)]
    return inputs, outputs


def _turn_models(multiturn: dict) -> tuple[Marginal, Marginal | None]:
    """The tool latency model (`tool_latency_s`) and, without sequence models, the completion length
    model (`completion_tokens`) of the workload's turns, built once for all its trajectories."""
    latency = multiturn["tool_latency_s"]
    completion = None if multiturn.get("sequence_models") else multiturn["completion_tokens"]
    return (Marginal(latency["family"], latency["params"]),
            None if completion is None else Marginal(completion["family"], completion["params"]))


def _trajectory(rng: np.random.Generator, prompt_len: int, cap: int, multiturn: dict,
                models: tuple[Marginal, Marginal | None]) -> dict:
    """One multi-turn trajectory. With published sequence models (`sequence_draw`), call i is turn i:
    output_i its completion tokens and input_(i+1) the tool response fed back before the next turn;
    otherwise turn counts from `turns_pmf`, completions from `completion_tokens` and tool responses
    of 300–1,100 tokens. Tool latencies come from `tool_latency_s` (`models`: `_turn_models`)."""
    latency, completion = models
    if multiturn.get("sequence_models"):
        inputs, outputs = sequence_draw(rng, multiturn)
        n_turns = len(outputs)
    else:
        turn_values = np.array([int(k) for k in multiturn["turns_pmf"]])
        turn_probs = np.array(list(multiturn["turns_pmf"].values()), float)
        n_turns = int(rng.choice(turn_values, p=turn_probs / turn_probs.sum()))
        inputs = outputs = None
    turns, tools, context, response = [], [], prompt_len, 0
    finish = "stop"
    for turn in range(n_turns):
        if outputs is not None:
            tokens = outputs[turn]
        else:
            tokens = int(max(1, round(float(completion.sample(rng, 1)[0]))))
        last = turn == n_turns - 1
        if response + tokens >= cap:
            tokens, last, finish = cap - response, True, "length"
        cached = 0 if turn == 0 else context - int(rng.integers(0, 8))
        turns.append({"turn": turn, "prompt_tokens": context, "cached_tokens": max(cached, 0), "completion_tokens": tokens,
                      "finish_reason": "length" if finish == "length" else ("stop" if last else "tool_calls"),
                      "tool_call_count": 0 if last else 1,
                      "engine_latency_s": round(2.0 + 0.03 * tokens * float(rng.lognormal(0, 0.3)), 6)})
        context += tokens
        response += tokens
        if last:
            break
        tool_tokens = inputs[turn + 1] if inputs is not None else int(rng.integers(300, 1100))
        tools.append({"turn": turn, "tool_name": "search", "query_count": int(rng.integers(1, 4)),
                      "latency_s": round(float(latency.sample(rng, 1)[0]), 6),
                      "response_token_len": tool_tokens, "status": "success"})
        context += tool_tokens
        response += tool_tokens
    return {"turns": turns, "tool_calls": tools, "finish_reason": finish, "final_response_len": response}


def _multiturn_text(step: int, spec: WorkloadSpec, model: LengthModel, prompts: np.ndarray | None,
                    rng: np.random.Generator) -> tuple[str, int]:
    cap = spec.max_response_len or 4096
    lines = []
    if prompts is None:  # published sequence models: a group's prompt is input_1 of a draw
        prompts = np.array([sequence_draw(rng, model.multiturn)[0][0] for _ in range(spec.batch)])
    models = _turn_models(model.multiturn)
    for group, prompt_len in enumerate(prompts.tolist()):
        for sample in range(spec.n):
            t = _trajectory(rng, int(prompt_len), cap, model.multiturn, models)
            lines.append(json.dumps({
                "step": step, "prompt_len": int(prompt_len), "max_response_len": cap, "turns": t["turns"],
                "tool_calls": t["tool_calls"], "finish_reason": t["finish_reason"],
                "final_response_len": t["final_response_len"], "turn_count": len(t["turns"]),
                "tool_call_count": len(t["tool_calls"]), "validate": False, "prompt_group_id": group,
                "sample_id": sample,
            }))
    return "\n".join(lines) + "\n", len(lines)


def synthesized(model: LengthModel, spec: WorkloadSpec) -> Iterator[tuple[str, str, int]]:
    """The workload's trace files, in the order they are drawn: (file name, text, samples or
    trajectories it holds). Every draw comes from one Generator seeded with `spec.seed`."""
    if spec.steps < 1 or spec.batch < 1 or spec.n < 1 or spec.dp_ranks < 1:
        raise PolytraceError("steps, batch, n and dp ranks must all be at least 1")
    if spec.multiturn and not model.multiturn:
        raise PolytraceError(f"task {spec.task!r} has no multi-turn model to sample trajectories from")
    rng = np.random.default_rng(spec.seed)
    for step in range(spec.steps):
        if spec.multiturn and (model.multiturn or {}).get("sequence_models"):
            prompts = None
        else:
            prompts, responses = draw_step(model, spec, rng, step)
        if spec.multiturn:
            yield (f"multiturn_workload_step_{step}.jsonl", *_multiturn_text(step, spec, model, prompts, rng))
            continue
        yield f"packed_lengths_step_{step}.jsonl", _packed_text(step, spec, prompts, responses), int(responses.size)
        if spec.reward_timings:
            yield f"reward_timings_step_{step}.jsonl", _rewards_text(step, spec, responses, rng), 0
    if spec.dapo:
        yield "dapo_filter_indices.jsonl", _dapo_text(spec, rng), 0


def synthesize(model: LengthModel, spec: WorkloadSpec, out_dir: str | Path) -> SynthResult:
    """Write the workload's trace files (`synthesized`) into out_dir (created if needed) and return
    what was written."""
    out = Path(out_dir)
    result = SynthResult()
    for name, text, count in synthesized(model, spec):
        out.mkdir(parents=True, exist_ok=True)
        path = out / name
        path.write_text(text)
        result.files.append(path)
        if name.startswith("multiturn_workload_step_"):
            result.trajectories += count
        else:
            result.samples += count
    return result


def with_overrides(spec: WorkloadSpec, **overrides) -> WorkloadSpec:
    """A copy of spec with the given non-None fields replaced."""
    return replace(spec, **{k: v for k, v in overrides.items() if v is not None})
