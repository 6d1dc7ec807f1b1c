"""Robust thresholds: which steps are slow, which leading steps are warm-up."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

MAD_SCALE = 1.4826
ROBUST_Z = 3.5
# The per-cause test looks at every cause of every step: a stricter z keeps its false alarms rare.
CAUSE_Z = 4.5
# A slow step's excess is also at least this share of its expected seconds.
MIN_EXCESS_SHARE = 0.05
# A cause makes a step slow only when its seconds also exceed this share of the expected step.
MIN_CAUSE_SHARE = 0.02
# A cause's local level is its running median over this many training steps.
LOCAL_WINDOW = 21
# At most this many leading steps of a segment count as warm-up.
MAX_WARMUP_STEPS = 5


@dataclass(frozen=True)
class Threshold:
    """value = median + 3.5 · 1.4826 · MAD of a quantity over the reference steps; a step is above
    it when quantity > value and quantity > min_share · its reference (expected) size."""

    median: float
    mad: float
    value: float
    min_share: float = MIN_EXCESS_SHARE

    @classmethod
    def robust(cls, values: np.ndarray, min_share: float = MIN_EXCESS_SHARE, z: float = ROBUST_Z) -> "Threshold":
        """The threshold over the finite values (value = +inf when there are none), at z robust
        standard deviations."""
        finite = values[np.isfinite(values)]
        if finite.size == 0:
            return cls(float("nan"), float("nan"), float("inf"), min_share)
        median = float(np.median(finite))
        mad = float(np.median(np.abs(finite - median)))
        return cls(median, mad, median + z * MAD_SCALE * mad, min_share)

    def above(self, values: np.ndarray, reference: np.ndarray) -> np.ndarray:
        """values > value and values > min_share · reference (NaN is never above)."""
        with np.errstate(invalid="ignore"):
            return np.nan_to_num(values, nan=-np.inf) > np.maximum(self.value, self.min_share * reference)

    def describe(self, quantity: str) -> str:
        """The rule in words, e.g. 'excess > median + 3.5·1.4826·MAD = 2.10 s and > 5% of expected'."""
        return (f"{quantity} > median + {ROBUST_Z}·{MAD_SCALE}·MAD = {self.value:.3g} s "
                f"and > {self.min_share:.0%} of the expected step")


def warmup_steps(frame: pl.DataFrame, residual: np.ndarray, expected: np.ndarray, threshold: Threshold) -> np.ndarray:
    """Warm-up: in each segment (and after a restart or resume flag), the leading timed steps whose
    residual (time the workload does not explain) is above the threshold, at most
    MAX_WARMUP_STEPS of them; the run of leading slow steps ends at the first step that is not."""
    slow = threshold.above(residual, expected)
    timed = frame["wall_s"].is_not_null().to_numpy()
    starts = (frame["segment_start"] | frame["restart"]).to_numpy()
    validation_only = frame["validation_only"].to_numpy()
    warm = np.zeros(frame.height, dtype=bool)
    counting, taken = False, 0
    for i in range(frame.height):
        if starts[i]:
            counting, taken = True, 0
        if not timed[i] or validation_only[i]:
            continue
        if counting and slow[i] and taken < MAX_WARMUP_STEPS:
            warm[i], taken = True, taken + 1
        else:
            counting = False
    return warm


def local_baseline(values: np.ndarray, training: np.ndarray, trailing: bool = False) -> np.ndarray:
    """Per step, the running median of the training steps' values over LOCAL_WINDOW training steps
    (centred), interpolated at the other steps: the cause's level around the step, which follows a
    drift of the workload and ignores a single spike.

    `trailing` (a run judged as it goes): the window ends at the step, the LOCAL_WINDOW training steps
    up to it, and another step takes the level of the last training step before it (the first's
    before any), so that no step's level depends on a later step."""
    positions = np.flatnonzero(training)
    if positions.size == 0:
        return np.zeros(values.size)
    running = pl.Series(values[positions]).rolling_median(window_size=LOCAL_WINDOW, center=not trailing,
                                                          min_samples=1).to_numpy()
    if trailing:
        last = np.searchsorted(positions, np.arange(values.size), side="right") - 1
        return running[np.maximum(last, 0)]
    return np.interp(np.arange(values.size), positions, running)


