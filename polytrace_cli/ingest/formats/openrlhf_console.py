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

A step that goes backwards (a restarted job appending to the same log) starts a new segment.
Every other line is counted under a named ignore rule; a metric line whose payload cannot be read
is rejected with the reason.
"""

from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path

from polytrace_cli.lazy import polars as pl

from polytrace_cli.ingest import run_metadata
from polytrace_cli.ingest.arrow import ArrowStream
from polytrace_cli.ingest.base import FileContext, Ingester
from polytrace_cli.ingest.registry import register

ANSI = r"\x1b\[[0-9;?]*[A-Za-z]"
GLOBAL_STEP = r"(?:✨\s*)?Global step (\d+):\s*(\{.*)"
EVALUATION = r"Evaluation completed in ([0-9:.]+),\s*global_step (\d+),\s*eval_metrics:\s*(\{.*)"
REPEATED_SUFFIX = r"\s*\[repeated \d+x across cluster\]\s*$"
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


def read_lines(path: Path) -> pl.DataFrame:
    """The file as a frame of (line_no, raw, clean): ANSI codes, `\\r` redraws and Ray's repeat
    suffix removed from `clean` (the text after the last carriage return is kept)."""
    text = path.read_bytes().decode("utf-8", errors="replace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    frame = pl.DataFrame({"raw": lines}, schema={"raw": pl.String}).with_row_index("line_no", offset=1)
    return frame.with_columns(
        clean=pl.col("raw").str.replace_all(ANSI, "").str.replace_all(r"\r+$", "")
        .str.replace(r"^.*\r", "").str.replace(REPEATED_SUFFIX, "")
    )


@register
class OpenRLHFConsoleIngester(Ingester):
    name = "openrlhf-console"
    version = "1"
    framework = "openrlhf"
    description = "OpenRLHF console log (✨ Global step N: {...}, evaluation lines, tqdm postfixes)"

    def sniff(self, path: Path, head: bytes) -> bool:
        if path.suffix in (".json", ".jsonl", ".csv", ".yaml", ".yml", ".py"):
            return False
        if "✨ Global step".encode() in head or b"Evaluation completed in" in head:
            return True
        # Older logs: only tqdm postfixes with OpenRLHF's short keys.
        return b"openrlhf" in head.lower() and bool(_SNIFF_TQDM.search(head))

    def load(self, ctx: FileContext) -> None:
        frame = read_lines(ctx.path)
        ctx.lines = frame.height
        metric_lines = frame.filter(pl.col("clean").str.contains("Global step|Evaluation completed")).with_columns(
            g_step=pl.col("clean").str.extract(GLOBAL_STEP, 1),
            g_payload=pl.col("clean").str.extract(GLOBAL_STEP, 2),
            e_time=pl.col("clean").str.extract(EVALUATION, 1),
            e_step=pl.col("clean").str.extract(EVALUATION, 2),
            e_payload=pl.col("clean").str.extract(EVALUATION, 3),
        )
        metric_lines = metric_lines.filter(pl.col("g_step").is_not_null() | pl.col("e_step").is_not_null())
        records: list[tuple[int, int, str, float | None, str | None]] = []
        parsed_lines: list[tuple[int, int]] = []
        for line_no, raw, g_step, g_payload, e_time, e_step, e_payload in metric_lines.select(
            "line_no", "raw", "g_step", "g_payload", "e_time", "e_step", "e_payload"
        ).iter_rows():
            is_eval = g_step is None
            payload = e_payload if is_eval else g_payload
            step = int(e_step if is_eval else g_step)
            try:
                value = _literal_payload(payload)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as error:
                kind = "evaluation" if is_eval else "Global step"
                ctx.reject(line_no, f"{kind} payload is not a Python dict literal: {type(error).__name__}", raw)
                continue
            if not isinstance(value, dict):
                ctx.reject(line_no, f"payload is a {type(value).__name__}, not a dict", raw)
                continue
            rows = _flatten("eval/" if is_eval else "", value)
            if is_eval:
                rows = [(k if not k.startswith("eval/eval/") else k[5:], v, t) for k, v, t in rows]
                rows.append(("eval/duration_s", _duration_seconds(e_time), None))
            records.extend((line_no, step, key, val, text) for key, val, text in rows)
            parsed_lines.append((line_no, step))
        self._count_ignored(ctx, frame.join(metric_lines.select("line_no"), on="line_no", how="anti"))
        if parsed_lines:
            ctx.format_version = "0.9" if any(k.startswith("timing/") for _, _, k, _, _ in records) else "0.8"
            self._store(ctx, records, parsed_lines, flag=None)
            ctx.stored = len(parsed_lines)
        else:
            self._tqdm_fallback(ctx, frame)
        if not ctx.stored:
            ctx.note("zero steps: no Global step, evaluation or tqdm metric lines")
        settings_lines = frame.filter(pl.col("clean").str.contains(run_metadata.OPENRLHF_SETTINGS_LINE))
        version = {"0.9": ">=0.9", "0.8": "0.8"}.get(ctx.format_version or "", "<0.8" if ctx.stored else None)
        ctx.run_meta.update({"framework": "openrlhf", "openrlhf_version": version, "value_precision": None,
                             **run_metadata.openrlhf_settings(settings_lines.get_column("clean").to_list())})

    @staticmethod
    def _count_ignored(ctx: FileContext, rest: pl.DataFrame) -> None:
        """Count the non-metric lines under their rules (tqdm lines may be reclaimed later)."""
        rule = (
            pl.when(pl.col("clean").str.strip_chars() == "").then(pl.lit("blank line"))
            .when(pl.col("clean").str.contains(TQDM_BAR)).then(pl.lit("tqdm progress bar"))
            .when(pl.col("clean").str.contains(LOG_LINE)).then(pl.lit("log or traceback line"))
            .otherwise(pl.lit("other console output"))
        )
        counts = rest.select(rule.alias("rule")).group_by("rule").len()
        for rule_name, count in counts.iter_rows():
            ctx.ignore(rule_name, count)

    def _tqdm_fallback(self, ctx: FileContext, frame: pl.DataFrame) -> None:
        """Steps from completed tqdm bars whose postfix carries the short metric keys."""
        candidates = frame.filter(pl.col("raw").str.contains(r"[A-Za-z_]+=[-0-9.eE+naif]+"))
        records: list[tuple[int, int, str, float | None, str | None]] = []
        parsed_lines: list[tuple[int, int]] = []
        step = 0
        for line_no, raw in candidates.select("line_no", "raw").iter_rows():
            completed = None
            for segment in re.split(r"[\r\n]", re.sub(ANSI, "", raw)):
                match = TQDM_POSTFIX.search(segment)
                if not match or match.group(1) != match.group(2):
                    continue
                pairs = {k: v for k, v in TQDM_PAIR.findall(match.group(3)) if k in TQDM_KEYS}
                if pairs:
                    completed = pairs
            if completed is None:
                continue
            step += 1
            for short, text in completed.items():
                try:
                    value = float(text)
                except ValueError:
                    value = None
                records.append((line_no, step, TQDM_KEYS[short], value, None if value is not None else text))
            parsed_lines.append((line_no, step))
        if not parsed_lines:
            return
        ctx.format_version = "tqdm"
        # These lines were counted as ignored tqdm lines; they now produce rows.
        ctx.ignored["tqdm progress bar"] -= len(parsed_lines)
        if not ctx.ignored["tqdm progress bar"]:
            del ctx.ignored["tqdm progress bar"]
        self._store(ctx, records, parsed_lines, flag="tqdm_estimate")
        ctx.stored = len(parsed_lines)
        ctx.note(f"{step} step(s) estimated from tqdm postfixes (no Global step lines)")

    @staticmethod
    def _store(ctx: FileContext, records: list, parsed_lines: list[tuple[int, int]], flag: str | None) -> None:
        lines = pl.DataFrame(parsed_lines, schema={"line_no": pl.Int64, "step": pl.Int64}, orient="row")
        lines = lines.sort("line_no").with_columns(
            segment=(pl.col("step") < pl.col("step").shift(1)).fill_null(False).cum_sum().cast(pl.Int32)
        )
        metrics = pl.DataFrame(
            records,
            schema={"line_no": pl.Int64, "step": pl.Int64, "key": pl.String, "value": pl.Float64,
                    "text_value": pl.String},
            orient="row",
            strict=False,
        ).join(lines.select("line_no", "segment"), on="line_no")
        restarts = lines.filter(pl.col("segment") > pl.col("segment").shift(1).fill_null(0))
        con = ctx.con
        con.register("_openrlhf_metrics", ArrowStream(metrics))
        con.register("_openrlhf_restarts", ArrowStream(restarts))
        try:
            ctx.insert(
                "INSERT INTO step_metrics (run_id, segment, step, key, value, text_value, file_id, line_no)"
                " SELECT ?, segment, step, key, value, text_value, ?, line_no FROM _openrlhf_metrics",
                [ctx.run_id, ctx.file_id],
            )
            ctx.insert(
                "INSERT INTO step_flags (run_id, segment, step, flag, detail, file_id, line_no)"
                " SELECT ?, segment, step, 'restart', 'step went backwards: new segment', ?, line_no"
                " FROM _openrlhf_restarts",
                [ctx.run_id, ctx.file_id],
            )
            if flag:
                ctx.insert(
                    "INSERT INTO step_flags (run_id, segment, step, flag, detail, file_id, line_no)"
                    " SELECT DISTINCT ?, segment, step, ?, 'values of the last tqdm update', ?, line_no"
                    " FROM _openrlhf_metrics",
                    [ctx.run_id, flag, ctx.file_id],
                )
        finally:
            con.unregister("_openrlhf_metrics")
            con.unregister("_openrlhf_restarts")
