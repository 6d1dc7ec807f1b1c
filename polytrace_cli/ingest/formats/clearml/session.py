"""A ClearML offline session folder (`Task.set_offline(True)`; `~/.clearml/cache/offline/offline-<id>/`,
zipped beside it for `clearml-task --import-offline-session`): three JSON files, each read by a format here.

- `metrics.jsonl` (`clearml-metrics`): each line a JSON array of the reporter's events, as flushed.
  A scalar (`"type": "training_stats_scalar"`) has `metric` (the title), `variant` (the series), `iter`
  (the step) and `value`; its key is `<title>/<series>`, the key verl split into them
  (`verl/utils/tracking.py` `ClearMLLogger.log`), with `train/` dropped as for TensorBoard. Other events
  (plots, debug images, text) are ignored by type. The accounting unit is the event; a line that is
  not a JSON array is one rejected unit. A key's step lower than its previous one starts a new segment.
- `task.json` (`clearml-task`): the task's name, project, id and type, its `hyperparams`
  (`task.connect(...)`: sections of `{name: {value: text}}`, names joined with `/`) and its
  `configuration` (`task.connect_configuration(...)`: a dict is kept as HOCON text, `key = value` lines
  in `name { ... }` blocks, read back here when it is that plain). Both give the run meta as a wandb
  config does (framework, model, n_sampling, GPUs); the accounting unit is the top-level entry.
- `log.jsonl` (`clearml-log`): the console lines ClearML captured. ClearML reports a NaN scalar as
  0.0 unless told otherwise (`Logger.set_reporting_nan_value`) and says so once in this log: the value
  it used is the run meta `clearml_nan_reported_as`, and a note says that a 0.0 in the run may be a NaN.
  The accounting unit is the event; the other lines are ignored.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from polytrace_cli.lazy import polars as pl

from polytrace_cli.errors import ErrorCode, IngestError
from polytrace_cli.ingest.base import STEP_MAX, STEP_MIN, FileContext, Ingester
from polytrace_cli.ingest.formats.clearml import names
from polytrace_cli.ingest.formats.tensorboard.events import claim_framework, framework_of_keys, metric_key
from polytrace_cli.ingest.formats.wandb.run_files import detect_framework, run_meta_from_config
from polytrace_cli.ingest.registry import register
from polytrace_cli.ingest.step_rows import store_step_rows

SCALAR_EVENT = "training_stats_scalar"
# A number in an event that a double cannot hold (`1e400`): the event is rejected alone.
TOO_LARGE = "\x00too large for a double"
_NAN_REPORTED = re.compile(r"NaN value encountered\. Reporting it as '([^']*)'")
_HOCON_OPEN = re.compile(r"^([\w.\-]+|\"[^\"]*\")\s*\{\s*$")
_HOCON_VALUE = re.compile(r"^([\w.\-]+|\"[^\"]*\")\s*[=:]\s*(.*?)\s*$")


def in_session(path: Path, name: str) -> bool:
    """True for the file `name` of a ClearML offline session folder (it holds `task.json`)."""
    return path.name == name and (path.parent / "task.json").is_file() and path.parent.name.startswith("offline-")


def _typed(text: str):
    """A HOCON or hyperparameter value's text as JSON reads it (`8`, `true`, `"a"`), else the text."""
    try:
        return json.loads(text)
    except ValueError:
        return {"True": True, "False": False, "None": None}.get(text, text)


def plain_hocon(text: str) -> dict | None:
    """The nested dict that ClearML's HOCON text of a plain dict stands for (`name { ... }` blocks and
    `key = value` lines), or None when the text holds anything else (lists over lines, includes)."""
    root: dict = {}
    stack = [root]
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", "//")):
            continue
        if line == "}":
            if len(stack) == 1:
                return None
            stack.pop()
        elif opened := _HOCON_OPEN.match(line):
            stack.append(stack[-1].setdefault(opened.group(1).strip('"'), {}))
        elif value := _HOCON_VALUE.match(line):
            stack[-1][value.group(1).strip('"')] = _typed(value.group(2))
        else:
            return None
    return root if len(stack) == 1 else None


def _nested(flat: dict[str, object]) -> dict:
    nested: dict = {}
    for name, value in flat.items():
        node = nested
        parts = name.split("/")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                break
        else:
            node[parts[-1]] = value
    return nested


