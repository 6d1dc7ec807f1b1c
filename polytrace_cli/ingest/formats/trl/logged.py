"""Hugging Face TRL's logged metrics, shared by every TRL source (console, trainer_state.json,
TensorBoard, wandb, MLflow).

TRL's trainers (GRPOTrainer, RLOOTrainer, PPOTrainer, and Unsloth, which patches them) log one
dict per logging step through the transformers Trainer. The same dict reaches the console
(`{'loss': ..., 'reward': ..., 'epoch': 0.01}`), `trainer_state.json`'s `log_history` (with a
`step`), and TensorBoard or wandb with a `train/` prefix. Keys are mapped to the canonical step
columns by `metric_aliases` rows (completions/mean_length -> response_length_mean, ...).

Traps every source shares:
- `num_tokens` is cumulative (tokens seen since the start of training): the tokens of a step are
  derived as `num_tokens/per_step` (`tokens_per_step`), never read off the cumulative count.
- With `logging_steps` > 1, each logged value is the mean over the steps since the last log, so a
  derived per-step quantity is divided by the steps the interval covers.
- TRL 0.14 logs `completion_length` where newer versions log `completions/mean_length`.
- A run may print the values as strings (`'loss': '0.0123'`): a string that reads as a number is
  that number (`scalar`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from polytrace_cli.lazy import polars as pl

CUMULATIVE_TOKENS = "num_tokens"
PER_STEP_TOKENS = "num_tokens/per_step"
STEP_TIME = "step_time"
# How many optimizer steps a logged row stands for: with `logging_steps` k > 1 the Trainer logs every
# k-th step the means over the k steps since its last log, so the run's seconds are Σ step_time · k.
STEPS_COVERED = "trl/steps_covered"
# A step time from the TensorBoard events' wall time where no `step_time` is logged.
WALL_TIME_STEP_S = "wall_time/step_s"

# Keys only TRL's RL trainers log (any one marks the source as TRL; raw keys, `train/` removed).
TRL_MARKERS = frozenset((
    "completions/mean_length", "completions/clipped_ratio", "completion_length", "frac_reward_zero_std",
    "objective/rlhf_reward", "objective/scores", "clip_ratio/region_mean", "completions/mean_terminated_length",
))
# Key prefixes of an RL dict, as opposed to an SFT dict of the same log (`loss`, `grad_norm`, ...).
RL_PREFIXES = ("reward", "kl", "completions/", "completion_length", "objective/", "frac_reward_zero_std",
               "clip_ratio", "policy/", "rewards/")


# Unsloth's GRPO trainer logs its own `completion_length` (not the mean) beside TRL's
# `completions/mean_length`; where both are logged the mean is TRL's, and Unsloth's key is stored as
# `unsloth/completion_length` (no alias) so that it cannot be read as the mean. TRL 0.14 logs
# `completion_length` alone: there it is the mean.
MEAN_LENGTH = "completions/mean_length"
OLD_MEAN_LENGTH = "completion_length"
SHADOWED_MEAN_LENGTH = "unsloth/completion_length"


def mean_length_key(key: str, keys: Iterable[str]) -> str:
    """The stored key of `key` in a logged dict holding `keys` (see SHADOWED_MEAN_LENGTH)."""
    return SHADOWED_MEAN_LENGTH if key == OLD_MEAN_LENGTH and MEAN_LENGTH in keys else key


def shadow_old_mean_length(pairs: pl.DataFrame, record: str | list[str] = "line_no") -> pl.DataFrame:
    """`pairs` (a `key` column, one record per `record` value) with `completion_length` stored as
    `unsloth/completion_length` in the records that also log `completions/mean_length`."""
    if not pairs.select((pl.col("key") == OLD_MEAN_LENGTH).any()).item():
        return pairs
    both = pl.col("key").is_in([MEAN_LENGTH]).any().over(record)
    return pairs.with_columns(key=pl.when((pl.col("key") == OLD_MEAN_LENGTH) & both)
                              .then(pl.lit(SHADOWED_MEAN_LENGTH)).otherwise(pl.col("key")))


def is_trl(keys: Iterable[str]) -> bool:
    """True when the keys (with or without TRL's `train/` prefix) include one only TRL logs."""
    return any(key.removeprefix("train/") in TRL_MARKERS for key in keys)


def is_summary_dict(keys: Iterable[str]) -> bool:
    """True for the Trainer's end-of-training dict (`train_runtime`, `train_loss`, ...)."""
    return "train_runtime" in set(keys)


def store_key(key: str, in_eval_dict: bool = False) -> str:
    """The stored key of a logged key: the Trainer's `eval_` prefix becomes `eval/` (validation),
    and an evaluation dict's `epoch` is `eval/epoch` (the training dict of the same step has its own)."""
    if key.startswith("eval_"):
        return "eval/" + key[len("eval_"):]
    return "eval/epoch" if in_eval_dict and key == "epoch" else key


def is_eval_dict(keys: Iterable[str]) -> bool:
    """True for an evaluation dict: only `eval_*` keys besides `epoch` (and `step`)."""
    keys = [key for key in keys if key not in ("epoch", "step")]
    return bool(keys) and all(key.startswith("eval_") for key in keys)


class TooLarge(ValueError):
    """A logged number that no double holds (`1e400`, a 400-digit integer, or such a string)."""


_NON_FINITE_SPELLINGS = ("inf", "infinity", "nan")


def scalar(value) -> tuple[float | None, str | None]:
    """(value, text_value) of one logged item: numbers, and strings that read as numbers, as
    doubles; booleans as 0/1; other strings as text; None as missing. A number no double holds
    (an int beyond ±1.8e308, a string such as '1e400' that is not a spelling of inf or nan) raises
    TooLarge: it is never stored as infinity."""
    if isinstance(value, bool):
        return float(value), None
    if isinstance(value, int):
        try:
            return float(value), None
        except OverflowError:
            raise TooLarge(str(value)[:40]) from None
    if isinstance(value, float):
        return value, None
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None, value
        if math.isinf(number) and value.strip().lstrip("+-").lower() not in _NON_FINITE_SPELLINGS:
            raise TooLarge(value[:40])
        return number, None
    return None, None


def tokens_per_step(frame: pl.DataFrame, group: str = "group") -> pl.DataFrame:
    """Rows of `num_tokens/per_step` from the cumulative `num_tokens` rows of `frame` (columns
    `group`, step, key, value, and line_no): one row per logged step,

        per_step(i) = (num_tokens(i) - num_tokens(i-1)) / (step(i) - step(i-1))

    within a group (a segment or phase), in step order. The first logged step of a group covers
    steps 1..step(1) only when the log starts at the beginning of training, which is taken to hold
    when step(1) equals the next logging interval step(2) - step(1), or is step 1 (`logging_first_step`
    logs it before every L-th): then per_step(1) = num_tokens(1) / step(1); otherwise it is not
    known and left out. A count that does not grow
    (a restarted counter) gives no row."""
    columns = [group, "step", "key", "value", "line_no"]
    tokens = frame.filter(pl.col("key") == CUMULATIVE_TOKENS).select(columns).sort(group, "step")
    if not tokens.height:
        return frame.clear().select(columns)
    previous_step = pl.col("step").shift(1).over(group)
    previous_value = pl.col("value").shift(1).over(group)
    interval = (pl.col("step").shift(-1) - pl.col("step")).over(group)
    first = previous_step.is_null()
    derived = tokens.with_columns(
        value=pl.when(first & ((interval == pl.col("step")) | (pl.col("step") == 1)))
        .then(pl.col("value") / pl.col("step"))
        .when(~first & (pl.col("step") > previous_step) & (pl.col("value") > previous_value))
        .then((pl.col("value") - previous_value) / (pl.col("step") - previous_step)),
        key=pl.lit(PER_STEP_TOKENS),
    )
    return derived.filter(pl.col("value").is_not_null() & pl.col("value").is_finite())



def wall_time_step_seconds(frame: pl.DataFrame) -> pl.DataFrame:
    """Rows of `wall_time/step_s` (columns segment, step, key, value, line_no) from the wall time of
    the events of each logged training step (`frame`: segment, step, key, value, line_no, wall_time),
    when the run logs no `step_time`:

        step_s(i) = (wall(i) - wall(i-1)) / (step(i) - step(i-1)),  wall(i) = latest event of step i

    within a segment, in step order; the first logged step has no row (when its interval began is
    not known). Validation keys (`eval/`) do not date a step."""
    columns = ["segment", "step", "key", "value", "line_no"]
    if (frame.get_column("key") == STEP_TIME).any():
        return frame.clear().select(columns)
    walls = (frame.filter(~pl.col("key").str.starts_with("eval/") & pl.col("wall_time").is_not_null())
             .group_by("segment", "step").agg(wall=pl.col("wall_time").max(), line_no=pl.col("line_no").max())
             .sort("segment", "step"))
    previous_step = pl.col("step").shift(1).over("segment")
    seconds = (pl.col("wall") - pl.col("wall").shift(1).over("segment")) / (pl.col("step") - previous_step)
    return (walls.with_columns(value=seconds, key=pl.lit(WALL_TIME_STEP_S))
            .filter(pl.col("value").is_not_null() & (pl.col("value") >= 0)).select(columns))


def steps_covered_rows(frame: pl.DataFrame, group: str, interval: int | None = None) -> pl.DataFrame:
    """Rows of `trl/steps_covered` (columns group, step, key, value, line_no) for the training records
    of `frame` (group, step, key, value, line_no; validation keys `eval/` do not make a record): each
    logged step stands for `interval` steps, the logging interval; when not given, the greatest common
    divisor of the logged training steps (the Trainer logs when global_step % logging_steps == 0).
    No rows with an interval of 1."""
    columns = [group, "step", "key", "value", "line_no"]
    training = (frame.filter(~pl.col("key").str.starts_with("eval/") & (pl.col("key") != STEPS_COVERED))
                .group_by(group, "step").agg(line_no=pl.col("line_no").max()))
    if interval is None:
        steps = [step for step in training.get_column("step").to_list() if step > 0]
        interval = math.gcd(*steps) if steps else 1
    if interval <= 1 or not training.height:
        return frame.clear().select(columns)
    return training.with_columns(key=pl.lit(STEPS_COVERED), value=pl.lit(float(interval))).select(columns).sort(
        group, "step")
