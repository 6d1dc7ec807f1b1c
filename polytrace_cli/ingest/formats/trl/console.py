"""TRL console log: the stdout of a transformers Trainer running one of TRL's RL trainers
(GRPOTrainer, RLOOTrainer, PPOTrainer; Unsloth patches them and prints the same dicts).

The Trainer prints each logging step's metrics as a Python dict repr above its progress bar:

     10%|█         | 10/100 [01:40<15:00, 10.00s/it]
    {'loss': 0.0123, 'grad_norm': 0.5, 'learning_rate': 1e-06, 'num_tokens': 40960.0,
     'completions/mean_length': 312.5, 'reward': 0.41, 'kl': 0.002, 'epoch': 0.01}

and at the end `{'train_runtime': ..., 'train_loss': ..., 'epoch': ...}`. Traps handled:

- No step in the dict. It is the training bar's counter (`10/100`: the bar without a
  description, drawn when the step ended) last drawn before the dict; without a bar it is
  `k × logging_steps` for the k-th dict when the log prints `logging_steps=N`, else k (flag
  `step_estimated`). `epoch` is fractional and stored as it is, never taken for a step.
- Progress bars redraw with carriage returns, so a dict often shares a line with bar pieces;
  the pipeline keeps the dict piece (anchor `{'`), this module reads the bar pieces.
- Older TRL (0.14) logs `completion_length`, and some versions print values as strings
  (`'loss': '0.0123'`): a string that reads as a number is stored as that number.
- `num_tokens` is cumulative: `num_tokens/per_step` is derived per logged step
  (`trl.tokens_per_step`).
- Step time is `step_time` in recent TRL; without it the training bar's elapsed time gives it:
  (elapsed at this dict's step - elapsed at the previous dict's step) / steps between, stored as
  `tqdm/step_s` and flagged `tqdm_estimate` (the elapsed time is printed in whole seconds).
- An SFT stage may precede the RL stage in one log (a new progress bar, or the end-of-training
  dict, starts a stage). When a log holds an RL stage, the dicts of stages without RL keys are
  kept apart: counted under the ignore rule `SFT stage dict`, their count and last loss in the run
  meta (`trl_sft_stage`), never mixed into the RL steps.
- With `logging_steps` > 1 the first logged step is `logging_steps`; a log whose bar starts at 0
  is not flagged `resumed` for it. With `logging_first_step=True` the Trainer also logs step 1:
  the dicts are step 1, then L, 2L, ... (`_first_step` says how that is told when not printed), and
  the second row stands for L - 1 steps.
- The dicts of a log are numbered together (bars, stages, the SFT stage before the RL one), so the
  pipeline reads a TRL log as one block (`ConsoleGrammar.whole_log`), not block by block.
- A log that grew is read from where the last read ended, with what that read kept of the bars,
  the current stage, its numbering and its last cumulative token count (`follow_state`). It is
  read whole again when the new lines would change how earlier dicts were read: an RL dict after
  dicts without RL keys, a bar total drawn before that only now belongs to the training bar,
  `logging_steps` first printed after estimated steps, or a second token count after a stage's
  first (whose per-step count the second decides).
- A log that stops mid-run (no end-of-training dict, bar below its total) keeps every step it
  has and says where it stops.
- `eval_*` keys are stored as `eval/*` (validation), at the step of the training dict before.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from polytrace_cli.errors import ErrorCode
from polytrace_cli.lazy import polars as pl

from polytrace_cli.ingest import run_metadata
from polytrace_cli.ingest.formats.trl import names as trl_names
from polytrace_cli.ingest.formats.trl import logged as trl
from polytrace_cli.ingest.base import FileContext, Ingester
from polytrace_cli.ingest.console import ConsoleGrammar, ParsedMetrics, load_console
from polytrace_cli.ingest.console.pipeline import flag_schema, metric_schema
from polytrace_cli.ingest.formats.openrlhf.console import _literal_payload, _too_large_for_double
from polytrace_cli.ingest.registry import is_binary, register

# A training bar piece: no description before the percentage, then `n/total [elapsed<`.
TRAINING_BAR = r"(?:^|\r)\s*\d+%\|[^|\r\n]*\|\s*(\d+)/(\d+)\s*\[(?:(\d+):)?(\d+):(\d+)<"
# The end of a TRAINING_BAR match, with the same groups (a shorter regex to run on each match).
BAR_END = r"(\d+)/(\d+)\s*\[(?:(\d+):)?(\d+):(\d+)<$"
# transformers' `Total train batch size (w. parallel, distributed & accumulation) = 8`, Unsloth's
# `Total batch size (2 x 4 x 1) = 8`.
TOTAL_BATCH = r"Total (?:train )?batch size[^=\n]*=\s*([\d,]+)"
LOGGING_STEPS = r"\blogging_steps\s*[=:]\s*['\"]?(\d+(?:\.\d+)?)"
# TrainingArguments' `logging_first_step=True` (its repr), `'logging_first_step': True` (a dict or YAML).
LOGGING_FIRST_STEP = r"\blogging_first_step\s*[=:]\s*['\"]?(True|False|true|false)\b"
# The console prints a dict's epoch rounded to two decimals (transformers' ProgressCallback.on_log).
EPOCH_ROUNDING = 0.005
VERSION_PATTERNS = {
    "trl_version": r"(?i)\bTRL(?: version)?\s*[:=]{0,2}\s*v?(\d+\.\d+(?:\.\d+)?(?:\.dev\d+)?)",
    "unsloth_version": r"Unsloth (\d{4}\.\d+\.\d+)",
    "transformers_version": r"Transformers:? v?(\d+\.\d+(?:\.\d+)?)",
}

_SNIFF_DICT = re.compile(rb"\{'[^'\n]{1,80}': [^\n]{0,4000}'epoch': ")
# Text only a TRL job prints before its first dict (vLLM and model loading can fill the first 64 KB):
# Unsloth's banner, TRL's config reprs and trainer names. OpenRLHF's `PPOTrainer` is not one of them.
_SNIFF_BANNER = re.compile(rb"==\(\(====\)\)==\s+Unsloth|\b(?:GRPO|RLOO)(?:Trainer|Config)\b|\btrl==\d")

# A dict in the plain form the Trainer prints: 'key': value pairs whose values are numbers, nan,
# inf, True, False, None, or quoted strings that are a plain number or hold no digit and no space
# (so that a cast reads them as Python's float() would). Such lines are split in bulk.
_NUMBER = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|inf)"
_VALUE = rf"(?:{_NUMBER}|True|False|None|'{_NUMBER}'|'[^'\\0-9\s]*')"
SIMPLE_DICT = rf"^\{{'[^'\\]*': {_VALUE}(?:, '[^'\\]*': {_VALUE})*\}}\s*$"
RL_KEY = "^(?:" + "|".join(re.escape(prefix) for prefix in trl.RL_PREFIXES) + ")"


def pair_schema() -> dict:
    """Columns of the pairs read from the dicts, before their steps are known."""
    return {"line_no": pl.Int64, "pair_index": pl.Int64, "key": pl.String, "value": pl.Float64,
            "text_value": pl.String}

SFT_RULE = "SFT stage dict"
# The counts of the last training bar an appended read keeps (a dict may be printed well after its count was drawn).
RECENT_DRAWS = 1000
SUMMARY_RULE = "end-of-training dict (run meta)"
OTHER_DICT_RULE = "printed dict (not a metrics dict)"


@register
class TrlConsoleIngester(Ingester):
    name = "trl-console"
    version = "1"
    framework = "trl"
    appendable = True
    description = "TRL / Unsloth console log (Trainer metric dicts under a tqdm bar: GRPO, RLOO, PPO)"
    metric_aliases = trl_names.METRIC_ALIASES
    validation_prefixes = trl_names.VALIDATION_PREFIXES

    def sniff(self, path: Path, head: bytes) -> bool:
        if path.suffix in (".json", ".jsonl", ".csv", ".yaml", ".yml", ".py") or is_binary(head):
            return False
        return bool(_SNIFF_DICT.search(head) or _SNIFF_BANNER.search(head))

    def load(self, ctx: FileContext) -> None:
        load_console(ctx, TrlGrammar())


class TrlGrammar(ConsoleGrammar):
    """The Trainer's dict lines, numbered by the training bar (see the module)."""

    anchor = "{'"
    # The Trainer's dict of a logging step, anywhere in the line.
    record_hint = r"\{'(?:loss|reward|epoch|learning_rate|grad_norm)': "
    whole_log = True
    # The last dict's step and bar total, and the SFT stage's count: what the whole log gives.
    recomputed_meta = frozenset({"trl_last_step", "trl_max_steps", "trl_sft_stage", "trl_train_summary",
                                 "trl_logging_steps", "trl_logging_steps_source", "trl_logging_first_step", "crash",
                                 "trl_total_batch_size"})

    def __init__(self) -> None:
        self.meta: dict = {}
        self.summary: dict | None = None
        self.dicts = pl.DataFrame()  # the kept dicts (`_read_dicts` columns, stage, step)
        self.before: dict | None = None  # the state the last read left (an appended read)
        self.state: dict = {}
        self.cannot_follow = False
        # Of the training bars (by `bar_stage`): the elapsed seconds when each count was first drawn,
        # the first and the last count drawn.
        self.draws: pl.DataFrame | None = None
        self.bar_first: dict[int, int] = {}
        self.bar_max: dict[int, int] = {}
        self.last_counters: dict[int, int | None] = {}
        self.summary_values: dict[int, dict] = {}  # per stage, its end-of-training dict
        # Per stage: logging interval, its source, offset, whether the first step is logged too.
        self.intervals: dict[int, tuple[int, str, int, bool]] = {}

    def metric_kind(self, cleaned: pl.Expr, raw_chars: pl.Expr) -> pl.Expr:
        starts = cleaned.str.starts_with("{'")
        return (pl.when(starts & cleaned.str.strip_chars_end().str.ends_with("}")).then(pl.lit("metric"))
                .when(starts & cleaned.str.contains("'epoch'|'loss'")).then(pl.lit("dirty")))

    def parse(self, ctx: FileContext, lines: pl.DataFrame) -> ParsedMetrics:
        """Pairs of the RL stage's dicts (or of every dict when the log has no RL stage), the
        derived `num_tokens/per_step` and `tqdm/step_s`, and the flags of estimated steps."""
        before = self.before = (ctx.resume or {}).get("trl")
        bars, self.state["bars"], retroactive, draws = _bar_points(lines, before["bars"] if before else None)
        if before and before["recent_draws"]:  # the counts of the bar the last read ended in, drawn first then
            recent = pl.DataFrame(before["recent_draws"], schema=draws.schema, orient="row")
            draws = pl.concat([recent, draws.join(recent, on=["bar_stage", "counter"], how="anti")])
        self.draws = draws
        extent = draws.group_by("bar_stage", maintain_order=True).agg(
            first=pl.col("counter").first(), second=pl.col("counter").get(1, null_on_oob=True),
            last=pl.col("counter").max())
        self.bar_first = {stage: (first, second) for stage, first, second in
                          extent.select("bar_stage", "first", "second").iter_rows()}
        self.bar_max = dict(extent.select("bar_stage", "last").iter_rows())
        if before:  # the bar the last read ended in: its first count and last count
            for bar_stage, first, second, last in before["bar_extent"]:
                self.bar_first[bar_stage] = (first, second if second is not None else self.bar_first.get(
                    bar_stage, (None, None))[0])
                self.bar_max[bar_stage] = max(self.bar_max.get(bar_stage, last), last)
        last_bar = (self.state["bars"]["bar"] or {}).get("bar_stage")
        self.state["bar_extent"] = ([[last_bar, *self.bar_first[last_bar], self.bar_max[last_bar]]]
                                    if last_bar in self.bar_first else [])
        self.state["recent_draws"] = [] if last_bar is None else [
            list(row) for row in draws.filter(pl.col("bar_stage") == last_bar).tail(RECENT_DRAWS).rows()]
        self.cannot_follow |= retroactive
        pairs, dicts = self._read_dicts(ctx, lines.filter(pl.col("kind").is_in(["metric", "dirty"])), bars)
        pairs, dicts = self._stage_kinds(dicts, pairs)
        has_rl = bool(dicts.get_column("rl").any()) or bool(before and before["has_rl"])
        if before and before["dicts"] and not before["has_rl"] and has_rl:
            self.cannot_follow = True  # the dicts read before become an SFT stage
        printed = _logging_steps(lines)
        first_printed = _printed_arguments(lines, LOGGING_FIRST_STEP, lambda text: text.lower() == "true")
        if before:
            earlier_first = before.get("first_step_printed", [])
            if before["dicts"] and ((not before["logging_printed"] and printed) or (not earlier_first and first_printed)):
                self.cannot_follow = True  # the dicts read before would be numbered by it
            printed = [tuple(item) for item in before["logging_printed"]] + printed
            first_printed = [tuple(item) for item in earlier_first] + first_printed
        found_steps = printed[0][1] if printed else None
        self.meta = {"logging_steps": int(found_steps) if found_steps is not None and found_steps >= 1 else found_steps}
        sft = dicts.filter(~pl.col("rl_stage")).get_column("line_no") if has_rl else dicts.clear().get_column("line_no")
        sft_before = before["sft"] if before else {"dicts": 0, "last_loss": None}
        self.state.update(has_rl=has_rl, logging_printed=[list(item) for item in printed],
                          first_step_printed=[list(item) for item in first_printed], sft=sft_before,
                          dicts=(before["dicts"] if before else 0) + dicts.height)
        if sft.len():
            ctx.ignore(SFT_RULE, sft.len())
            losses = pairs.filter(pl.col("line_no").is_in(sft.implode()) & (pl.col("key") == "loss")).get_column("value")
            last_loss = losses[-1] if losses.len() else sft_before["last_loss"]
            self.meta["trl_sft_stage"] = self.state["sft"] = {"dicts": sft_before["dicts"] + sft.len(),
                                                              "last_loss": last_loss}
            ctx.note(f"{sft.len()} SFT dict(s) before the RL stage kept apart (ignore rule '{SFT_RULE}')")
        kept = dicts.filter(pl.col("rl_stage")) if has_rl else dicts
        return self._number(ctx, kept, pairs, printed, first_printed)

    def follow_state(self) -> dict | None:
        """The bars, the current stage and its numbering after this read (see the module), or None
        when an appended read cannot go on from it."""
        return None if self.cannot_follow else {"trl": self.state}

    def _read_dicts(self, ctx: FileContext, metric_lines: pl.DataFrame,
                    bars: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
        """(pairs: line_no, pair_index, key, value, text_value of every metrics dict; one row per
        metrics dict, in line order, with its bar point and what its keys say). Dicts in the plain
        form the Trainer prints (`SIMPLE_DICT`) are split in bulk; the others are read one by one
        with a Python literal parser. End-of-training and other dicts are counted here; the others
        are left out."""
        rows = metric_lines.join(bars, on="line_no", how="left").sort("line_no")
        simple = pl.col("c").str.contains(SIMPLE_DICT)
        pairs = _simple_pairs(rows.filter(simple))
        others = rows.filter(~simple)
        if others.height:
            pairs = pl.concat([pairs, self._literal_pairs(ctx, others)]).sort("line_no", "pair_index")
        pairs = _reject_overflow(ctx, pairs, rows)
        keys = pl.col("key")
        per_line = pairs.group_by("line_no").agg(
            summary=(keys == "train_runtime").any(),
            epoch=(keys == "epoch").any(),
            epoch_value=pl.col("value").filter(keys == "epoch").first(),
            rl=keys.str.contains(RL_KEY).any(),
            has_eval=keys.str.starts_with("eval_").any(),
            only_eval=(keys.str.starts_with("eval_") | keys.is_in(["epoch", "step"])).all(),
            step_time=(keys == trl.STEP_TIME).any(),
        ).join(rows.select("line_no", "counter", "total", "elapsed", "bar_stage", "bar_from_zero"), on="line_no"
               ).sort("line_no")
        ctx.ignore(SUMMARY_RULE, int(per_line.get_column("summary").sum()))
        other = ~pl.col("summary") & ~pl.col("epoch") & ~pl.col("rl")
        ctx.ignore(OTHER_DICT_RULE, int(per_line.select(other.sum()).item()))
        dicts = per_line.filter(~other).with_columns(
            eval=pl.col("has_eval") & pl.col("only_eval"), bar_from_zero=pl.col("bar_from_zero").fill_null(False)
        ).drop("has_eval", "only_eval")
        if dicts.height == per_line.height:  # every dict kept (each line of `pairs` is a row of per_line)
            return pairs, dicts
        return pairs.filter(pl.col("line_no").is_in(dicts.get_column("line_no").implode())), dicts

    @staticmethod
    def _literal_pairs(ctx: FileContext, rows: pl.DataFrame) -> pl.DataFrame:
        """Pairs of the dicts not in the plain form, read with a Python literal parser (numpy
        reprs, nested values, escaped strings); a line that does not read as a dict is rejected."""
        records: list[tuple] = []
        for line_no, raw, cleaned in rows.select("line_no", "raw", "c").iter_rows():
            try:
                payload = _literal_payload(cleaned.strip())
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as error:
                ctx.reject(line_no, f"metrics dict is not a Python dict literal: {type(error).__name__}", raw,
                           code=ErrorCode.UNPARSABLE_LINE)
                continue
            if not isinstance(payload, dict):
                ctx.reject(line_no, f"payload is a {type(payload).__name__}, not a dict", raw, code=ErrorCode.UNPARSABLE_LINE)
                continue
            if not payload:
                ctx.ignore(OTHER_DICT_RULE)
            try:
                records.extend([(line_no, index, str(key), *trl.scalar(value))
                                for index, (key, value) in enumerate(payload.items(), start=1)])
            except trl.TooLarge as error:
                ctx.reject(line_no, f"value {error} is out of range for a double", raw, code=ErrorCode.OUT_OF_RANGE)
        return pl.DataFrame(records, schema=pair_schema(), orient="row")

    def _stage_kinds(self, dicts: pl.DataFrame, pairs: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Cut the dicts into stages (a new bar, or the dict after an end-of-training dict, starts
        one), mark each `rl_stage`, and take out the end-of-training dicts: the last kept stage's
        becomes `self.summary`. An appended read goes on in the stage the last read ended in.
        Returns the pairs and the dicts without the end-of-training ones, each dict with its `stage`.

        In line order, with b(i) the bar stage of dict i and p(i) the last bar stage of a dict before
        it that is not an end-of-training dict: stage(i) = base + (end-of-training dicts before i) +
        (dicts j ≤ i with b(j) ≠ p(j), both known, whose stage holds a dict before j)."""
        before = self.before
        base, last_bar_stage = (before["stage"], before["last_bar_stage"]) if before else (0, None)
        earlier = before["stage_dicts"] if before else 0  # dicts of the current stage read before
        summary = pl.col("summary")
        seen_bar = pl.when(~summary).then(pl.col("bar_stage")).forward_fill().shift(1)
        if last_bar_stage is not None:
            seen_bar = seen_bar.fill_null(last_bar_stage)
        after_summary = summary.shift(1)
        # The stage holds a dict already unless the dict is the first after an end-of-training dict,
        # or the first of this read with no dict of its stage read before.
        holds_one = after_summary.is_not_null() & ~after_summary.fill_null(False) | (
            after_summary.is_null() & pl.lit(earlier > 0))
        cut = (~summary & pl.col("bar_stage").is_not_null() & seen_bar.is_not_null()
               & (pl.col("bar_stage") != seen_bar) & holds_one)
        dicts = dicts.with_columns(stage=(pl.lit(base, pl.Int64) + after_summary.fill_null(False).cast(pl.Int64).cum_sum()
                                          + cut.cast(pl.Int64).cum_sum()))
        stage = base + int(dicts.get_column("summary").sum()) + int(
            dicts.select(cut.sum()).item()) if dicts.height else base
        members = dicts.filter(~summary)
        seen = members.get_column("bar_stage").drop_nulls()
        last_bar_stage = seen[-1] if seen.len() else last_bar_stage
        rl_stages = members.group_by("stage").agg(rl_stage=pl.col("rl").any())
        if before and before["stage_dicts"]:
            rl = rl_stages.filter(pl.col("stage") == base).get_column("rl_stage").any()
            if rl and not before["stage_rl"]:
                self.cannot_follow = True  # the stage's dicts read before become RL ones
            if before["stage_rl"]:
                rl_stages = pl.concat([rl_stages.filter(pl.col("stage") != base),
                                       pl.DataFrame({"stage": [base], "rl_stage": [True]}, schema=rl_stages.schema)])
        members = members.join(rl_stages, on="stage", how="left", maintain_order="left")
        summaries = dict(dicts.filter(summary).select("stage", "line_no").iter_rows())
        values = pairs.filter(pl.col("line_no").is_in(list(summaries.values())))
        for summary_stage, line_no in summaries.items():
            self.summary_values[summary_stage] = dict(
                values.filter(pl.col("line_no") == line_no).select("key", "value").iter_rows())
        has_rl = bool(members.get_column("rl_stage").any()) or bool(before and before["has_rl"])
        kept = (members.filter(pl.col("rl_stage")) if has_rl else members).get_column("stage")
        last_kept = kept[-1] if kept.len() else (before["last_kept_stage"] if before else None)
        summary_line = summaries.get(last_kept) if last_kept is not None else None
        if summary_line is not None:
            self.summary = self.summary_values[last_kept]
        elif before and last_kept == before["last_kept_stage"]:
            self.summary = before.get("summary")  # the kept stage's end-of-training dict, read before
        last_members = members.filter(pl.col("stage") == stage)
        self.state.update(stage=stage, last_bar_stage=last_bar_stage, last_kept_stage=last_kept, summary=self.summary,
                          stage_dicts=(earlier if stage == base else 0) + last_members.height,
                          stage_rl=bool(last_members.get_column("rl_stage").any()) or bool(
                              stage == base and before and before["stage_rl"]))
        if not summaries:
            return pairs, members
        return pairs.filter(~pl.col("line_no").is_in(list(summaries.values()))), members

    def _number(self, ctx: FileContext, dicts: pl.DataFrame, pairs: pl.DataFrame,
                logging_printed: list[tuple[int, float]], first_printed: list[tuple[int, bool]]) -> ParsedMetrics:
        """Steps, pairs and flags of the kept dicts (see the module for the rules): the k-th
        training dict of a stage is step offset + k × logging_steps (`_interval`), or, when the
        first step is logged too (`logging_first_step`), step 1 and then offset + (k - 1) ×
        logging_steps; an evaluation dict takes the step of the training dict before it. Each
        training row of an interval above 1 stands for step - (the training step before) steps
        (`trl/steps_covered`); the bar's step time is (elapsed at this step - elapsed at the last
        step it was drawn at) / (steps between). All in bulk, stage by stage."""
        before = self.before
        carried = {before["stage"]: before["numbering"]} if before and before.get("numbering") else {}
        numberings: dict[int, dict] = dict(carried)
        numbered, covered, timed, flags = [], [], [], []
        for stage in dicts.get_column("stage").unique(maintain_order=True).to_list():
            members = dicts.filter(pl.col("stage") == stage)
            numbering = carried.get(stage)
            train = members.filter(~pl.col("eval"))
            interval, source, offset, first_step = self._interval(stage, members, train, numbering,
                                                                  logging_printed, first_printed)
            if numbering and (numbering["interval"], numbering["offset"], numbering.get("first_step", False),
                              numbering["source"]) != (interval, offset, first_step, source):
                self.cannot_follow = True  # the dicts read before would be numbered (or flagged) otherwise
            ordinal = numbering["ordinal"] if numbering else 0
            previous = tuple(numbering["previous"]) if numbering and numbering["previous"] else None
            last_train = numbering["last_train_step"] if numbering else None
            if previous is None and ordinal == 0 and train.height and train.get_column("bar_from_zero")[0]:
                previous = (offset, 0.0)  # the bar was drawn at the stage's start: its clock starts there
            k = pl.col("ordinal")
            steps = train.with_columns(ordinal=pl.int_range(ordinal + 1, ordinal + train.height + 1, dtype=pl.Int64))
            steps = steps.with_columns(step=pl.when(k <= int(first_step)).then(k).otherwise(
                offset + (k - int(first_step)) * interval))
            steps = steps.with_columns(since=pl.col("step").shift(1).fill_null(
                last_train if last_train is not None else offset))
            steps = steps.join(self.draws.rename({"counter": "step"}), on=["bar_stage", "step"], how="left",
                               maintain_order="left")
            drawn = pl.col("elapsed_right").is_not_null()
            steps = steps.with_columns(
                previous_step=pl.when(drawn).then(pl.col("step")).shift(1).forward_fill(),
                previous_elapsed=pl.when(drawn).then(pl.col("elapsed_right")).shift(1).forward_fill())
            if previous is not None:
                steps = steps.with_columns(pl.col("previous_step").fill_null(previous[0]),
                                           pl.col("previous_elapsed").fill_null(previous[1]))
            ticked = steps.filter(~pl.col("step_time") & drawn & pl.col("previous_step").is_not_null()
                                  & (pl.col("step") > pl.col("previous_step"))).select(
                "line_no", "step", seconds=(pl.col("elapsed_right") - pl.col("previous_elapsed"))
                / (pl.col("step") - pl.col("previous_step")), over=pl.col("step") - pl.col("previous_step"))
            numbered.append(members.join(steps.select("line_no", "step"), on="line_no", how="left",
                                         maintain_order="left").select(
                "line_no", pl.col("step").forward_fill().fill_null(last_train if last_train is not None else offset),
                group=pl.lit(stage, pl.Int64), eval="eval"))
            if interval > 1:  # the row's values are means over the steps since the last log
                covered.append(steps.select("line_no", value=(pl.col("step") - pl.col("since")).cast(pl.Float64)))
            if source == "order":
                flags.append(steps.select("line_no", "step", flag=pl.lit("step_estimated"), detail=pl.format(
                    "no step printed and no logging interval known: dict number {}", "ordinal")))
            timed.append(ticked.select("line_no", "seconds"))
            flags.append(ticked.select("line_no", "step", flag=pl.lit("tqdm_estimate"), detail=pl.format(
                "step time from the progress bar's elapsed time, mean over {} step(s)", "over")))
            last_drawn = steps.filter(drawn).select("step", "elapsed_right").tail(1).rows()
            previous = last_drawn[0] if last_drawn else previous
            away = steps.select((pl.col("counter").is_not_null() & (pl.col("counter") != pl.col("step"))).sum()).item()
            numberings[stage] = {"interval": interval, "source": source, "offset": offset, "first_step": first_step,
                                 "ordinal": ordinal + train.height, "previous": list(previous) if previous else None,
                                 "last_train_step": steps.get_column("step")[-1] if steps.height else last_train,
                                 "last_counter": self.last_counters.get(stage),
                                 "first_counter": numbering.get("first_counter") if numbering else (
                                     train.get_column("counter")[0] if train.height else None)}
            self.intervals[stage] = (interval, source, offset, first_step)
            if train.height:
                ctx.note(self._interval_note(interval, source, offset, train.height, first_step))
            if away:
                ctx.note(f"{away} of {train.height} dict(s) printed where the progress bar shows another step "
                         "(stdout and stderr buffered apart): numbered by their order, not by the bar")
        numbered = pl.concat(numbered) if numbered else pl.DataFrame(
            schema={"line_no": pl.Int64, "step": pl.Int64, "group": pl.Int64, "eval": pl.Boolean})
        self.dicts = dicts.join(numbered.select("line_no", "step"), on="line_no", maintain_order="left")
        extra = [frame.select("line_no", pair_index=pl.lit(998, pl.Int64), key=pl.lit(trl.STEPS_COVERED),
                              value="value", text_value=pl.lit(None, pl.String)) for frame in covered]
        extra += [frame.select("line_no", pair_index=pl.lit(999, pl.Int64), key=pl.lit("tqdm/step_s"),
                               value="seconds", text_value=pl.lit(None, pl.String)) for frame in timed]
        key = pl.col("key")
        metrics = trl.shadow_old_mean_length(pairs).join(numbered, on="line_no", maintain_order="left")
        if extra:
            metrics = pl.concat([metrics, pl.concat(extra).join(numbered, on="line_no", maintain_order="left")])
        if metrics.select((key.str.starts_with("eval_") | pl.col("eval")).any()).item():
            metrics = metrics.with_columns(
                key=pl.when(key.str.starts_with("eval_")).then(pl.lit("eval/") + key.str.slice(len("eval_")))
                .when(pl.col("eval") & (key == "epoch")).then(pl.lit("eval/epoch")).otherwise(key))
        tokens = metrics.filter(~pl.col("eval") & (key == trl.CUMULATIVE_TOKENS) & pl.col("value").is_not_null()
                                ).select("group", "step", "key", "value", "line_no")
        derived = trl.tokens_per_step(self._with_tokens_before(tokens)).filter(pl.col("line_no") > 0).with_columns(
            pair_index=pl.lit(1000, pl.Int64), text_value=pl.lit(None, pl.String))
        columns = ["line_no", "step", "pair_index", "key", "value", "text_value"]
        # Each part is in line order, and within a line the pairs come first, then 998, 999, 1000: a
        # stable sort by line gives the line and pair order.
        metrics = pl.concat([metrics.select(columns), derived.select(columns)]).sort("line_no", maintain_order=True) \
            .with_columns(raw_value=pl.lit(None, pl.String)).select(list(metric_schema()))
        flag_frame = (pl.concat(flags).sort("line_no", maintain_order=True) if flags
                      else pl.DataFrame(schema=flag_schema()))
        printed = numbered.select("line_no", printed=pl.col("step").cast(pl.String))
        self.state["numbering"] = numberings.get(self.state["stage"])
        return ParsedMetrics(metrics, flag_frame.select(list(flag_schema())), printed)

    def _interval(self, stage: int, members: pl.DataFrame, train: pl.DataFrame, numbering: dict | None,
                  logging_printed: list[tuple[int, float]],
                  first_printed: list[tuple[int, bool]]) -> tuple[int, str, int, bool]:
        """(logging interval L, where it comes from, offset, whether the first step is logged too)
        of a stage: its k-th training dict is step offset + k·L, as the Trainer logs when
        global_step % logging_steps == 0, or with `logging_first_step` (a dict at step 1 as well,
        `_first_step`) step 1 and then (k - 1)·L. L is, in order:
        the `logging_steps` printed last before the stage's first dict (a ratio below 1 is of the
        bar's total, rounded up, as transformers reads it) ('printed'); the bar's counter drawn before
        each dict when every one reads k·L (or 1, then (k - 1)·L) ('bar'); the bar's last counter C
        over the n dicts logged, ⌊(C - offset) / (n - first)⌋ ('bar count'); the steps of the
        end-of-training dict (train_runtime × train_steps_per_second) over n - first
        ('end-of-training dict'); else 1 ('order'). The offset is the
        steps done before the stage's bar was first drawn (a resumed run's bar starts at its step),
        rounded down to a multiple of L (the bar's count C is counted from the bar's first count in an
        appended read too). An appended read keeps the interval of the stage it goes on in when the new
        lines leave it unchanged; one that would change the interval, offset or source (and so the
        earlier dicts' steps or flags) reads the file whole."""
        bar_stages = members.get_column("bar_stage").drop_nulls()
        first, second = self.bar_first.get(bar_stages[0], (None, None)) if bar_stages.len() else (None, None)
        # A bar drawn first at n > 0 started there (tqdm's initial count); one drawn at 0 that then jumps
        # past 1 was resumed (the Trainer's bar jumps to the global step at the first step's end).
        bar_base = base = first if first else (second - 1 if second is not None and second > 1 else 0)
        if numbering is not None:
            base = numbering["offset"]
        ordinal = numbering["ordinal"] if numbering else 0
        n = ordinal + train.height
        totals = members.get_column("total").drop_nulls()
        total = totals[-1] if totals.len() else None
        first_line = members.get_column("line_no")[0]
        counters = train.get_column("counter")
        summary = self.summary_values.get(stage, {})

        def offset_for(interval: int) -> int:
            return base if numbering is not None else base - base % interval

        def first_step(interval: int | None, offset: int) -> bool:
            if numbering is not None:
                return bool(numbering.get("first_step", False))
            return offset == 0 and self._first_step(train, interval, total, summary, flag)

        printed = [value for line_no, value in logging_printed if line_no < first_line] or \
            [value for _, value in logging_printed[:1]]
        flags = [value for line_no, value in first_printed if line_no < first_line] or \
            [value for _, value in first_printed[:1]]
        flag = flags[-1] if flags else None
        first_counter = counters[0] if counters.len() else None
        if numbering is not None and flag is None and not numbering.get("first_step") and numbering["offset"] == 0 \
                and numbering.get("first_counter") == 1 and counters.len():
            found = _bar_interval(pl.concat([pl.Series([1], dtype=pl.Int64), counters.cast(pl.Int64)]), 0, 0, True)
            if found is not None and numbering["interval"] in (1, found) and ordinal == 1:
                self.cannot_follow = True  # the one dict read before was step 1 of a run logging its first step too
        if printed:
            value = printed[-1]
            interval = math.ceil(total * value) if value < 1 and total else int(value)
            if interval >= 1:
                offset = offset_for(interval)
                if numbering is None and offset and first_counter == interval:
                    offset = 0  # the bar's first draw was the first step's count, not a start count
                return interval, "printed", offset, interval > 1 and first_step(interval, offset)
        if numbering is not None and numbering["source"] in ("printed", "bar"):
            return numbering["interval"], numbering["source"], numbering["offset"], first_step(None, 0)
        carried_first = bool(numbering.get("first_step", False)) if numbering is not None else None
        for start in (base, 0) if base and numbering is None else (base,):
            if start == 0 and carried_first is None and flag is not False:
                hypotheses = (True, False) if flag else (False, True)
            else:
                hypotheses = (bool(carried_first) and start == 0,)
            for logged_first in hypotheses:
                interval = _bar_interval(counters, ordinal, start, logged_first)
                if interval is not None:
                    offset = start if numbering is not None else start - start % interval
                    return interval, "bar", offset, logged_first
        last_counter = max((self.bar_max[b] for b in set(bar_stages.to_list()) if b in self.bar_max), default=None)
        if numbering is not None and numbering.get("last_counter") is not None:
            last_counter = max(last_counter or 0, numbering["last_counter"])
        self.last_counters[stage] = last_counter
        logged_first = n > 1 and base == 0 and first_step(None, 0)
        runtime, per_second = summary.get("train_runtime"), summary.get("train_steps_per_second")
        # The bar's count is counted from the bar's first count, as a whole read counts (not from the offset
        # carried).
        for steps, source in ((None if last_counter is None else last_counter - bar_base, "bar count"),
                              (round(runtime * per_second) if runtime and per_second else None, "end-of-training dict")):
            if steps is None or not n:
                continue
            interval = steps // (n - 1) if logged_first else 0
            first = interval > 1
            interval = interval if first else steps // n
            if interval >= 1:
                return interval, source, offset_for(interval) if source == "bar count" else 0, first
        return 1, "order", 0, False

    def _first_step(self, train: pl.DataFrame, interval: int | None, total: int | None, summary: dict,
                    flag: bool | None) -> bool:
        """Whether a stage that starts at step 0 logged its first step as well as every L-th
        (`logging_first_step`: transformers' DefaultFlowCallback logs at global_step == 1 when it is
        set, besides global_step % logging_steps == 0). As printed (`logging_first_step=True`);
        else as the bar's counters drawn before the dicts read (1, L, 2L, ... or L, 2L, ...); else, for a run that reached its end (an end-of-training dict) with L and its steps T known
        (the bar's total, else train_runtime × train_steps_per_second), n dicts = ⌊T / L⌋ + 1; else the epochs of the dicts, which grow with the step
        (epoch = step / steps per epoch, printed to two decimals): with e(k) the k-th dict's epoch
        and Δ = (e(n) - e(2)) / (n - 2), every L-th step alone gives e(2) = 2Δ, the first step
        and then every L-th e(2) = Δ. Told apart only when Δ is large beside the rounding;
        otherwise, not logged."""
        if flag is not None:
            return flag
        counters = train.get_column("counter")
        for logged_first in (True, False):
            found = _bar_interval(counters, 0, 0, logged_first)
            if found is not None and found == (interval or found):
                return logged_first
        n = train.height
        runtime, per_second = summary.get("train_runtime"), summary.get("train_steps_per_second")
        if not total and runtime and per_second:
            total = round(runtime * per_second)
        if interval and interval > 1 and total and runtime is not None:
            if n == total // interval + 1:
                return True
            if n == total // interval:
                return False
        epochs = train.get_column("epoch_value")
        if n < 3 or epochs.null_count() or not (epochs.diff().drop_nulls() > 0).all():
            return False
        spacing = (epochs[-1] - epochs[1]) / (n - 2)
        error = EPOCH_ROUNDING * (1 + 2 / (n - 2))
        if spacing < 4 * error:
            return False
        return abs(epochs[1] / spacing - 1) < 0.25

    @staticmethod
    def _interval_note(interval: int, source: str, offset: int, dicts: int, first_step: bool = False) -> str:
        where = {"printed": f"logging_steps={interval} as printed",
                 "bar": f"every {interval} step(s), as the progress bar counts them",
                 "bar count": f"logging_steps={interval} inferred from the progress bar's last count over {dicts} dict(s)",
                 "end-of-training dict": f"logging_steps={interval} inferred from the end-of-training dict's steps "
                                         f"over {dicts} dict(s)",
                 "order": "no logging interval known: steps are the dicts' order (flag step_estimated)"}[source]
        start = f", after step {offset} (the bar's first count)" if offset else ""
        first = ", and step 1 first (logging_first_step)" if first_step else ""
        return f"TRL dicts numbered k × logging_steps: {where}{start}{first}"

    def _with_tokens_before(self, tokens: pl.DataFrame) -> pl.DataFrame:
        """The cumulative token counts (group, step, key, value, line_no) with, in an appended read,
        the last count read before in the stage it ended in (line 0); and what the next read needs of
        the last stage's counts. A stage whose only count was read before cannot go on: its per-step
        count depends on the next one."""
        before = (self.before or {}).get("tokens")
        stage = self.state["stage"]
        if before is not None:
            same_stage = tokens.filter(pl.col("group") == before["stage"])
            if before["count"] == 1 and same_stage.height:
                self.cannot_follow = True
            seed = pl.DataFrame({"group": [before["stage"]], "step": [before["step"]], "key": [trl.CUMULATIVE_TOKENS],
                                 "value": [before["value"]], "line_no": [0]}, schema=tokens.schema)
            tokens = pl.concat([seed, tokens])
        last = tokens.filter(pl.col("group") == stage).sort("step")
        earlier = before["count"] - 1 if before is not None and before["stage"] == stage else 0
        self.state["tokens"] = ({"stage": stage, "step": last["step"][-1], "value": last["value"][-1],
                                 "count": earlier + last.height} if last.height else None)
        return tokens

    def zero_steps(self, ctx: FileContext, lines: pl.DataFrame) -> None:
        ctx.note("zero steps: no Trainer metrics dict in the log")

    def record_meta(self, ctx: FileContext, lines: pl.DataFrame, metrics: pl.DataFrame) -> None:
        """framework trl and the versions printed; the bar's total (`trl_max_steps`), the last step
        and whether the log stops before its end; the end-of-training dict; the SFT stage."""
        meta: dict = {"framework": "trl", **self.meta}
        text = lines.filter(pl.col("c").str.contains(r"(?i)trl|unsloth|transformers")).get_column("c")
        for field, pattern in VERSION_PATTERNS.items():
            found = text.str.extract(pattern, 1).drop_nulls()
            meta[field] = found[0] if found.len() else None
        keys = set(metrics.get_column("key").unique().to_list()) if metrics.height else set()
        # The total train batch size printed before the first dict kept: an RL step's completions.
        first_kept = self.dicts.get_column("line_no")[0] if self.dicts.height else None
        totals = lines.filter(pl.col("line_no") < first_kept) if first_kept is not None else lines.clear()
        found = totals.get_column("c").str.extract(TOTAL_BATCH, 1).drop_nulls()
        if found.len():
            meta["trl_total_batch_size"] = int(found[-1].replace(",", ""))
        ctx.format_version = ("<=0.14" if "completion_length" in keys
                              else ">=0.15" if any(k.startswith("completions/") for k in keys) else None)
        dicts = self.dicts.filter(~pl.col("eval")) if self.dicts.height else self.dicts
        summary = self.summary
        meta["trl_train_summary"] = summary or None  # none, once a later stage follows the last one read
        first_offset = self.intervals.get(dicts.get_column("stage")[0], (1, "", 0, False))[2] if dicts.height else None
        if dicts.height and first_offset == 0 and ctx.stored and not self.before:
            # The first logged step is `logging_steps`, not 1, in a run that started at step 0:
            # the pipeline's `resumed` flag (first step above 1) does not apply.
            ctx.rows -= len(ctx.con.execute(
                "DELETE FROM step_flags WHERE file_id = ? AND flag = 'resumed' RETURNING flag", [ctx.file_id]).fetchall())
        if dicts.height:
            last = dicts.row(-1, named=True)
            interval, source, _, first_step = self.intervals.get(last["stage"], (None, None, 0, False))
            meta["trl_logging_steps"] = interval
            meta["trl_logging_steps_source"] = source
            meta["trl_logging_first_step"] = first_step
            meta["trl_last_step"] = last["step"]
            if last["total"] is not None:
                meta["trl_max_steps"] = last["total"]
                if summary is None and last["step"] < last["total"]:
                    ctx.note(f"log stops at step {last['step']} of {last['total']}: no end-of-training dict")
        # The fatal error after the last dict (`ingest.crashes`); no error after it is False, and lines
        # without a dict cannot tell (None keeps what an earlier read of a growing log saw).
        dict_lines = lines.filter(pl.col("kind").is_in(["metric", "dirty"])).get_column("line_no")
        after = lines.filter(pl.col("line_no") > dict_lines.max()) if dict_lines.len() else lines
        crash = run_metadata.crash_after_last_step(after.get_column("c").to_list())
        if crash is not None or dict_lines.len():
            meta["crash"] = crash if crash is not None else False
        ctx.run_meta.update(meta)


def _bar_points(lines: pl.DataFrame, before: dict | None = None) -> tuple[pl.DataFrame, dict, bool, pl.DataFrame]:
    """(per line: the training bar last drawn at or before it (counter, total, elapsed seconds),
    `bar_stage` (a count of bars started so far: a counter lower than the one before starts a
    new bar) and `bar_from_zero` (the stage's bar was drawn at 0, so its elapsed time starts
    with the stage); what a read of the lines after these needs; whether these lines make a bar
    drawn before them a training bar, which an appended read cannot follow; every count drawn of
    a training bar: bar_stage, counter, elapsed when first drawn).

    Other bars without a description (the evaluation loop's) are left out: only bars whose total
    is the one drawn last before some training dict count. `before` is what the read of the
    lines before these left (an appended read).
    """
    every = lines.select("line_no", matches=pl.col("raw").str.extract_all(TRAINING_BAR))
    # Every bar drawn, in line order (each match ends as TRAINING_BAR does: `BAR_END` reads its groups).
    every_draw = (every.filter(pl.col("matches").list.len() > 0).explode("matches")
                  .with_columns(groups=pl.col("matches").str.extract_groups(BAR_END)).unnest("groups")
                  .select("line_no", counter=pl.col("1").cast(pl.Int64), total=pl.col("2").cast(pl.Int64),
                          elapsed=_elapsed_seconds()))
    line = pl.col("line_no")
    points = lines.select("line_no", "c").join(
        every_draw.filter(line.is_last_distinct()), on="line_no", how="left", maintain_order="left").join(
        every_draw.filter(line.is_first_distinct()).select("line_no", first_counter="counter"), on="line_no",
        how="left", maintain_order="left")
    last_bar = before["bar"] if before else None
    seen = points.with_columns(seen_total=pl.col("total").forward_fill())
    if before and before["last_total"] is not None:
        seen = seen.with_columns(pl.col("seen_total").fill_null(before["last_total"]))
    found = set(seen.filter(pl.col("c").str.starts_with("{'") & ~pl.col("c").str.starts_with("{'eval_")
                            ).get_column("seen_total").drop_nulls().unique().to_list())
    known = set(before["training_totals"]) if before else set()
    drawn_before = set(before["totals_drawn"]) if before else set()
    retroactive = bool((found - known) & drawn_before)
    training_totals = sorted(found | known)
    drawn = points.filter(pl.col("total").is_in(training_totals))
    drawn = drawn.with_columns(
        new_bar=((pl.col("first_counter") < pl.col("counter").shift(1, fill_value=last_bar and last_bar["counter"]))
                 | (pl.col("first_counter") == 0)).fill_null(True),
    ).with_columns(bar_stage=pl.col("new_bar").cast(pl.Int64).cum_sum() + (last_bar["bar_stage"] if last_bar else 0))
    from_zero = (pl.col("first_counter") == 0).any().over("bar_stage")
    if last_bar and last_bar["bar_from_zero"]:  # the bar the last read ended in goes on
        from_zero = from_zero | (pl.col("bar_stage") == last_bar["bar_stage"])
    drawn = drawn.with_columns(bar_from_zero=from_zero)
    columns = ("counter", "total", "elapsed", "bar_stage", "bar_from_zero")
    per_line = (points.select("line_no").join(drawn.drop("c", "first_counter", "new_bar"), on="line_no", how="left")
                .sort("line_no").with_columns(pl.exclude("line_no").forward_fill()))
    if last_bar:
        per_line = per_line.with_columns(pl.col(name).fill_null(last_bar[name]) for name in columns)
    state = {"bar": drawn.select(columns).row(-1, named=True) if drawn.height else last_bar,
             "training_totals": training_totals,
             "totals_drawn": sorted(drawn_before | set(points.get_column("total").drop_nulls().to_list())),
             "last_total": seen.get_column("seen_total")[-1] if seen.height else (before or {}).get("last_total")}
    draws = (every_draw.join(drawn.select("line_no", "bar_stage", line_total="total"), on="line_no")
             .filter(pl.col("total") == pl.col("line_total"))
             .unique(["bar_stage", "counter"], keep="first", maintain_order=True)
             .select("bar_stage", "counter", "elapsed"))
    return per_line, state, retroactive, draws


def _elapsed_seconds() -> pl.Expr:
    """The elapsed time of a bar's `[HH:MM:SS<` or `[MM:SS<` (groups 3 to 5 of TRAINING_BAR), in seconds."""
    return (pl.col("3").cast(pl.Float64).fill_null(0.0) * 3600 + pl.col("4").cast(pl.Float64) * 60
            + pl.col("5").cast(pl.Float64))


def _simple_pairs(rows: pl.DataFrame) -> pl.DataFrame:
    """The pairs of dicts in the plain form (`SIMPLE_DICT`), in bulk: a quoted value is unquoted
    and read as a number when it is one (as `trl.scalar` does), True and False are 1 and 0, None
    is missing, and any other text is kept as text.

    In that form neither a key nor a value holds `, '` (a key holds no quote, a quoted value no
    space), so the text between `{'` and `}` splits into its pairs at each `, '`, and a pair into
    key and value at its first `': `."""
    text = pl.col("c").str.strip_chars_end()
    # One lazy query: polars drops each helper column as soon as the next is computed from it.
    pairs = rows.lazy().select("line_no", pair=text.str.slice(2, text.str.len_chars() - 3).str.split(", '")).with_columns(
        pair_index=pl.int_ranges(1, pl.col("pair").list.len() + 1, dtype=pl.Int64)).explode("pair", "pair_index")
    # The key ends at the pair's first `': ` (a key holds no quote); a pair without one is all key.
    at = pl.col("pair").str.find("': ", literal=True)
    pairs = pairs.filter(pl.col("pair").is_not_null()).with_columns(
        key=pl.when(at.is_null()).then(pl.col("pair")).otherwise(pl.col("pair").str.slice(0, at)),
        text=pl.col("pair").str.slice(at + 3))
    quoted = pl.col("text").str.starts_with("'")
    pairs = pairs.with_columns(
        unquoted=pl.when(quoted).then(pl.col("text").str.slice(1, pl.col("text").str.len_chars() - 2))
        .otherwise(pl.col("text")))
    value = (pl.when(pl.col("text") == "True").then(1.0).when(pl.col("text") == "False").then(0.0)
             .otherwise(pl.col("unquoted").cast(pl.Float64, strict=False)))
    return pairs.with_columns(value=value).select(
        "line_no", "pair_index", "key", "value",
        text_value=pl.when(pl.col("value").is_null() & (pl.col("text") != "None")).then(pl.col("unquoted"))).collect()


def _reject_overflow(ctx: FileContext, pairs: pl.DataFrame, rows: pl.DataFrame) -> pl.DataFrame:
    """`pairs` without the dicts holding a number too large for a double (read as ±inf from text
    that does not say inf): each such line is rejected as out-of-range."""
    suspect = pairs.filter(pl.col("value").is_infinite()).get_column("line_no").unique()
    if not suspect.len():
        return pairs
    bad = []
    for line_no, raw, cleaned in rows.filter(pl.col("line_no").is_in(suspect.implode())).select(
            "line_no", "raw", "c").iter_rows():
        too_large = _too_large_for_double(cleaned, quoted=True)
        if too_large is not None:
            ctx.reject(line_no, f"value {too_large[:40]} is out of range for a double", raw, code=ErrorCode.OUT_OF_RANGE)
            bad.append(line_no)
    return pairs.filter(~pl.col("line_no").is_in(bad))


def _printed_arguments(lines: pl.DataFrame, pattern: str, read) -> list[tuple[int, object]]:
    """(line, read(value)) of each training argument `pattern` finds printed (group 1 its value),
    in line order."""
    found = lines.select("line_no", value=pl.col("c").str.extract(pattern, 1)).drop_nulls()
    return [(line_no, read(value)) for line_no, value in found.iter_rows()]


def _bar_interval(counters: pl.Series, ordinal: int, start: int, logged_first: bool) -> int | None:
    """L when the bar's counters drawn before the training dicts number ordinal + 1, ordinal + 2, ...
    of a stage all read start + (k - F)·L for the k-th dict, F = 1 when the first step is logged
    too (its dict at step 1, the bar's counter 1, in a run that started at 0; then L ≥ 2); else None.
    With c(k) the counter before the k-th dict and k0 the first k checked: L = ⌊(c(k0) - start) / (k0 - F)⌋,
    and every c(k) - start = (k - F)·L (checked over the column at once)."""
    if not counters.len() or counters.null_count() or (logged_first and start != 0):
        return None
    first = int(logged_first)
    k0 = ordinal + 1
    if logged_first and ordinal == 0:
        if counters[0] != 1:
            return None
        counters, k0 = counters.slice(1), 2
    if not counters.len() or counters[0] - start < 1:
        return None
    interval = (counters[0] - start) // (k0 - first)
    if interval < 1 + first:
        return None
    k = pl.int_range(k0, k0 + counters.len(), dtype=pl.Int64, eager=True)
    return interval if bool(((counters.cast(pl.Int64) - start) == (k - first) * interval).all()) else None


def _logging_steps(lines: pl.DataFrame) -> list[tuple[int, float]]:
    """(line, value) of each `logging_steps` printed (a value below 1 is a ratio of the total steps)."""
    found = lines.select("line_no", value=pl.col("c").str.extract(LOGGING_STEPS, 1).cast(pl.Float64, strict=False))
    return [(line_no, value) for line_no, value in found.drop_nulls().iter_rows() if value > 0]