@register
class ClearmlMetricsIngester(Ingester):
    name = "clearml-metrics"
    version = "1"
    framework = None
    description = "ClearML offline session metrics (offline-<id>/metrics.jsonl: arrays of reporter events)"
    metric_aliases = names.METRIC_ALIASES
    validation_prefixes = names.VALIDATION_PREFIXES

    def sniff(self, path: Path, head: bytes) -> bool:
        return in_session(path, "metrics.jsonl")

    def load(self, ctx: FileContext) -> None:
        rows, units = [], 0
        text = ctx.path.read_text(encoding="utf-8", errors="replace")
        for line_no, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                units += 1
                ctx.ignore("blank line")
                continue
            try:
                events = json.loads(line, parse_float=lambda text: float(text) if math.isfinite(float(text))
                                    else TOO_LARGE)
                if not isinstance(events, list):
                    raise ValueError("not an array of events")
            except ValueError as error:
                units += 1
                ctx.reject(line_no, f"line {line_no} is not a JSON array of events: {error}", line, code=ErrorCode.INVALID_JSON)
                continue
            for event in events:
                units += 1
                kind = event.get("type") if isinstance(event, dict) else None
                if kind != SCALAR_EVENT:
                    ctx.ignore(f"{kind or 'untyped'} event")
                    continue
                step, value = event.get("iter"), event.get("value")
                if not isinstance(step, int) or not STEP_MIN <= step <= STEP_MAX:
                    ctx.reject(line_no, f"line {line_no}: scalar step {step!r} is not a whole number in range", None,
                               code=ErrorCode.OUT_OF_RANGE if isinstance(step, int) else ErrorCode.TYPE_ERROR)
                    continue
                if value == TOO_LARGE:
                    ctx.reject(line_no, f"line {line_no}: a scalar value is out of range for a double", None,
                               code=ErrorCode.OUT_OF_RANGE)
                    continue
                if not isinstance(value, (int, float)) or isinstance(value, bool):
                    ctx.reject(line_no, f"line {line_no}: scalar value {value!r} is not a number", None, code=ErrorCode.TYPE_ERROR)
                    continue
                key = metric_key(f"{event.get('metric', '')}/{event.get('variant', '')}")
                rows.append((units, line_no, key, step, float(value)))
                ctx.stored += 1
        ctx.lines = units
        frame = pl.DataFrame(rows, schema={"order": pl.Int64, "line_no": pl.Int64, "key": pl.String, "step": pl.Int64,
                                           "value": pl.Float64}, orient="row")
        back = (pl.col("step") < pl.col("step").shift(1).over("key")).fill_null(False).cast(pl.Int32)
        frame = frame.sort("order").with_columns(segment=back.cum_sum().over("key"), text_value=pl.lit(None, pl.String))
        claim_framework(ctx, framework_of_keys(frame.get_column("key").unique().to_list()))
        store_step_rows(ctx, frame.select("segment", "step", "key", "value", "text_value", "line_no"), "_clearml_scalars")


@register
class ClearmlTaskIngester(Ingester):
    name = "clearml-task"
    version = "1"
    framework = None
    description = "ClearML offline session task (offline-<id>/task.json): name, project, settings"
    metric_aliases = names.METRIC_ALIASES
    validation_prefixes = names.VALIDATION_PREFIXES

    def sniff(self, path: Path, head: bytes) -> bool:
        return in_session(path, "task.json")

    def load(self, ctx: FileContext) -> None:
        try:
            task = json.loads(ctx.path.read_text(encoding="utf-8", errors="replace"))
        except ValueError as error:
            raise IngestError(f"ClearML task.json is not valid JSON: {error}", ErrorCode.INVALID_JSON) from None
        if not isinstance(task, dict):
            raise IngestError("ClearML task.json is not an object", ErrorCode.NOT_AN_OBJECT)
        ctx.lines = len(task)
        used = {"name", "project_name", "id", "type", "hyperparams", "configuration"}
        ctx.stored = len(used & task.keys())
        ctx.ignore("task entry not read", ctx.lines - ctx.stored)
        flat = {}
        for section in (task.get("hyperparams") or {}).values():
            for name, entry in (section or {}).items():
                if isinstance(entry, dict) and "value" in entry:
                    flat[name] = _typed(str(entry["value"]))
        config = _nested(flat)
        kept_text = {}
        for name, entry in (task.get("configuration") or {}).items():
            value = entry.get("value") if isinstance(entry, dict) else None
            parsed = plain_hocon(value) if isinstance(value, str) else None
            if parsed is not None:
                config.update(parsed)
            elif isinstance(value, str):
                kept_text[name] = value[:2000]
        framework = detect_framework(config)
        meta, _ = run_meta_from_config(config, framework)
        ctx.run_meta.update({"clearml_task_name": task.get("name"), "clearml_project": task.get("project_name"),
                             "clearml_task_id": task.get("id"), "clearml_task_type": task.get("type"),
                             "clearml_config": config, **({"clearml_config_text": kept_text} if kept_text else {}),
                             **meta})
        claim_framework(ctx, framework)


@register
class ClearmlLogIngester(Ingester):
    name = "clearml-log"
    version = "1"
    framework = None
    description = "ClearML offline session console (offline-<id>/log.jsonl): how NaN scalars were reported"
    metric_aliases = names.METRIC_ALIASES
    validation_prefixes = names.VALIDATION_PREFIXES

    def sniff(self, path: Path, head: bytes) -> bool:
        return in_session(path, "log.jsonl")

    def load(self, ctx: FileContext) -> None:
        units, replaced = 0, None
        for line_no, line in enumerate(ctx.path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
            try:
                events = json.loads(line) if line.strip() else []
                if not isinstance(events, list):
                    raise ValueError("not an array of events")
            except ValueError as error:
                units += 1
                ctx.reject(line_no, f"line {line_no} is not a JSON array of events: {error}", line, code=ErrorCode.INVALID_JSON)
                continue
            if not events:
                units += 1
                ctx.ignore("blank line")
            for event in events:
                units += 1
                found = _NAN_REPORTED.search(str(event.get("msg", ""))) if isinstance(event, dict) else None
                if found:
                    replaced = _typed(found.group(1))
                    ctx.stored += 1
                else:
                    ctx.ignore("console message")
        ctx.lines = units
        if replaced is not None:
            ctx.run_meta["clearml_nan_reported_as"] = replaced
            ctx.note(f"ClearML reported NaN scalars as {replaced!r}: a {replaced!r} in this run may be a NaN")
