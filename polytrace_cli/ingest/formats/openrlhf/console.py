"""OpenRLHF console log: the trainer's stdout, with one metrics dict per global step.

Metric lines (OpenRLHF 0.8+), after any logging prefix such as
`(PPOTrainer pid=7) INFO 05-18 12:34:56 ppo_trainer.py:532] `:

    ✨ Global step 3: {'policy_loss': 0.0123, 'reward': 0.41, 'timing/generation': 30.2, ...}
    ✨ Evaluation completed in 0:01:02, global_step 10, eval_metrics: {'pass1': 0.5}

The payload is a Python dict repr, read with `ast.literal_eval` after bare `nan`/`inf` and numpy-2
scalar reprs (`np.float64(0.5)`) are rewritten into literals it accepts. Evaluation keys are stored
under `eval/` (plus `eval/duration_s`, the printed evaluation time).

When a log has no Global step lines (older OpenRLHF), the tqdm postfixes of the training bar are
the fallback: short keys map to the long ones (`act_loss`/`pg` -> `policy_loss`, `rm` -> `reward`,
...), each completed bar (`N/N`) is one step numbered 1, 2, ... in order, and every such step is
flagged `tqdm_estimate`; the values are those of the bar's last update.

Stage timings (0.9+): `timing/generation` is the generation stage (`gen_s`), `timing/ppo_train`
the whole training stage (`update_actor_s`, which includes the critic update when there is one) and
`timing/step_total` the step (`step_s`). `timing/make_experience` contains generation plus reward,
reference and value forward passes, so it is kept under its own key and mapped to no canonical
stage: mapping it would count generation twice. `timing/broadcast` (weight sync) likewise stays
as it is.

The console pipeline (`ingest/console`) reads, cleans (ANSI colours, Ray prefixes, repeat suffixes,
progress-bar redraws) and classifies the lines, cuts segments and stores; this module is
OpenRLHF's grammar in it. A step that goes backwards (a restarted job appending to the same log)
starts a new segment. Every other line is counted under a named ignore rule; a metric line whose
payload cannot be read is rejected with the reason.
"""

from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path

from polytrace_cli.errors import ErrorCode
from polytrace_cli.lazy import polars as pl

from polytrace_cli.ingest import console_lines as cl
from polytrace_cli.ingest import run_metadata
from polytrace_cli.ingest.base import FileContext, Ingester
from polytrace_cli.ingest.console import ConsoleGrammar, NoiseRules, ParsedMetrics, load_console
from polytrace_cli.ingest.console.pipeline import check_steps, resume_lines, store_parsed
from polytrace_cli.ingest.formats.openrlhf import names as openrlhf_names
from polytrace_cli.ingest.registry import register

# The step is taken as printed; the pipeline checks it is a whole number in range (`check_steps`).
STEP_NUMBER = r"(-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
GLOBAL_STEP = rf"(?:✨\s*)?Global step {STEP_NUMBER}:\s*(\{{.*)"
EVALUATION = rf"Evaluation completed in ([0-9:.]+),\s*global_step {STEP_NUMBER},\s*eval_metrics:\s*(\{{.*)"
TQDM_BAR = r"\d+%\||\|\s*\d+/\d+\s*\[|\d+/\d+\s*\[\d+:\d+"
LOG_LINE = r"\b(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL)\b|^\[\d{4}-\d\d-\d\d|^\s*Traceback|^\s*File \""

# Short tqdm postfix keys and the Global-step keys they stand for.
TQDM_KEYS = {
    "act_loss": "policy_loss",
    "pg": "policy_loss",
    "reward": "reward",
    "rm": "reward",
    "return": "return",
    "ret": "return",
    "gen_len": "response_length",
    "glen": "response_length",
    "tot_len": "total_length",
    "tlen": "total_length",
    "kl": "kl",
    "act_lr": "actor_lr",
    "cri_loss": "critic_loss",
    "vals": "values",
    "cri_lr": "critic_lr",
}
TQDM_POSTFIX = re.compile(r"(\d+)/(\d+)\s*\[[^\]]*?,\s*((?:[A-Za-z_]+=[^,\]]*,?\s*)+)\]")
TQDM_PAIR = re.compile(r"([A-Za-z_]+)=([^,\]\s]+)")

_SNIFF_TQDM = re.compile(rb"\b(?:act_loss|pg)=[-0-9.]+.{0,40}\b(?:reward|rm)=")
_NAN = "\x00nan"
_NUMPY_SCALAR = re.compile(r"\bnp\.(?:float|int|uint|bool_?)\d*\(([^()]*)\)")
_BARE_SPECIAL = re.compile(r"(?<=[:,\[(])(\s*)(-?)\b(nan|inf|NaN|Infinity)\b")


