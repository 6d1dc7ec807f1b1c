"""`watch --baseline RUN`: each stage's efficiency against a baseline run's band, live.

The baseline's step-time model (`diagnose.explain.decompose_run` on its training steps: warm-up found
and left out) gives, per stage k, its line f_k^A and its band: σ_k, the robust scale (1.4826 · MAD)
of the baseline's own residuals around that line. Each training step s of the watched run, as it
lands, gets per stage the seconds it took beyond the baseline's line at its own workload:

    e_k,s = actual_k,s − f_k^A(W_s)          (the same workload: W_s is the step's own)

Over the watched run's last RECENT training steps up to s (n of them, at least MIN_RECENT):

    z_k = median(e_k) / (1.2533 · σ_k / √n)   (1.2533 · σ / √n: the standard error of a median)

A stage leaves the band when |z_k| ≥ Z_ALERT and |median(e_k)| is at least MIN_SHARE of the
baseline's seconds at those steps (median of f_k^A(W_s)) and MIN_STEP_SHARE of the baseline's typical
step (a stage of a fraction of a second does not alert on hundredths): one `efficiency` alert names the stage,
the direction (slower, faster), the seconds, the share and z. The alert is given again only after the
stage came back (|z_k| below Z_ALERT / 2). The median keeps one slow step (a warm-up, a long tail,
which the slow-step alert names) from moving the band. Steps are judged in log order, each against
the steps up to it, so the alerts are the same whether the steps land one by one or all at once.

When the watched run does not compare with the baseline like for like (`diagnose.comparable`: a
critic, the model, GPUs or the stages differ), one `baseline` alert says so first; stages one run
times and the other does not are not judged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import duckdb
import numpy as np
import polars as pl

from polytrace_cli.diagnose.comparable import compare_profiles, profile_of
from polytrace_cli.diagnose.explain import MIN_TRAINING_STEPS, decompose_run, explained_in_seconds
from polytrace_cli.errors import PolytraceError
from polytrace_cli.model import read_workload, stage_seconds, training_mask

RECENT, MIN_RECENT = 10, 5
Z_ALERT = 3.5
MIN_SHARE = 0.02
MIN_STEP_SHARE = 0.002
MEDIAN_SE = 1.2533


@dataclass
class BaselineBand:
    """The baseline's lines and bands, and the watched run's residuals against them (see the module)."""

    name: str
    model: object = field(repr=False)
    profile: object = field(repr=False)
    residuals: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    seen: set[tuple[int, int]] = field(default_factory=set)
    out_of_band: set[str] = field(default_factory=set)
    said_incomparable: bool = False
    typical_step_s: float = 0.0

    @classmethod
    def of_run(cls, con: duckdb.DuckDBPyConnection, run: str) -> BaselineBand:
        """The band of `run` (read from `con`): its model needs MIN_TRAINING_STEPS timed training steps."""
        frame = read_workload(con, run)
        if not explained_in_seconds(frame):
            raise PolytraceError(f"the baseline {run} has {int(training_mask(frame).sum())} timed training steps; "
                                 f"its band needs a step-time model, which needs {MIN_TRAINING_STEPS}")
        model = decompose_run(frame, training_mask(frame)).model
        return cls(run, model, profile_of(con, run, run, frame), typical_step_s=model.predict_typical()["step"])

    def judge(self, con: duckdb.DuckDBPyConnection, run_id: int, label: str,
              frame: pl.DataFrame | None = None) -> list[dict]:
        """The alerts of the watched run's training steps not judged before, in log order."""
        frame = read_workload(con, run_id) if frame is None else frame
        alerts = []
        if not self.said_incomparable and frame.height:
            guard = compare_profiles(self.profile, profile_of(con, run_id, label, frame))
            self.said_incomparable = True
            if not guard.comparable:
                alerts.append({"event": "alert", "kind": "baseline", "baseline": self.name, "reason": guard.summary()})
        training = training_mask(frame).to_numpy()
        keys = list(zip(frame["segment"].to_list(), frame["step"].to_list()))
        new = [i for i, key in enumerate(keys) if training[i] and key not in self.seen]
        if not new:
            return alerts
        rows = frame[new]
        actual = stage_seconds(rows)
        predicted = self.model.predict(rows)
        stages = [s for s in self.model.stages if s in actual and s != "other"]
        for position, index in enumerate(new):
            self.seen.add(keys[index])
            for stage in stages:
                seconds, line = float(actual[stage][position]), float(predicted[f"{stage}_s"][position])
                if not (math.isfinite(seconds) and math.isfinite(line)):
                    continue
                history = self.residuals.setdefault(stage, [])
                history.append((seconds - line, line))
                alert = self._band(stage, history[-RECENT:], keys[index][1])
                if alert is not None:
                    alerts.append(alert)
        return alerts

    def _band(self, stage: str, recent: list[tuple[float, float]], step: int) -> dict | None:
        scale = self.model.stages[stage].scale_s
        if len(recent) < MIN_RECENT or scale <= 0:
            return None
        excess = float(np.median([e for e, _ in recent]))
        base = float(np.median([line for _, line in recent]))
        z = excess / (MEDIAN_SE * scale / math.sqrt(len(recent)))
        if stage in self.out_of_band:
            if abs(z) < Z_ALERT / 2:
                self.out_of_band.discard(stage)
            return None
        if abs(z) < Z_ALERT or base <= 0 or abs(excess) < max(MIN_SHARE * base, MIN_STEP_SHARE * self.typical_step_s):
            return None
        self.out_of_band.add(stage)
        return {"event": "alert", "kind": "efficiency", "stage": stage, "step": step,
                "direction": "slower" if excess > 0 else "faster", "seconds": excess, "share": excess / base,
                "z": z, "steps": len(recent), "baseline": self.name}
