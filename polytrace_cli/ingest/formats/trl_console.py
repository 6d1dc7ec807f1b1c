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
  is not flagged `resumed` for it.
- A log that stops mid-run (no end-of-training dict, bar below its total) keeps every step it
  has and says where it stops.
- `eval_*` keys are stored as `eval/*` (validation), at the step of the training dict before.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from polytrace_cli.lazy import polars as pl

from polytrace_cli.ingest import trl
from polytrace_cli.ingest.base import FileContext, Ingester
from polytrace_cli.ingest.console import ConsoleGrammar, ParsedMetrics, load_console
from polytrace_cli.ingest.console.pipeline import flag_schema, metric_schema
from polytrace_cli.ingest.formats.openrlhf_console import _literal_payload, _too_large_for_double
from polytrace_cli.ingest.registry import is_binary, register

# A training bar piece: no description before the percentage, then `n/total [elapsed<`.
TRAINING_BAR = r"(?:^|\r)\s*\d+%\|[^|\r\n]*\|\s*(\d+)/(\d+)\s*\[(?:(\d+):)?(\d+):(\d+)<"
LOGGING_STEPS = r"\blogging_steps\s*[=:]\s*(\d+)"
VERSION_PATTERNS = {
    "trl_version": r"(?i)\bTRL(?: version)?\s*[:=]{0,2}\s*v?(\d+\.\d+(?:\.\d+)?(?:\.dev\d+)?)",
    "unsloth_version": r"Unsloth (\d{4}\.\d+\.\d+)",
    "transformers_version": r"Transformers:? v?(\d+\.\d+(?:\.\d+)?)",
}

_SNIFF_DICT = re.compile(rb"\{'[^'\n]{1,80}': [^\n]{0,4000}'epoch': ")
# Text only a TRL job prints before its first dict (vLLM and model loading can fill the first 64 KB):
# Unsloth's banner, TRL's config reprs and trainer names. OpenRLHF's `PPOTrainer` is not one of them.
_SNIFF_BANNER = re.compile(rb"==\(\(====\)\)==\s+Unsloth|\b(?:GRPO|RLOO)(?:Trainer|Config)\b|\btrl==\d")

SFT_RULE = "SFT stage dict"
SUMMARY_RULE = "end-of-training dict (run meta)"
OTHER_DICT_RULE = "printed dict (not a metrics dict)"


@register
class TrlConsoleIngester(Ingester):
    name = "trl-console"
    version = "1"
    framework = "trl"
    description = "TRL / Unsloth console log (Trainer metric dicts under a tqdm bar: GRPO, RLOO, PPO)"

    def sniff(self, path: Path, head: bytes) -> bool:
        if path.suffix in (".json", ".jsonl", ".csv", ".yaml", ".yml", ".py") or is_binary(head):
            return False
        return bool(_SNIFF_DICT.search(head) or _SNIFF_BANNER.search(head))

    def load(self, ctx: FileContext) -> None:
        load_console(ctx, TrlGrammar())


