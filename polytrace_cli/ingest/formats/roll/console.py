"""ROLL's console log: the RLVR pipeline's stdout, one JSON dict of the step's metrics per logging step.

`roll/pipeline/rlvr/rlvr_pipeline.py` logs, through ROLL's logger (`[%(asctime)s] [%(filename)s
(%(lineno)d)] [%(levelname)s] [%(WORKER_NAME)s %(RANK)s / %(WORLD_SIZE)s][PID n] %(message)s`,
`roll/utils/logging.py`):

    ... pipeline step 3 start...
    ... [{"prompt": ..., "response": ...}, ...]           ten generation examples: ignored
    ... {"time/step_total": 80.2, "time/step_generate": 41.0, ..., "token/response_length/mean": 612.5}
    ... pipeline step 3 finished

every `logging_steps` steps. A dict's step is the `pipeline step N start...` line before it (N counts
from 0). With the `stdout` tracker (`roll/utils/tracking.py` `StdoutTracker`) each step is also
logged as `metrics_tag: {"step": N, "metrics": {...}}`: when a log holds such lines, they are the
steps, and the pipeline's own dicts (the same metrics) are ignored under `metrics dict also in
metrics_tag`. Keys lose their reducer tag (`actor/pg_loss@sum` -> `actor/pg_loss`), as ROLL's trackers
drop it. `time/step_total` logged at step N is the total of step N-1 (`pre_step_total_time`): it is
stored as logged and also, as `time/step_total/own`, at the step before (the step it measured) when
that step was logged too. A step lower than or equal to the one before starts a new segment (a
restarted job appending to the log), flagged `restart`. A dict line that is not valid JSON is rejected;
every other line is counted under the console's noise rules. Run meta from the config the entry point
prints at start: `n_sampling`, `num_gpus_per_node`, the training and inference workers' GPUs (their
`device_mapping`), whether they share GPUs (`colocate`) and `n_gpus`.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from polytrace_cli.errors import ErrorCode
from polytrace_cli.lazy import polars as pl

from polytrace_cli.ingest import console_lines as cl
from polytrace_cli.ingest.base import FileContext, Ingester
from polytrace_cli.ingest.console import ConsoleGrammar, NoiseRules, ParsedMetrics
from polytrace_cli.ingest.console.pipeline import METRIC, check_steps, classify
from polytrace_cli.ingest.console.reading import read_console_lines
from polytrace_cli.ingest.console.records import account_other_lines, did_not_rise, step_segments, store_metrics
from polytrace_cli.ingest.formats.roll import names
from polytrace_cli.ingest.registry import is_binary, register

STEP_START = r"pipeline step (-?\d+) start\.\.\.\s*$"
METRICS_DICT = r"(?:^|\] )\{\"(?:time|token|system|critic|actor|val_correct)/"
METRICS_TAG = r"metrics_tag: \{\"step\": "
_STEP_START = re.compile(STEP_START)
_DICT = re.compile(r"(?:^|\] )(\{\".*)$")
_TAG = re.compile(r"metrics_tag: (\{.*)$")
_SNIFF = re.compile(rb"pipeline step \d+ start\.\.\.")
_SNIFF_DICT = re.compile(rb"\{\"time/step_total\": |metrics_tag: \{\"step\": ")

ROLL_NOISE = NoiseRules(
    (("step boundary", r"pipeline step -?\d+ (?:start\.\.\.|finished)\s*$"),
     ("generation examples", r"(?:^|\] )\[\{\"prompt\": "),
     *cl.NOISE_RULES),
    default="other", ray="ray-log")


# The config the RLVR entry point prints at start (`examples/start_rlvr_pipeline.py`:
# `print(OmegaConf.to_yaml(cfg))`): top-level settings and each worker section's `device_mapping`.
_SECTION = re.compile(r"^([a-z_]+):\s*$")
_TOP_SETTING = re.compile(r"^(num_gpus_per_node|num_return_sequences_in_group): (\d+)\s*$")
_DEVICE_MAPPING = re.compile(r"^  device_mapping: (.+?)\s*$")
_RANGE = re.compile(r"range\(\s*(\d+)\s*,\s*(\d+)\s*\)")
CONFIG_LINE = r"^[a-z_]+:\s*$|^(?:num_gpus_per_node|num_return_sequences_in_group): \d+\s*$|^  device_mapping: "


def _devices(text: str) -> set[int] | None:
    """The GPU indices a printed `device_mapping` names (`list(range(0,16))`, `[0, 1, 2]`), else None."""
    if ranges := _RANGE.findall(text):
        return {gpu for start, end in ranges for gpu in range(int(start), int(end))}
    found = re.findall(r"\d+", text)
    return {int(gpu) for gpu in found} if found and text.lstrip().startswith("[") else None


def config_meta(texts: list[str]) -> dict:
    """Run meta from the printed config's lines: `n_sampling` (`num_return_sequences_in_group`),
    `num_gpus_per_node`, the GPUs of the training and the inference workers (`actor_train_gpus`,
    `actor_infer_gpus`), whether they share GPUs (`colocate`) and `n_gpus` (the two together)."""
    meta: dict = {}
    section, mappings = None, {}
    for text in texts:
        if found := _TOP_SETTING.match(text):
            key = "n_sampling" if found.group(1) == "num_return_sequences_in_group" else found.group(1)
            meta.setdefault(key, int(found.group(2)))
        elif found := _SECTION.match(text):
            section = found.group(1)
        elif (found := _DEVICE_MAPPING.match(text)) and section in ("actor_train", "actor_infer"):
            devices = _devices(found.group(1))
            if devices is not None:
                mappings.setdefault(section, devices)
    train, infer = mappings.get("actor_train"), mappings.get("actor_infer")
    if train is not None and infer is not None:
        meta.update({"actor_train_gpus": len(train), "actor_infer_gpus": len(infer),
                     "colocate": bool(train & infer), "n_gpus": len(train | infer)})
    return meta


class RollGrammar(ConsoleGrammar):
    """Cleaning and classifying ROLL's lines (the console pipeline's first steps); `load` parses."""

    anchor = "["
    noise = ROLL_NOISE

    def metric_kind(self, cleaned: pl.Expr, raw_chars: pl.Expr) -> pl.Expr:
        return pl.when(cleaned.str.contains(METRICS_DICT) | cleaned.str.contains(METRICS_TAG)).then(pl.lit(METRIC))


def _pair(value) -> tuple[float | None, str | None]:
    if isinstance(value, bool):
        return float(value), None
    if isinstance(value, (int, float)):
        return float(value), None
    if value is None:
        return None, None
    if isinstance(value, str):
        return None, value
    return None, json.dumps(value)


class OutOfRange(ValueError):
    """A number in a dict that a double cannot hold (`1e400`)."""


def _finite(text: str) -> float:
    number = float(text)
    if math.isinf(number):
        raise OutOfRange(f"{text} is out of range for a double")
    return number


def _payload(text: str) -> object:
    return json.loads(text, parse_float=_finite, parse_constant=lambda name: math.nan if name == "NaN"
                      else math.copysign(math.inf, -1 if name.startswith("-") else 1))


def parse_lines(ctx: FileContext, lines: pl.DataFrame) -> ParsedMetrics:
    """Pairs of the metric dicts, each at its step (the `metrics_tag` line's, else the `pipeline step N
    start...` line before it); `time/step_total` also one step back as `time/step_total/own` (see the
    module docstring)."""
    metric_lines = lines.filter(pl.col("kind") == METRIC).select("line_no", "c", "raw")
    tagged = metric_lines.get_column("c").str.contains(METRICS_TAG).any()
    starts = lines.filter(pl.col("c").str.contains(STEP_START)).select("line_no", "c")
    boundaries = [(line_no, _STEP_START.search(text).group(1)) for line_no, text in starts.iter_rows()]
    rows: list[tuple] = []
    position, step, logged = 0, None, {}
    for line_no, cleaned, raw in metric_lines.iter_rows():
        while position < len(boundaries) and boundaries[position][0] < line_no:
            step = boundaries[position][1]
            position += 1
        is_tag = _TAG.search(cleaned) is not None
        if tagged and not is_tag:
            ctx.ignore("metrics dict also in metrics_tag")
            continue
        try:
            if is_tag:
                record = _payload(_TAG.search(cleaned).group(1))
                if not isinstance(record, dict) or not isinstance(record.get("metrics"), dict):
                    raise ValueError("not an object with step and metrics")
                payload, line_step = record["metrics"], record.get("step")
                line_step = None if line_step is None else str(line_step)
            else:
                payload, line_step = _payload(_DICT.search(cleaned).group(1)), step
                if not isinstance(payload, dict):
                    raise ValueError("not an object")
        except OutOfRange as error:
            ctx.reject(line_no, f"ROLL metrics dict: {error}", raw, code=ErrorCode.OUT_OF_RANGE)
            continue
        except ValueError as error:
            ctx.reject(line_no, f"ROLL metrics dict is not JSON: {error}", raw, code=ErrorCode.INVALID_JSON)
            continue
        if line_step is None:
            ctx.reject(line_no, "ROLL metrics dict without a step (no `pipeline step N start...` line before it)",
                       raw, code=ErrorCode.MISSING_FIELD)
            continue
        for index, (key, value) in enumerate(payload.items(), start=1):
            number, text = _pair(value)
            rows.append((line_no, line_step, index, key.rsplit("@", 1)[0] if "@" in key else key, number, text, None))
        logged[line_step] = line_no
        total = payload.get("time/step_total")
        earlier = str(int(line_step) - 1) if line_step.lstrip("-").isdigit() else None
        if isinstance(total, (int, float)) and not isinstance(total, bool) and earlier in logged:
            rows.append((logged[earlier], earlier, 0, "time/step_total/own", float(total), None, None))
    return ParsedMetrics.from_rows(sorted(rows, key=lambda row: (row[0], row[2])))


@register
class RollConsoleIngester(Ingester):
    name = "roll-console"
    version = "1"
    framework = "roll"
    description = "ROLL RLVR pipeline stdout: `pipeline step N start...` and the step's metrics as a JSON dict"
    metric_aliases = names.METRIC_ALIASES
    validation_prefixes = names.VALIDATION_PREFIXES

    def sniff(self, path: Path, head: bytes) -> bool:
        return not is_binary(head) and _SNIFF.search(head) is not None and _SNIFF_DICT.search(head) is not None

    def load(self, ctx: FileContext) -> None:
        lines = classify(read_console_lines(ctx.path), RollGrammar())
        ctx.lines = lines.height
        lines = account_other_lines(ctx, lines, pl.col("kind") != METRIC)
        metrics = check_steps(ctx, parse_lines(ctx, lines), lines).metrics
        texts = lines.filter(pl.col("c").str.contains(CONFIG_LINE)).get_column("c").to_list()
        ctx.run_meta.update({"framework": "roll", **config_meta(texts)})
        if not metrics.height:
            ctx.note("zero steps: no ROLL metrics dicts")
            return
        steps = metrics.select("line_no", "step").unique("line_no", maintain_order=True)
        segments = step_segments(list(steps.iter_rows()), did_not_rise)
        ctx.stored = segments.height
        store_metrics(ctx, metrics, segments, "roll", lines=lines)