def _literal_payload(payload: str) -> object:
    """The dict a payload repr stands for; bare nan/inf and numpy scalar reprs are rewritten first.

    A repr whose only strings are single-quoted without escapes or double quotes is also valid
    JSON once the quotes are swapped, and `json.loads` reads it ten times faster; anything else
    (True/None, tuples, escaped strings) goes to `ast.literal_eval`.
    """
    text = _NUMPY_SCALAR.sub(r"\1", payload) if "np." in payload else payload
    special = "nan" in text or "inf" in text or "NaN" in text or "Infinity" in text
    if '"' not in text and "\\" not in text:
        swapped = text.replace("'", '"')
        try:
            return json.loads(_BARE_SPECIAL.sub(_json_special, swapped) if special else swapped)
        except ValueError:
            pass
    return ast.literal_eval(_BARE_SPECIAL.sub(_python_special, text) if special else text)


def _json_special(match: re.Match) -> str:
    return match.group(1) + ("NaN" if match.group(3).lower() == "nan" else match.group(2) + "Infinity")


def _python_special(match: re.Match) -> str:
    return match.group(1) + (repr(_NAN) if match.group(3).lower() == "nan" else match.group(2) + "1e999")


def _scalar(value) -> tuple[float | None, str | None]:
    """(value, text_value) of one logged item: numbers as doubles, everything else as text."""
    if value == _NAN:
        return math.nan, None
    if isinstance(value, bool):
        return float(value), None
    if isinstance(value, (int, float)):
        return float(value), None
    if value is None:
        return None, None
    if isinstance(value, str):
        return None, value
    return None, json.dumps(value, default=str)


_NUMBER_LITERAL = re.compile(r"(?<![\w.'\"])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?![\w.])")


_QUOTED_NUMBER = re.compile(r"""(?<=['"])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?=['"])""")


def _too_large_for_double(payload: str, quoted: bool = False) -> str | None:
    """The first number written in `payload` that a double cannot hold (`1e400`, a 400-digit
    integer), or None: such a number would otherwise be stored as a false infinity. With `quoted`,
    a string holding only such a number (`'1e400'`, which TRL's string values read as a number) counts too."""
    literals = _NUMBER_LITERAL.findall(payload) + (_QUOTED_NUMBER.findall(payload) if quoted else [])
    for literal in literals:
        if math.isinf(float(literal)):
            return literal
    return None


def _flatten(prefix: str, payload: dict) -> list[tuple[str, float | None, str | None]]:
    rows = []
    for key, value in payload.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            rows.extend(_flatten(name + "/", value))
        else:
            rows.append((name, *_scalar(value)))
    return rows


def _duration_seconds(text: str) -> float | None:
    parts = text.split(":")
    try:
        return sum(float(p) * 60 ** i for i, p in enumerate(reversed(parts)))
    except ValueError:
        return None


@register
class OpenRLHFConsoleIngester(Ingester):
    name = "openrlhf-console"
    version = "2"
    framework = "openrlhf"
    appendable = True
    description = "OpenRLHF console log (✨ Global step N: {...}, evaluation lines, tqdm postfixes)"
    metric_aliases = openrlhf_names.METRIC_ALIASES
    validation_prefixes = openrlhf_names.VALIDATION_PREFIXES

    def sniff(self, path: Path, head: bytes) -> bool:
        if path.suffix in (".json", ".jsonl", ".csv", ".yaml", ".yml", ".py"):
            return False
        if "✨ Global step".encode() in head or b"Evaluation completed in" in head:
            return True
        # Older logs: only tqdm postfixes with OpenRLHF's short keys.
        return b"openrlhf" in head.lower() and bool(_SNIFF_TQDM.search(head))

    def load(self, ctx: FileContext) -> None:
        load_console(ctx, OpenRLHFGrammar())