class TrlGrammar(ConsoleGrammar):
    """The Trainer's dict lines, numbered by the training bar (see the module)."""

    anchor = "{'"

    def __init__(self) -> None:
        self.meta: dict = {}
        self.summary: dict | None = None
        self.dicts: list[dict] = []

    def metric_kind(self, cleaned: pl.Expr, raw_chars: pl.Expr) -> pl.Expr:
        starts = cleaned.str.starts_with("{'")
        return (pl.when(starts & cleaned.str.strip_chars_end().str.ends_with("}")).then(pl.lit("metric"))
                .when(starts & cleaned.str.contains("'epoch'|'loss'")).then(pl.lit("dirty")))

    def parse(self, ctx: FileContext, lines: pl.DataFrame) -> ParsedMetrics:
        """Pairs of the RL stage's dicts (or of every dict when the log has no RL stage), the
        derived `num_tokens/per_step` and `tqdm/step_s`, and the flags of estimated steps."""
        bars = _bar_points(lines)
        dicts = self._read_dicts(ctx, lines.filter(pl.col("kind").is_in(["metric", "dirty"])), bars)
        self._stage_kinds(dicts)
        has_rl = any(d["rl_stage"] for d in dicts)
        logging_steps = _logging_steps(lines)
        self.meta = {"logging_steps": logging_steps}
        sft = [d for d in dicts if has_rl and not d["rl_stage"]]
        if sft:
            ctx.ignore(SFT_RULE, len(sft))
            last_loss = next((d["values"]["loss"] for d in reversed(sft) if "loss" in d["values"]), None)
            self.meta["trl_sft_stage"] = {"dicts": len(sft), "last_loss": trl.scalar(last_loss)[0]}
            ctx.note(f"{len(sft)} SFT dict(s) before the RL stage kept apart (ignore rule '{SFT_RULE}')")
        kept = [d for d in dicts if not has_rl or d["rl_stage"]]
        return self._number(ctx, kept, logging_steps)

    def _read_dicts(self, ctx: FileContext, metric_lines: pl.DataFrame, bars: pl.DataFrame) -> list[dict]:
        """One entry per metrics dict, in line order, with its bar point; summary and other dicts
        are counted here and left out."""
        rows = metric_lines.join(bars, on="line_no", how="left").sort("line_no")
        dicts: list[dict] = []
        for line_no, raw, cleaned, counter, total, elapsed, stage, from_zero in rows.select(
                "line_no", "raw", "c", "counter", "total", "elapsed", "bar_stage", "bar_from_zero").iter_rows():
            try:
                payload = _literal_payload(cleaned.strip())
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as error:
                ctx.reject(line_no, f"metrics dict is not a Python dict literal: {type(error).__name__}", raw,
                           code="unparsable-line")
                continue
            if not isinstance(payload, dict):
                ctx.reject(line_no, f"payload is a {type(payload).__name__}, not a dict", raw, code="unparsable-line")
                continue
            keys = [str(key) for key in payload]
            if trl.is_summary_dict(keys):
                ctx.ignore(SUMMARY_RULE)
                dicts.append({"summary": True, "line_no": line_no,
                              "values": {key: trl.scalar(value)[0] for key, value in payload.items()}})
                continue
            if "epoch" not in payload and not trl.is_rl_dict(keys):
                ctx.ignore(OTHER_DICT_RULE)
                continue
            infinite = any(type(value) is float and math.isinf(value) for value in payload.values())
            too_large = _too_large_for_double(cleaned) if infinite else None
            if too_large is not None:
                ctx.reject(line_no, f"value {too_large[:40]} is out of range for a double", raw, code="out-of-range")
                continue
            dicts.append({"summary": False, "line_no": line_no, "values": payload, "counter": counter,
                          "total": total, "elapsed": elapsed, "bar_stage": stage,
                          "bar_from_zero": bool(from_zero),
                          "eval": trl.is_eval_dict(keys)})
        return dicts

    def _stage_kinds(self, dicts: list[dict]) -> None:
        """Cut the dicts into stages (a new bar, or the dict after an end-of-training dict, starts
        one), mark each `rl_stage`, and take out the end-of-training dicts: the last kept stage's
        becomes `self.summary`."""
        stage, last_bar_stage, current = 0, None, []
        stages: list[list[dict]] = [current]
        summaries: dict[int, dict] = {}
        for entry in dicts:
            if entry["summary"]:
                summaries[stage] = entry["values"]
                stage += 1
                current = []
                stages.append(current)
                continue
            if entry["bar_stage"] is not None and last_bar_stage is not None and entry["bar_stage"] != last_bar_stage:
                if current:
                    stage += 1
                    current = []
                    stages.append(current)
            last_bar_stage = entry["bar_stage"] if entry["bar_stage"] is not None else last_bar_stage
            entry["stage"] = stage
            current.append(entry)
        for members in stages:
            rl = any(trl.is_rl_dict(map(str, m["values"])) for m in members)
            for member in members:
                member["rl_stage"] = rl
        dicts[:] = [d for d in dicts if not d["summary"]]
        has_rl = any(d["rl_stage"] for d in dicts)
        kept = [d["stage"] for d in dicts if d["rl_stage"] or not has_rl]
        self.summary = summaries.get(kept[-1]) if kept else None

    def _number(self, ctx: FileContext, dicts: list[dict], logging_steps: int | None) -> ParsedMetrics:
        """Steps, pairs and flags of the kept dicts (see the module for the rules), built column by
        column: most values are floats and pass through untouched."""
        columns: dict[str, list] = {"line_no": [], "step": [], "pair_index": [], "key": [], "raw": []}
        flags: list[tuple] = []
        ordinal: dict[int, int] = {}
        previous: dict[int, tuple[int, float | None]] = {}
        last_train_step: dict[int, int] = {}
        sources: set[str] = set()
        for entry in dicts:
            stage, line_no = entry["stage"], entry["line_no"]
            if entry["eval"] and stage in last_train_step:
                step = last_train_step[stage]
            elif entry["counter"] is not None:
                step = entry["counter"]
                sources.add("bar")
            else:
                ordinal[stage] = ordinal.get(stage, 0) + 1
                step = ordinal[stage] * (logging_steps or 1)
                sources.add("logging_steps" if logging_steps else "order")
                detail = (f"no step printed: dict {ordinal[stage]} × logging_steps={logging_steps}" if logging_steps
                          else f"no step printed and no logging_steps: dict number {ordinal[stage]}")
                flags.append((line_no, step, "step_estimated", detail))
            entry["step"] = step
            keys = ([trl.store_key(str(key), True) for key in entry["values"]] if entry["eval"]
                    else [key if type(key) is str and not key.startswith("eval_") else trl.store_key(str(key))
                          for key in entry["values"]])
            values = list(entry["values"].values())
            if not entry["eval"]:
                last_train_step[stage] = step
                if trl.STEP_TIME not in entry["values"] and entry["elapsed"] is not None:
                    before = previous.get(stage, (0, 0.0) if entry["bar_from_zero"] else None)
                    if before is not None and before[1] is not None and step > before[0]:
                        keys.append("tqdm/step_s")
                        values.append((entry["elapsed"] - before[1]) / (step - before[0]))
                        flags.append((line_no, step, "tqdm_estimate",
                                      f"step time from the progress bar's elapsed time, mean over {step - before[0]} step(s)"))
                previous[stage] = (step, entry["elapsed"])
            columns["line_no"].extend([line_no] * len(keys))
            columns["step"].extend([step] * len(keys))
            columns["pair_index"].extend(range(1, len(keys) + 1))
            columns["key"].extend(keys)
            columns["raw"].extend(values)
        raw = columns.pop("raw")
        metrics = pl.DataFrame({
            **columns,
            "value": [value if type(value) is float else trl.scalar(value)[0] for value in raw],
            "text_value": [None if type(value) is float else trl.scalar(value)[1] for value in raw],
            "raw_value": [None] * len(raw),
        }, schema=metric_schema())
        tokens = metrics.filter(pl.col("key") == trl.CUMULATIVE_TOKENS, pl.col("value").is_not_null()).join(
            pl.DataFrame([(d["line_no"], d["stage"]) for d in dicts if not d["eval"]],
                         schema={"line_no": pl.Int64, "group": pl.Int64}, orient="row"), on="line_no")
        derived = trl.tokens_per_step(tokens).select(
            "line_no", "step", pair_index=pl.lit(1000, pl.Int64), key="key", value="value",
            text_value=pl.lit(None, pl.String), raw_value=pl.lit(None, pl.String))
        metrics = pl.concat([metrics, derived]).sort("line_no", "pair_index")
        flag_frame = pl.DataFrame(flags, schema=flag_schema(), orient="row")
        printed = pl.concat([metrics.select("line_no", "step"), flag_frame.select("line_no", "step")]).unique(
            "line_no", keep="first", maintain_order=True).select("line_no", printed=pl.col("step").cast(pl.String))
        if "order" in sources:
            ctx.note("no progress bar and no logging_steps printed: steps are the dicts' order (flag step_estimated)")
        elif "logging_steps" in sources:
            ctx.note(f"no progress bar: steps from logging_steps={logging_steps} (flag step_estimated)")
        self.dicts = dicts
        return ParsedMetrics(metrics, flag_frame, printed.sort("line_no"))

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
        ctx.format_version = ("<=0.14" if "completion_length" in keys
                              else ">=0.15" if any(k.startswith("completions/") for k in keys) else None)
        dicts = [d for d in self.dicts if not d["eval"]]
        summary = self.summary
        if summary:
            meta["trl_train_summary"] = summary
        if dicts and (dicts[0]["bar_from_zero"] or dicts[0]["counter"] is None) and ctx.stored:
            # The first logged step is `logging_steps`, not 1, in a run that started at step 0:
            # the pipeline's `resumed` flag (first step above 1) does not apply.
            ctx.rows -= len(ctx.con.execute(
                "DELETE FROM step_flags WHERE file_id = ? AND flag = 'resumed' RETURNING flag", [ctx.file_id]).fetchall())
        if dicts:
            last = dicts[-1]
            meta["trl_last_step"] = last["step"]
            if last["total"] is not None:
                meta["trl_max_steps"] = last["total"]
                if summary is None and last["step"] < last["total"]:
                    ctx.note(f"log stops at step {last['step']} of {last['total']}: no end-of-training dict")
        ctx.run_meta.update(meta)


