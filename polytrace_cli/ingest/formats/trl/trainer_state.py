"""`trainer_state.json` of a transformers Trainer (TRL's trainers write it into each
`checkpoint-N/` folder, and the final one into the output folder).

`log_history` holds one object per logged step, the same dict the console prints plus its
`step`; evaluation entries (`eval_*` keys, stored as `eval/*`) and the end-of-training entry
(`train_runtime`, ...: run meta) sit among them. The accounting unit is the `log_history` entry.

Every checkpoint's file repeats the history of the earlier ones, so only the most advanced file of
an output folder is read (highest `global_step`, then the longest history, then the output folder's
own file): the others are counted under the ignore rule `superseded by a later trainer_state.json`
and say which file supersedes them. `num_tokens` is cumulative: `num_tokens/per_step` is derived
(`trl.tokens_per_step`). An entry without a whole-number `step` (NaN, 1e400), holding a number no
double holds (`1e400`, 400 digits, the string '1e400') or nested too deep to read is rejected
alone.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from polytrace_cli.lazy import polars as pl

from polytrace_cli.errors import ErrorCode, IngestError
from polytrace_cli.ingest import json_documents
from polytrace_cli.ingest.formats.trl import names as trl_names
from polytrace_cli.ingest.formats.trl import logged as trl
from polytrace_cli.ingest.base import STEP_MAX, STEP_MIN, FileContext, Ingester
from polytrace_cli.ingest.formats.tensorboard.events import claim_framework
from polytrace_cli.ingest.registry import register
from polytrace_cli.ingest.step_rows import store_step_rows, with_segments

CHECKPOINT_FOLDER = re.compile(r"checkpoint-\d+")
SUPERSEDED_RULE = "superseded by a later trainer_state.json"
META_FIELDS = ("logging_steps", "max_steps", "num_train_epochs", "train_batch_size", "eval_steps", "save_steps")


@dataclass(frozen=True)
class UnreadableEntry:
    """A `log_history` entry that cannot be read (nested too deep, not JSON)."""

    reason: str
    code: ErrorCode
    raw: str


def read_state(path: Path) -> dict:
    """The parsed file, or IngestError when it is not a JSON object with a `log_history` list.

    Numbers no double holds are read as `json_documents.BeyondDouble`. A document too deep for the
    parser is read entry by entry: its `log_history` elements are cut apart by scanning, each
    parsed alone (an entry nested too deep is an `UnreadableEntry`), and the rest of the document
    parsed without them."""
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        document = json_documents.loads(text)
    except json.JSONDecodeError as error:
        raise IngestError(f"trainer_state.json is not valid JSON: {error.msg} at line {error.lineno}",
                          ErrorCode.INVALID_JSON) from None
    except RecursionError:
        document = _read_entry_by_entry(text)
    if not isinstance(document, dict) or not isinstance(document.get("log_history"), list):
        raise IngestError("trainer_state.json has no log_history list", ErrorCode.MISSING_FIELD)
    return document


def _read_entry_by_entry(text: str) -> dict:
    split = json_documents.array_elements(text, "log_history")
    too_deep = IngestError("trainer_state.json is nested too deep to read", ErrorCode.INVALID_JSON)
    if split is None:
        raise too_deep
    elements, rest = split
    try:
        document = json_documents.loads(rest)
    except (ValueError, RecursionError):
        raise too_deep from None
    if not isinstance(document, dict):
        raise too_deep
    entries: list = []
    for element in elements:
        try:
            entries.append(json_documents.loads(element))
        except RecursionError:
            entries.append(UnreadableEntry("log_history entry is nested too deep to read", ErrorCode.INVALID_JSON,
                                           element[:300]))
        except ValueError as error:
            entries.append(UnreadableEntry(f"log_history entry is not JSON: {error}", ErrorCode.INVALID_JSON, element[:300]))
    document["log_history"] = entries
    return document


def _rank(path: Path, output_folder: Path) -> tuple | None:
    try:
        document = read_state(path)
    except (IngestError, OSError):
        return None
    step = document.get("global_step")
    return (step if isinstance(step, int) else -1, len(document["log_history"]), path.parent == output_folder)


def superseding_file(path: Path) -> Path | None:
    """The trainer_state.json of the same output folder that is further along than `path`, if any."""
    output_folder = path.parent.parent if CHECKPOINT_FOLDER.fullmatch(path.parent.name) else path.parent
    candidates = [output_folder / "trainer_state.json",
                  *output_folder.glob("checkpoint-*/trainer_state.json")]
    own = _rank(path, output_folder)
    best = None
    for candidate in candidates:
        if candidate == path or not candidate.is_file():
            continue
        rank = _rank(candidate, output_folder)
        if rank is not None and own is not None and rank > own and (best is None or rank > best[0]):
            best = (rank, candidate)
    return best[1] if best else None


def _excerpt(entry) -> str:
    return json.dumps(entry, default=str)[:300]


def _number(value) -> float | None:
    try:
        return trl.scalar(value)[0]
    except trl.TooLarge:
        return None


@register
class TrainerStateIngester(Ingester):
    name = "trl-trainer-state"
    version = "1"
    framework = None
    description = "transformers/TRL trainer_state.json (log_history): the latest checkpoint's steps"
    metric_aliases = trl_names.METRIC_ALIASES
    validation_prefixes = trl_names.VALIDATION_PREFIXES

    def sniff(self, path: Path, head: bytes) -> bool:
        return path.name == "trainer_state.json" and b'"log_history"' in head

    def load(self, ctx: FileContext) -> None:
        document = read_state(ctx.path)
        history = document["log_history"]
        ctx.lines = len(history)
        later = superseding_file(ctx.location)
        if later is not None:
            ctx.ignore(SUPERSEDED_RULE, len(history))
            ctx.note(f"superseded by {later.parent.name}/{later.name}: its log_history holds these steps")
            return
        rows: list[tuple] = []
        summary = None
        for line_no, entry in enumerate(history, start=1):
            if isinstance(entry, UnreadableEntry):
                ctx.reject(line_no, entry.reason, entry.raw, code=entry.code)
                continue
            if not isinstance(entry, dict):
                ctx.reject(line_no, "log_history entry is not an object", _excerpt(entry), code=ErrorCode.NOT_AN_OBJECT)
                continue
            too_large = json_documents.beyond_double(entry)
            if too_large is not None:
                ctx.reject(line_no, f"the number {too_large[:40]} is beyond a double", _excerpt(entry),
                           code=ErrorCode.OUT_OF_RANGE)
                continue
            if trl.is_summary_dict(entry):
                summary = {key: _number(value) for key, value in entry.items()}
                ctx.ignore("end-of-training entry (run meta)")
                continue
            step = entry.get("step")
            if isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step) \
                    or step != int(step):
                ctx.reject(line_no, "log_history entry has no whole-number step", _excerpt(entry),
                           code=ErrorCode.MISSING_FIELD if step is None else ErrorCode.TYPE_ERROR)
                continue
            if not STEP_MIN <= step <= STEP_MAX:
                ctx.reject(line_no, f"step {step} is out of range", _excerpt(entry), code=ErrorCode.OUT_OF_RANGE)
                continue
            in_eval = trl.is_eval_dict(entry)
            try:
                pairs = [(trl.store_key(trl.mean_length_key(key, entry), in_eval), *trl.scalar(value))
                         for key, value in entry.items() if key != "step"]
            except trl.TooLarge as error:
                ctx.reject(line_no, f"the number {error} is beyond a double", _excerpt(entry), code=ErrorCode.OUT_OF_RANGE)
                continue
            rows.extend((line_no, int(step), key, value, text) for key, value, text in pairs)
            ctx.stored += 1
        frame = pl.DataFrame(rows, schema={"line_no": pl.Int64, "step": pl.Int64, "key": pl.String,
                                           "value": pl.Float64, "text_value": pl.String}, orient="row")
        frame = with_segments(frame)
        derived = trl.tokens_per_step(frame.rename({"segment": "group"}).filter(pl.col("value").is_not_null()))
        interval = document.get("logging_steps")
        covered = trl.steps_covered_rows(frame.rename({"segment": "group"}), "group",
                                         interval if isinstance(interval, int) and interval >= 1 else None)
        frame = pl.concat([frame, *(part.rename({"group": "segment"}).with_columns(text_value=pl.lit(None, pl.String))
                                    .select(frame.columns) for part in (derived, covered))]).sort("line_no")
        keys = frame.get_column("key").unique().to_list()
        if trl.is_trl(keys):
            claim_framework(ctx, "trl")
        meta = {name: document.get(name) for name in META_FIELDS if document.get(name) is not None}
        if isinstance(document.get("global_step"), int):
            meta["trl_last_step"] = document["global_step"]
        if summary:
            meta["trl_train_summary"] = summary
        ctx.run_meta.update(meta)
        store_step_rows(ctx, frame, "_trainer_state_rows")

