"""An asynchronous RL run as a known model: a rollout pipeline and a trainer joined by a bounded queue.

The rollout side holds a share p of the run's GPUs (`rollout_gpu_share`), the trainer the rest. Batch s
takes the rollout R_s = gen_s / p seconds (gen_s: the batch's generation on all GPUs, as a colocated run
would take it) and the trainer C_s = train_s / (1 − p) (train_s: the batch's training stages on all
GPUs). The staleness limit K (`staleness_limit`, in model versions) lets the rollout start batch s only
once the trainer has finished step s − 1 − K, i.e. at most K + 1 batches ahead; K = 0 is a run in which
generation and training alternate, K = 1 is one-step-off. After each step the weights go to the rollout
GPUs (W_s seconds), during which the rollout pauses.

    rollout start r0_s = max(r1_{s−1}, d_{s−1−K})           (d_j: the end of trainer step j, d_{≤0} = 0)
    rollout end   r1_s = r0_s + R_s, lengthened by every weight sync that falls inside it
    trainer       b_s  = d_{s−1};  wait_s = max(0, r1_s − b_s);  d_s = b_s + wait_s + C_s + rest_s + W_s
    step_s        = wait_s + C_s + rest_s + W_s             (the trainer's step: its compute plus its wait)

In the window of step s, [d_{s−1}, d_s], the rollout is busy for `rollout_active_s` (the overlap of
its busy intervals with the window, syncs left out), paused for the window's syncs, and idle for the rest:

    rollout_idle_s     = (d_s − d_{s−1}) − rollout_active_s − W_s
    rollout_idle_ratio = 1 − rollout_active_s / (d_s − d_{s−1})       (verl's rollouter/idle_ratio)
    trainer_idle_ratio = wait_s / step_s                               (verl's trainer/idle_ratio)
    staleness_s        = (s − 1) − (trainer steps finished at r0_s)    (versions the batch lags by)
    throttled_s        = the rollout was held back by the staleness limit (d_{s−1−K} > r1_{s−1})

What bounds step s, and its seconds (the same rule `diagnose.bounds` applies to the logged timers):

    rollout-bound   wait_s                   the trainer waits while the rollout is busy
    train-bound     rollout_idle_s           the rollout idles (done, or throttled by the staleness limit)
    overhead-bound  W_s + switch_s           weight sync and mode switches, when they exceed both
    whichever of the three is largest.
"""

from __future__ import annotations

import numpy as np

BOUNDS = ("rollout-bound", "train-bound", "overhead-bound")


def _advance(start: float, busy: float, syncs: list[tuple[float, float]]) -> float:
    """The time at which `busy` seconds of work started at `start` end, the work pausing during each
    (begin, end) sync window (sorted by begin)."""
    t, left = start, busy
    for begin, end in syncs:
        if end <= t:
            continue
        if begin >= t + left:
            break
        if begin > t:
            left -= begin - t
        t = max(t, end)
    return t + left


def _overlap(intervals: list[tuple[float, float]], begin: float, end: float) -> float:
    return sum(max(0.0, min(b, end) - max(a, begin)) for a, b in intervals)


def bound_of(wait_s: float, rollout_idle_s: float, overhead_s: float) -> tuple[str, float]:
    """(the bound, its seconds per step): the largest of the trainer's wait (rollout-bound), the rollout's
    idle time (train-bound) and the weight sync plus switches (overhead-bound); ties go in that order."""
    values = (wait_s, rollout_idle_s, overhead_s)
    index = int(np.argmax(values))
    return BOUNDS[index], float(values[index])


def simulate(gen_s: np.ndarray, train_s: np.ndarray, rest_s: np.ndarray, sync_s: np.ndarray,
             rollout_gpu_share: float, staleness_limit: int, switch_s: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per step 1..n the pipeline of the module docstring: wait_s, compute_s (C), rollout_s (R),
    rollout_active_s, rollout_idle_s, rollout_idle_ratio, trainer_idle_ratio, step_s, staleness,
    throttled, bound and bound_s. gen_s and train_s are the seconds on all GPUs."""
    if not 0.0 < rollout_gpu_share < 1.0:
        raise ValueError(f"the rollout's share of GPUs is between 0 and 1, not {rollout_gpu_share}")
    if staleness_limit < 0:
        raise ValueError(f"the staleness limit counts model versions, at least 0, not {staleness_limit}")
    n = len(gen_s)
    switch = np.zeros(n) if switch_s is None else np.asarray(switch_s, dtype=float)
    rollout = np.asarray(gen_s, dtype=float) / rollout_gpu_share
    compute = np.asarray(train_s, dtype=float) / (1.0 - rollout_gpu_share)
    done = [0.0]                     # done[j]: end of trainer step j (done[0] = the start)
    busy: list[tuple[float, float]] = []
    syncs: list[tuple[float, float]] = []
    out = {name: np.zeros(n) for name in ("wait_s", "rollout_active_s", "rollout_idle_s", "rollout_idle_ratio",
                                          "trainer_idle_ratio", "step_s", "staleness", "throttled", "bound_s")}
    bounds: list[str] = []
    r_end = 0.0
    starts, ends = [], []
    for s in range(1, n + 1):
        allowed = done[max(s - 1 - staleness_limit, 0)]
        r_start = max(r_end, allowed)
        out["throttled"][s - 1] = float(allowed > r_end and s - 1 - staleness_limit >= 1)
        r_end = _advance(r_start, rollout[s - 1], syncs)
        starts.append(r_start)
        ends.append(r_end)
        out["staleness"][s - 1] = (s - 1) - sum(1 for d in done[1:] if d <= r_start)
        begin = done[-1]
        wait = max(0.0, r_end - begin)
        sync_begin = begin + wait + compute[s - 1] + rest_s[s - 1]
        end = sync_begin + sync_s[s - 1] + switch[s - 1]
        syncs.append((sync_begin, end))
        done.append(end)
        out["wait_s"][s - 1] = wait
        out["step_s"][s - 1] = end - begin
    # Busy intervals of the rollout with the syncs taken out, then their share of each step's window.
    for r_start, r_end in zip(starts, ends):
        t = r_start
        for a, b in syncs:
            if b <= t or a >= r_end:
                continue
            if a > t:
                busy.append((t, a))
            t = max(t, b)
        if t < r_end:
            busy.append((t, r_end))
    for s in range(1, n + 1):
        begin, end = done[s - 1], done[s]
        window = end - begin
        active = _overlap(busy, begin, end)
        idle = max(0.0, window - active - sync_s[s - 1] - switch[s - 1])
        out["rollout_active_s"][s - 1] = active
        out["rollout_idle_s"][s - 1] = idle
        out["rollout_idle_ratio"][s - 1] = 1.0 - active / window if window > 0 else 0.0
        out["trainer_idle_ratio"][s - 1] = out["wait_s"][s - 1] / window if window > 0 else 0.0
        bound, seconds = bound_of(out["wait_s"][s - 1], idle, sync_s[s - 1] + switch[s - 1])
        bounds.append(bound)
        out["bound_s"][s - 1] = seconds
    out["compute_s"] = compute
    out["rollout_s"] = rollout
    out["bound"] = np.array(bounds, dtype=object)
    return out
