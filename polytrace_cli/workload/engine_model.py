"""A known model of a rollout engine over a run's steps, for scrape files with a known truth.

Each step submits `requests` requests at its start to one continuous-batching engine: at most `slots`
run at once, a request's KV cache holds its prompt and the tokens it generated so far, and the engine
holds at most `kv_tokens` of them. Every running request generates `tokens_per_s` tokens a second. The
queue is first come, first served; a request is admitted while a slot is free and its prompt fits; when
the cache overflows, the most recently admitted request is preempted: its tokens are freed, it goes back
to the head of the queue and starts over (counted in `preemptions_total`). Response lengths follow a
lognormal capped at `max_response`, so a few long requests finish last: the tail. The rollout ends when
every request finished; training follows for `train_s` seconds with the engine idle; the step's
records are logged at its end, and `untimed_s[k]` seconds that no timer counts pass before the next step.

`simulate` returns the steps (start, gen_s, step_s, logged_at), the scrape file's text (every
`scrape_every` seconds, vLLM's series names) and the truth per step, computed on the simulation's own
time grid: the share of the rollout with at most LOW_SHARE_OF_PEAK of its peak concurrency running,
the share after its last moment above that, the share with the cache at or above KV_FULL, and the
preemptions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

LOW_SHARE_OF_PEAK = 0.10
KV_FULL = 0.95


@dataclass(frozen=True)
class EngineModel:
    requests: int = 128
    slots: int = 64
    kv_tokens: int = 2_000_000
    prompt_tokens: int = 200
    tokens_per_s: float = 40.0
    response_median: float = 600.0
    response_sigma: float = 0.6
    max_response: int = 4096
    train_s: float = 30.0
    dt: float = 0.05
    scrape_every: float = 1.0
    seed: int = 0


@dataclass
class EngineRun:
    steps: list[dict] = field(default_factory=list)      # step, start, gen_s, step_s, logged_at
    truth: list[dict] = field(default_factory=list)      # step, low_share, tail_share, kv_full_share, preemptions
    scrapes: str = ""


def _rollout(model: EngineModel, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One rollout on the model's time grid: (running, waiting, kv usage, cumulative preemptions) per tick."""
    lengths = np.minimum(np.ceil(rng.lognormal(np.log(model.response_median), model.response_sigma, model.requests)),
                         model.max_response)
    generated = np.zeros(model.requests)
    state = np.zeros(model.requests, dtype=np.int8)  # 0 waiting, 1 running, 2 done
    admitted_at = np.full(model.requests, -1.0)
    queue = list(range(model.requests))
    per_tick = model.tokens_per_s * model.dt
    running_series, waiting_series, kv_series, preempt_series = [], [], [], []
    preemptions, tick = 0, 0
    while (state != 2).any():
        used = float((model.prompt_tokens + generated[state == 1]).sum())
        while queue and (state == 1).sum() < model.slots and used + model.prompt_tokens <= model.kv_tokens:
            request = queue.pop(0)
            state[request], admitted_at[request] = 1, tick
            used += model.prompt_tokens
        running = state == 1
        generated[running] = np.minimum(generated[running] + per_tick, lengths[running])
        while (model.prompt_tokens * running.sum() + generated[running].sum()) > model.kv_tokens and running.sum() > 1:
            newest = np.flatnonzero(running)[np.argmax(admitted_at[running])]
            state[newest], generated[newest] = 0, 0.0
            queue.insert(0, int(newest))
            preemptions += 1
            running = state == 1
        finished = running & (generated >= lengths)
        state[finished] = 2
        running = state == 1
        running_series.append(int(running.sum()) + int(finished.sum()))
        waiting_series.append(len(queue))
        kv_series.append(min(1.0, (model.prompt_tokens * running.sum() + generated[running].sum()) / model.kv_tokens))
        preempt_series.append(preemptions)
        tick += 1
    return (np.array(running_series, float), np.array(waiting_series, float), np.array(kv_series),
            np.array(preempt_series, float))


def _truth(running: np.ndarray, kv: np.ndarray, preemptions: np.ndarray) -> dict:
    low = running <= LOW_SHARE_OF_PEAK * running.max()
    above = np.flatnonzero(~low)
    last_high_end = (above[-1] + 1) if above.size else 0
    return {"low_share": float(low.mean()), "tail_share": float((running.size - last_high_end) / running.size),
            "kv_full_share": float((kv >= KV_FULL).mean()), "preemptions": float(preemptions[-1])}


def simulate(model: EngineModel, steps: int, start: float = 1_700_000_000.0, untimed_s: list[float] | None = None,
             url: str = "http://rollout-0:8000/metrics") -> EngineRun:
    """`steps` steps of the engine model from wall time `start` (seconds since the epoch)."""
    rng = np.random.default_rng(model.seed)
    run = EngineRun()
    timeline: list[tuple[float, float, float, float, float]] = []  # t, running, waiting, kv, preemptions total
    t, total_preemptions = start, 0.0
    for index in range(steps):
        running, waiting, kv, preempt = _rollout(model, rng)
        gen_s = running.size * model.dt
        step_s = gen_s + model.train_s
        run.steps.append({"step": index + 1, "start": t, "gen_s": gen_s, "step_s": step_s, "logged_at": t + step_s})
        run.truth.append({"step": index + 1, **_truth(running, kv, preempt)})
        ticks = t + np.arange(running.size) * model.dt
        timeline.extend(zip(ticks, running, waiting, kv, preempt + total_preemptions))
        total_preemptions += preempt[-1]
        idle_until = t + step_s + (untimed_s[index] if untimed_s else 0.0)
        timeline.append((t + gen_s, 0.0, 0.0, 0.0, total_preemptions))
        t = idle_until
    timeline.append((t, 0.0, 0.0, 0.0, total_preemptions))
    run.scrapes = _scrape_text(timeline, start, t, model.scrape_every, url)
    return run


def _scrape_text(timeline: list[tuple], start: float, end: float, every: float, url: str) -> str:
    """The scrape file of `timeline` sampled every `every` seconds (the state at or before each time)."""
    times = np.array([row[0] for row in timeline])
    lines: list[str] = []
    moment = start + every / 2
    series = (("vllm:num_requests_running", "gauge", 1), ("vllm:num_requests_waiting", "gauge", 2),
              ("vllm:kv_cache_usage_perc", "gauge", 3), ("vllm:num_preemptions_total", "counter", 4))
    while moment <= end:
        row = timeline[max(0, int(np.searchsorted(times, moment, side="right")) - 1)]
        ts_ms = int(round(moment * 1000))
        lines.append(f"# polytrace-scrape url={url} ts_ms={ts_ms}")
        for name, kind, column in series:
            lines.append(f"# TYPE {name} {kind}")
            lines.append(f'{name}{{engine="0",model_name="policy"}} {float(row[column])!r} {ts_ms}')
        moment += every
    return "\n".join(lines) + "\n"