class OpenRLHFGrammar(ConsoleGrammar):
    """OpenRLHF's metric lines: `Global step N: {dict}` and evaluation lines, read with
    `_literal_payload`; without them, the tqdm postfixes of completed training bars."""

    printed_values_read = 0  # its run meta reads no printed value

    anchor = "✨"
    noise = NoiseRules(
        (("blank line", r"^\s*$"), (cl.CHECKPOINT_LOAD, r"^Loaded the checkpoint:"), ("tqdm progress bar", TQDM_BAR),
         ("log or traceback line", LOG_LINE)),
        default="other console output",
    )
    reclaimable = "tqdm progress bar"

    def metric_kind(self, cleaned: pl.Expr, raw_chars: pl.Expr) -> pl.Expr:
        return pl.when(cleaned.str.contains(GLOBAL_STEP) | cleaned.str.contains(EVALUATION)).then(pl.lit("metric"))

    def parse(self, ctx: FileContext, lines: pl.DataFrame) -> ParsedMetrics:
        """One row per flattened payload item; evaluation keys under `eval/` plus `eval/duration_s`.
        A payload that is not a dict literal is rejected; an empty dict is ignored ('empty metrics dict')."""
        metric_lines = lines.filter(pl.col("kind") == "metric").select(
            "line_no", "raw",
            g_step=pl.col("c").str.extract(GLOBAL_STEP, 1),
            g_payload=pl.col("c").str.extract(GLOBAL_STEP, 2),
            e_time=pl.col("c").str.extract(EVALUATION, 1),
            e_step=pl.col("c").str.extract(EVALUATION, 2),
            e_payload=pl.col("c").str.extract(EVALUATION, 3),
        )
        records: list[tuple] = []
        for line_no, raw, g_step, g_payload, e_time, e_step, e_payload in metric_lines.iter_rows():
            is_eval = g_step is None
            payload = e_payload if is_eval else g_payload
            step = e_step if is_eval else g_step
            try:
                value = _literal_payload(payload)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as error:
                kind = "evaluation" if is_eval else "Global step"
                ctx.reject(line_no, f"{kind} payload is not a Python dict literal: {type(error).__name__}", raw,
                           code=ErrorCode.UNPARSABLE_LINE)
                continue
            if not isinstance(value, dict):
                ctx.reject(line_no, f"payload is a {type(value).__name__}, not a dict", raw, code=ErrorCode.UNPARSABLE_LINE)
                continue
            try:
                rows = _flatten("eval/" if is_eval else "", value)
            except OverflowError:
                rows = None
            too_large = _too_large_for_double(payload) if rows is None or any(
                isinstance(row[1], float) and math.isinf(row[1]) for row in rows) else None
            if rows is None or too_large is not None:
                ctx.reject(line_no, f"value {(too_large or 'an integer')[:40]} is out of range for a double", raw,
                           code=ErrorCode.OUT_OF_RANGE)
                continue
            if is_eval:
                rows = [(k if not k.startswith("eval/eval/") else k[5:], v, t) for k, v, t in rows]
                rows.append(("eval/duration_s", _duration_seconds(e_time), None))
            if not rows:
                ctx.ignore("empty metrics dict")
            records.extend((line_no, step, index, key, val, text, None)
                           for index, (key, val, text) in enumerate(rows, start=1))
        if records:  # a log read in blocks is 0.9 when any block holds a timing key
            timed = ctx.format_version == "0.9" or any(record[3].startswith("timing/") for record in records)
            ctx.format_version = "0.9" if timed else "0.8"
        return ParsedMetrics.from_rows(records)

    def fallback(self, ctx: FileContext, lines: pl.DataFrame) -> int:
        """Steps from completed tqdm bars whose postfix carries the short metric keys."""
        candidates = lines.filter(pl.col("raw").str.contains(r"[A-Za-z_]+=[-0-9.eE+naif]+"))
        records: list[tuple] = []
        flags: list[tuple] = []
        step = 0
        for line_no, raw in candidates.select("line_no", "raw").iter_rows():
            completed = None
            for segment in re.split(r"[\r\n]", re.sub(cl.ANSI_PATTERN, "", raw)):
                match = TQDM_POSTFIX.search(segment)
                if not match or match.group(1) != match.group(2):
                    continue
                pairs = {k: v for k, v in TQDM_PAIR.findall(match.group(3)) if k in TQDM_KEYS}
                if pairs:
                    completed = pairs
            if completed is None:
                continue
            step += 1
            for index, (short, text) in enumerate(completed.items(), start=1):
                try:
                    value = float(text)
                except ValueError:
                    value = None
                records.append((line_no, step, index, TQDM_KEYS[short], value, None if value is not None else text, text))
            flags.append((line_no, step, "tqdm_estimate", "values of the last tqdm update"))
        if not step:
            return 0
        ctx.format_version = "tqdm"
        parsed = check_steps(ctx, ParsedMetrics.from_rows(records, flags), lines)
        stored = store_parsed(ctx, parsed, resume_lines(lines))
        ctx.note(f"{step} step(s) estimated from tqdm postfixes (no Global step lines)")
        return stored

    def zero_steps(self, ctx: FileContext, lines: pl.DataFrame) -> None:
        ctx.note("zero steps: no Global step, evaluation or tqdm metric lines")

    def record_meta(self, ctx: FileContext, lines: pl.DataFrame, metrics: pl.DataFrame) -> None:
        settings_lines = lines.filter(pl.col("c").str.contains(run_metadata.OPENRLHF_SETTINGS_LINE))
        version = {"0.9": ">=0.9", "0.8": "0.8"}.get(ctx.format_version or "", "<0.8" if ctx.stored else None)
        ctx.run_meta.update({"framework": "openrlhf", "openrlhf_version": version, "value_precision": None,
                             **run_metadata.openrlhf_settings(settings_lines.get_column("c").to_list())})