def standing_out(steps: pl.DataFrame, causes: pl.DataFrame, in_training: np.ndarray,
                 trailing: bool = False) -> pl.DataFrame:
    """Per step × cause (`causes`' rows): stands_out = the cause's seconds are above 2% of the
    step's expected_s and their deviation from the cause's local level (`local_baseline`, the
    cause counted 0 where absent; `trailing` as there) is above median + 4.5·1.4826·MAD of the
    training steps' deviations. `in_training` flags the training rows of `steps` (in step order)."""
    keys = ["segment", "step"]
    expected = steps["expected_s"].to_numpy()
    wide = causes.pivot(on="cause", index=keys, values="seconds", aggregate_function="sum")
    wide = steps.select(keys).join(wide, on=keys, how="left", maintain_order="left")
    wide = wide.with_columns(pl.exclude(keys).fill_null(0.0))
    flags = []
    for cause in [c for c in wide.columns if c not in keys]:
        values = wide[cause].to_numpy()
        deviation = values - local_baseline(values, in_training, trailing)
        rule = Threshold.robust(deviation[in_training], z=CAUSE_Z)
        flags.append(wide.select(keys).with_columns(
            cause=pl.lit(cause),
            stands_out=pl.Series((deviation > rule.value) & (values > MIN_CAUSE_SHARE * expected))))
    if not flags:
        return causes.select(*keys, "cause").with_columns(stands_out=pl.lit(False))
    return causes.select(*keys, "cause").join(pl.concat(flags), on=[*keys, "cause"], how="left") \
        .with_columns(pl.col("stands_out").fill_null(False))


def slow_steps(steps: pl.DataFrame, causes: pl.DataFrame, training: pl.DataFrame,
               trailing: bool = False) -> tuple[np.ndarray, pl.DataFrame, str]:
    """(flags over `steps` — the decomposition's step frame, in step order —, `standing_out` of
    each step × cause, the rule in words). A step is slow when excess_s > 5% of expected_s and
    either excess_s is above the robust threshold of the training steps' excess, or one of its
    causes stands out. The second test finds a cause hidden in the spread that the workload and
    its drift give every step's excess (validation and checkpoints, absent from training steps,
    stand out whenever they are there)."""
    keys = ["segment", "step"]
    in_training = steps.select(keys).join(training.select(keys).with_columns(hit=pl.lit(True)), on=keys,
                                          how="left", maintain_order="left")["hit"].fill_null(False).to_numpy()
    excess_rule = Threshold.robust(steps["excess_s"].to_numpy()[in_training])
    expected = steps["expected_s"].to_numpy()
    excess = steps["excess_s"].to_numpy()
    by_excess = excess_rule.above(excess, expected)
    standout = standing_out(steps, causes, in_training, trailing)
    any_cause = steps.select(keys).join(
        standout.group_by(keys).agg(pl.col("stands_out").any()), on=keys, how="left", maintain_order="left"
    )["stands_out"].fill_null(False).to_numpy()
    slow = (by_excess | any_cause) & (excess > MIN_EXCESS_SHARE * expected)
    text = (f"excess > {MIN_EXCESS_SHARE:.0%} of the expected step, and either > median + {ROBUST_Z}·{MAD_SCALE}·MAD"
            f" of the training steps' excess (= {excess_rule.value:.3g} s) or with one"
            f" cause > {MIN_CAUSE_SHARE:.0%} of it standing out from its level over the nearest {LOCAL_WINDOW}"
            f" training steps by more than median + {CAUSE_Z}·{MAD_SCALE}·MAD of such deviations")
    return slow, standout, text
