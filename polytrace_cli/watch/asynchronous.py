"""Alerts of an asynchronous run as its steps land: the trainer waiting more than usual, staleness or
dropped samples that keep growing.

Per new step (in log order), from the run's workload frame (`model.read_workload`: the mode's timers):

    wait share  w_s = trainer_wait_s / wall_s. Its usual level is the median of w over the steps before
                the current run of high steps (at least MIN_HISTORY of them, the first of each segment
                left out: it waits for an empty queue), and a step is high when
                w_s > usual + max(MIN_RISE, 3 · 1.4826 · MAD of those w). K high steps in a row raise
                `wait_share` once; a step back at its level ends the run of high steps.
    staleness   staleness_mean (else staleness_max), in model versions: K steps in a row each above the
                one before raise `staleness`.
    dropped     samples dropped as stale in the step (verl's cumulative counter differenced, or the V1
                trainer's per-step count): K steps in a row, each dropping more than the one before,
                raise `dropped_samples`.

Each alert: {"event": "alert", "kind": "async", "signal", "step", "steps": K, "value", "usual",
"reason"} (schemas/watch.schema.json).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

K_STEPS = 5
MIN_HISTORY = 8
MIN_RISE = 0.10
MAD_SCALE = 1.4826


def _finite(value) -> float | None:
    return float(value) if value is not None and math.isfinite(float(value)) else None


@dataclass
class AsyncAlerts:
    """The rules of the module docstring over the steps fed one by one (`observe`)."""

    k: int = K_STEPS
    shares: list[float] = field(default_factory=list)
    high: int = 0
    wait_alerted: bool = False
    last: dict[str, float | None] = field(default_factory=dict)
    rising: dict[str, int] = field(default_factory=dict)
    alerted: dict[str, bool] = field(default_factory=dict)
    dropped_total: float | None = None

    def observe(self, step: int, first_of_segment: bool, wall_s, wait_s, staleness, dropped,
                dropped_cumulative: bool) -> list[dict]:
        """The alerts this step raises (none, or one per signal)."""
        alerts = []
        wall, wait = _finite(wall_s), _finite(wait_s)
        if wall and wait is not None and not first_of_segment:
            alerts += self._wait(step, wait / wall)
        value = _finite(staleness)
        alerts += self._rise("staleness", step, value, "model versions of staleness")
        count = _finite(dropped)
        if count is not None and dropped_cumulative:
            count, self.dropped_total = (count - self.dropped_total if self.dropped_total is not None else None), count
        alerts += self._rise("dropped_samples", step, count, "samples dropped as stale per step")
        return alerts

    def _wait(self, step: int, share: float) -> list[dict]:
        history = np.array(self.shares[:len(self.shares) - self.high] if self.high else self.shares)
        if history.size < MIN_HISTORY:
            self.shares.append(share)
            return []
        usual = float(np.median(history))
        spread = MAD_SCALE * float(np.median(np.abs(history - usual)))
        self.shares.append(share)
        if share > usual + max(MIN_RISE, 3 * spread):
            self.high += 1
        else:
            self.high, self.wait_alerted = 0, False
        if self.high >= self.k and not self.wait_alerted:
            self.wait_alerted = True
            return [{"event": "alert", "kind": "async", "signal": "wait_share", "step": step, "steps": self.k,
                     "value": share, "usual": usual,
                     "reason": f"the trainer waited {share:.0%} of the step for the rollout side, {self.k} steps in a "
                               f"row above its usual {usual:.0%}"}]
        return []

    def _rise(self, signal: str, step: int, value: float | None, unit: str) -> list[dict]:
        if value is None:
            return []
        before = self.last.get(signal)
        self.last[signal] = value
        if before is not None and value > before:
            self.rising[signal] = self.rising.get(signal, 0) + 1
        else:
            self.rising[signal], self.alerted[signal] = 0, False
        if self.rising[signal] >= self.k and not self.alerted.get(signal):
            self.alerted[signal] = True
            return [{"event": "alert", "kind": "async", "signal": signal, "step": step, "steps": self.k,
                     "value": value, "usual": None,
                     "reason": f"{value:,.2f} {unit}, growing on each of the last {self.k} steps"}]
        return []