def _bar_points(lines: pl.DataFrame) -> pl.DataFrame:
    """Per line: the training bar last drawn at or before it (counter, total, elapsed seconds),
    `bar_stage` (a count of bars started so far: a counter lower than the one before starts a
    new bar) and `bar_from_zero` (the stage's bar was drawn at 0, so its elapsed time starts
    with the stage).

    Other bars without a description (the evaluation loop's) are left out: only bars whose total
    is the one drawn last before some training dict count.
    """
    matches = pl.col("raw").str.extract_all(TRAINING_BAR)
    points = lines.select(
        "line_no", "c",
        counter=matches.list.last().str.extract(TRAINING_BAR, 1).cast(pl.Int64),
        total=matches.list.last().str.extract(TRAINING_BAR, 2).cast(pl.Int64),
        elapsed=(matches.list.last().str.extract(TRAINING_BAR, 3).cast(pl.Float64).fill_null(0.0) * 3600
                 + matches.list.last().str.extract(TRAINING_BAR, 4).cast(pl.Float64) * 60
                 + matches.list.last().str.extract(TRAINING_BAR, 5).cast(pl.Float64)),
        first_counter=matches.list.first().str.extract(TRAINING_BAR, 1).cast(pl.Int64),
    )
    seen = points.with_columns(seen_total=pl.col("total").forward_fill())
    training_totals = seen.filter(pl.col("c").str.starts_with("{'") & ~pl.col("c").str.starts_with("{'eval_")
                                  ).get_column("seen_total").drop_nulls().unique().implode()
    drawn = points.filter(pl.col("total").is_in(training_totals))
    drawn = drawn.with_columns(
        new_bar=((pl.col("first_counter") < pl.col("counter").shift(1)) | (pl.col("first_counter") == 0))
        .fill_null(True),
    ).with_columns(bar_stage=pl.col("new_bar").cast(pl.Int64).cum_sum())
    drawn = drawn.with_columns(bar_from_zero=(pl.col("first_counter") == 0).any().over("bar_stage"))
    return (points.select("line_no").join(drawn.drop("c", "first_counter", "new_bar"), on="line_no", how="left")
            .sort("line_no").with_columns(pl.exclude("line_no").forward_fill()))


def _logging_steps(lines: pl.DataFrame) -> int | None:
    found = lines.get_column("c").str.extract(LOGGING_STEPS, 1).drop_nulls()
    return int(found[0]) if found.len() else None
