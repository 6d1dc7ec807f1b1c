"""wandb offline run log (`wandb/offline-run-*/run-*.wandb`): the binary record log a run writes
with `WANDB_MODE=offline`, holding the history, config and summary that an online run keeps on
the server (an online run folder is read from its `files/` as before: config.yaml,
wandb-summary.json, output.log).

Layout (wandb's record log, LevelDB-style): a 7-byte file header (`:W&B`, magic 0xBEE1 as a
little-endian uint16, version 0), then 32 KiB blocks. Each block holds records, each behind a
7-byte header (CRC-32 of the record type byte followed by the data, as a little-endian uint32;
data length, uint16; type: 1 full, 2 first, 3 middle, 4 last piece of a record split across
blocks). A block tail shorter than a header is zero padding. Each record's data is a
`wandb_internal_pb2.Record` protobuf, read with wandb's own definitions (the optional `wandb`
package: `pip install 'polytrace[wandb]'`; without it the file is rejected with a one-line reason).

The accounting unit is the record. `history` records are step rows: `_step` is the step (unless the
row holds a key `define_metric` made the step metric of others, such as slime's `rollout/step`: wandb's
`_step` then only counts `log` calls, and that key's value is the step, the key itself not stored), each
item's key is its `key` or its `nested_key` parts joined with '.', the value is JSON; `_runtime`
and `_timestamp` are wandb's clock and are not stored, media and other non-scalar values are left
out of the row. Keys map as in TensorBoard (`train/` removed). `run` and `config` records give the
config (run meta as from config.yaml: framework, model, n_sampling, ...), `summary` records the
final values (run meta `wandb_summary`, like wandb-summary.json); every other record type is
counted under `<type> record`. A record whose CRC does not match or whose length runs past its
block costs the rest of that block: reading resyncs at the next block's first full or first piece
(`scan_log`), and each damaged span is rejected as one record with its byte range; a truncated tail
is one such span. A value no double holds (`1e400`, 400 digits), JSON nested too deep, or a `_step`
that is not a whole number (NaN, 1e400) rejects its record alone. A step lower than the previous
row's starts a new segment. A row's `_timestamp` is its step's wall clock (`step_clock`); a `stats`
record's GPU utilizations (`gpu.<i>.gpu`) are engine samples (`engine_metrics`, `gpu_utilization`).
"""

from __future__ import annotations

import json
import math
import re
import struct
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from pathlib import Path

from polytrace_cli.lazy import polars as pl

from polytrace_cli.errors import ErrorCode, IngestError
from polytrace_cli.ingest.formats.trl import logged as trl
from polytrace_cli.ingest.base import STEP_MAX, STEP_MIN, FileContext, Ingester
from polytrace_cli.ingest.formats.tensorboard.events import claim_framework, framework_of_keys, metric_key
from polytrace_cli.ingest.formats.wandb.run_files import WANDB_BOOKKEEPING, detect_framework, run_meta_from_config
from polytrace_cli.ingest.registry import register
from polytrace_cli.ingest.step_rows import store_engine_samples, store_step_clock, store_step_rows, with_segments

EXTRA_HINT = "reading wandb offline runs needs the wandb package: pip install 'polytrace[wandb]'"
FILE_HEADER = struct.Struct("<4sHB")
RECORD_HEADER = struct.Struct("<IHB")
MAGIC = (b":W&B", 0xBEE1, 0)
BLOCK_BYTES = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
WANDB_CLOCK_KEYS = ("_runtime", "_timestamp")
# The wall clock of a history row (seconds since the epoch): kept as the step's `step_clock`, not as a metric.
WANDB_WALL_CLOCK = "_timestamp"
# A GPU's utilization in wandb's system-metrics (`stats`) records, in percent.
WANDB_GPU_UTILIZATION = re.compile(r"gpu\.(\d+)\.gpu")


@dataclass(frozen=True)
class Damage:
    """Bytes start..end of a record log that hold no readable record (a CRC that does not match, a
    length past its block, a piece out of order, a cut tail)."""

    start: int
    end: int
    why: str


def scan_log(data: bytes, magic: tuple = MAGIC, label: str = "wandb") -> list[bytes | Damage]:
    """The record log's records (their data, in order) and the damaged spans between them.

    The framing lets a reader resync at each block: after damage, the rest of the block is passed
    over, and so are the middle and last pieces at the start of the blocks that follow (they belong
    to the damaged record), up to the next full or first piece. A cut tail is one damaged span to
    the end. Raises IngestError when the file header is not `magic` (wandb's; SwanLab writes the same
    LevelDB-style log behind its own header)."""
    if len(data) < FILE_HEADER.size or FILE_HEADER.unpack_from(data) != magic:
        raise IngestError(f"not a {label} record log: the file does not start with the"
                          f" {magic[0].decode(errors='replace')} header", ErrorCode.CORRUPT_FILE)
    units: list[bytes | Damage] = []
    pending: list[bytes] | None = None  # the pieces of a record split across blocks, so far
    record_start = offset = FILE_HEADER.size
    damage: tuple[int, str] | None = None  # (start, why) of the damaged span being passed over

    def damaged(start: int, why: str) -> None:
        nonlocal damage, pending
        if damage is None:
            damage = (record_start if pending is not None else start, why)
        pending = None

    def close_damage(end: int) -> None:
        nonlocal damage
        if damage is not None:
            units.append(Damage(damage[0], end, damage[1]))
            damage = None

    while offset < len(data):
        block_end = (offset // BLOCK_BYTES + 1) * BLOCK_BYTES
        room = block_end - offset
        if room < RECORD_HEADER.size:
            offset = block_end  # zero padding: no header fits before the block ends
            continue
        if offset + RECORD_HEADER.size > len(data):
            damaged(offset, "the log is cut short")
            break
        checksum, length, kind = RECORD_HEADER.unpack_from(data, offset)
        if checksum == 0 and length == 0 and kind == 0:
            offset = block_end  # zero padding to the end of the block
            continue
        body_end = offset + RECORD_HEADER.size + length
        if body_end > len(data) and body_end <= block_end:
            damaged(offset, "the log is cut short")
            break
        body = data[offset + RECORD_HEADER.size:body_end]
        if body_end > block_end or kind not in (FULL, FIRST, MIDDLE, LAST):
            damaged(offset, "a record header with a length past its block or an unknown type")
            offset = block_end
            continue
        if zlib.crc32(body, zlib.crc32(bytes([kind]))) != checksum:
            damaged(offset, "a record whose CRC does not match")
            offset = block_end
            continue
        if kind in (FULL, FIRST):
            if pending is not None:
                damaged(record_start, "a record split across blocks without its last piece")
            close_damage(offset)
            if kind == FULL:
                units.append(body)
            else:
                record_start, pending = offset, [body]
        elif pending is None:
            damaged(offset, "a middle or last piece without its first")  # passed over while resyncing
        else:
            pending.append(body)
            if kind == LAST:
                units.append(b"".join(pending))
                pending = None
        offset = body_end
    if pending is not None:
        damaged(record_start, "the log is cut short inside a record split across blocks")
    close_damage(len(data))
    return units


def read_records(data: bytes, magic: tuple = MAGIC, label: str = "wandb") -> tuple[list[bytes], int | None]:
    """(the readable records' data in order, the byte offset where the first damage starts, or None
    when the whole file read). Raises IngestError when the file header is not `magic`."""
    units = scan_log(data, magic, label)
    first = next((unit.start for unit in units if isinstance(unit, Damage)), None)
    return [unit for unit in units if not isinstance(unit, Damage)], first


def _key(item) -> str:
    return item.key or ".".join(item.nested_key)


class RecordProblem(Exception):
    """A record that cannot be read: its reason, error code and an excerpt."""

    def __init__(self, reason: str, code: ErrorCode, raw: str | None = None) -> None:
        super().__init__(reason)
        self.reason, self.code, self.raw = reason, code, raw


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise RecordProblem(f"the number {text[:40]} is beyond a double", ErrorCode.OUT_OF_RANGE, text[:300])
    return value


def _double_int(text: str) -> int:
    value = int(text)
    if abs(value) > sys.float_info.max:
        raise RecordProblem(f"the {len(text)}-digit integer is beyond a double", ErrorCode.OUT_OF_RANGE, text[:300])
    return value


def _json_value(text: str):
    """A value's JSON as wandb wrote it (`NaN` and `Infinity` for its non-finite floats); text that
    is not JSON is that text. A number literal no double holds (`1e400`, 400 digits) or JSON nested
    too deep to read is a RecordProblem."""
    try:
        return json.loads(text, parse_float=_finite_float, parse_int=_double_int)
    except RecursionError:
        raise RecordProblem("a value is JSON nested too deep to read", ErrorCode.INVALID_JSON, text[:300]) from None
    except ValueError:
        return text


@register
class WandbOfflineIngester(Ingester):
    name = "wandb-offline"
    version = "1"
    framework = None
    description = "wandb offline run (offline-run-*/run-*.wandb record log): history, config, summary"

    def sniff(self, path: Path, head: bytes) -> bool:
        return path.suffix == ".wandb" and path.parent.name.startswith("offline-run-") and head.startswith(b":W&B")

    def load(self, ctx: FileContext) -> None:
        try:
            from google.protobuf.message import DecodeError
            from wandb.proto import wandb_internal_pb2
        except ImportError:
            raise IngestError(EXTRA_HINT, ErrorCode.UNREADABLE_FILE) from None
        data = ctx.path.read_bytes()
        units = scan_log(data)
        rows: list[tuple] = []
        system: list[tuple] = []
        config: dict = {}
        summary: dict = {}
        meta: dict = {}
        decoded: list = []
        for unit in units:
            if isinstance(unit, Damage):
                decoded.append(unit)
                continue
            try:
                decoded.append(wandb_internal_pb2.Record.FromString(unit))
            except (DecodeError, RecursionError, ValueError):
                decoded.append(None)
        # Keys that `define_metric(..., step_metric=KEY)` made another key's step (slime's `rollout/step`).
        step_keys = list(dict.fromkeys(record.metric.step_metric for record in decoded
                                       if record is not None and not isinstance(record, Damage)
                                       and record.WhichOneof("record_type") == "metric" and record.metric.step_metric))
        used_step_keys: set[str] = set()
        records = 0
        for record_no, record in enumerate(decoded, start=1):
            if isinstance(record, Damage):
                ctx.reject(record_no, f"record log damaged after {records} readable records: bytes {record.start}"
                           f" to {record.end} of {len(data)} hold no readable record ({record.why}); the records"
                           " before and after them are kept", code=ErrorCode.CORRUPT_FILE)
                ctx.note(f"damaged at bytes {record.start}-{record.end} of {len(data)}")
                continue
            records += 1
            if record is None:
                ctx.reject(record_no, "record is not a valid wandb Record protobuf", None,
                           code=ErrorCode.UNPARSABLE_LINE)
                continue
            try:
                self._record(ctx, record_no, record, rows, config, summary, meta, system, step_keys, used_step_keys)
            except RecordProblem as problem:
                ctx.reject(record_no, problem.reason, problem.raw, code=problem.code)
        ctx.lines = len(units)
        if used_step_keys:
            meta["wandb_step_metrics"] = sorted(used_step_keys)
        self._store(ctx, rows, config, summary, meta)
        store_engine_samples(ctx, pl.DataFrame(system, orient="row", schema={
            "line_no": pl.Int64, "ts": pl.Float64, "instance": pl.String, "name": pl.String, "value": pl.Float64})
            .with_columns(engine=pl.lit("wandb-system"), metric=pl.lit("gpu_utilization"), labels=pl.lit("{}")),
            "_wandb_system")

    def _record(self, ctx: FileContext, record_no: int, record, rows: list[tuple], config: dict, summary: dict,
                meta: dict, system: list[tuple], step_keys: list[str], used_step_keys: set[str]) -> None:
        """Take one record's content (a history row, config, summary, the header); raises
        RecordProblem for a record that cannot be read, before anything of it is taken."""
        kind = record.WhichOneof("record_type")
        if kind == "history":
            if self._history(ctx, record_no, record.history, rows, step_keys, used_step_keys):
                ctx.stored += 1
        elif kind in ("run", "config"):
            updates = record.run.config.update if kind == "run" else record.config.update
            config.update({_key(item): _json_value(item.value_json) for item in updates})
            if kind == "run":
                meta.update({"wandb_run_id": record.run.run_id or None, "wandb_project": record.run.project or None,
                             "wandb_run_name": record.run.display_name or None})
            ctx.stored += 1
        elif kind == "summary":
            updates = {_key(item): _json_value(item.value_json) for item in record.summary.update}
            summary.update(updates)
            for item in record.summary.remove:
                summary.pop(_key(item), None)
            ctx.stored += 1
        elif kind == "stats" and self._stats(record_no, record.stats, system):
            ctx.stored += 1
        elif kind == "header" and record.header.version_info.producer:
            meta["wandb_versions"] = {"cli_version": record.header.version_info.producer.split("+")[0]}
            ctx.stored += 1
        else:
            ctx.ignore(f"{kind or 'empty'} record")

    @staticmethod
    def _stats(record_no: int, stats, system: list[tuple]) -> bool:
        """Append a system-metrics record's GPU utilizations (`gpu.<i>.gpu`, percent) to `system` as
        shares, on the record's wall clock; False when it holds none."""
        moment = stats.timestamp.seconds + stats.timestamp.nanos / 1e9
        found = False
        for item in stats.item:
            match = WANDB_GPU_UTILIZATION.fullmatch(item.key)
            value = _json_value(item.value_json) if match else None
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and moment > 0:
                system.append((record_no, moment, f"gpu {match.group(1)}", item.key, float(value) / 100.0))
                found = True
        return found

    @staticmethod
    def _history(ctx: FileContext, record_no: int, history, rows: list[tuple], step_keys: list[str] = (),
                 used_step_keys: set[str] | None = None) -> bool:
        """Append one history row's scalars to `rows`; False when the row is rejected or holds none.
        A row holding one of `step_keys` (a `define_metric` step metric) is at that key's value, not at
        wandb's `_step` (which counts `log` calls); the step key itself is not stored."""
        items = {_key(item): item.value_json for item in history.item}
        step = _json_value(items.pop("_step", "null"))
        if history.HasField("step") and step is None:
            step = history.step.num
        own = [key for key in step_keys if key in items]
        if own:
            step = _json_value(items[own[0]])
            for key in own:
                del items[key]
            if used_step_keys is not None:
                used_step_keys.add(own[0])
        values = {key: _json_value(text) for key, text in items.items() if key not in WANDB_CLOCK_KEYS}
        moment = _json_value(items[WANDB_WALL_CLOCK]) if WANDB_WALL_CLOCK in items else None
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step) \
                or step != int(step):
            ctx.reject(record_no, "history row has no whole-number _step", json.dumps(items)[:300],
                       code=ErrorCode.MISSING_FIELD if step is None else ErrorCode.TYPE_ERROR)
            return False
        if not STEP_MIN <= step <= STEP_MAX:
            ctx.reject(record_no, f"step {step} is outside the step range", None, code=ErrorCode.OUT_OF_RANGE)
            return False
        if isinstance(moment, (int, float)) and not isinstance(moment, bool) and math.isfinite(moment):
            rows.append((record_no, int(step), WANDB_WALL_CLOCK, float(moment), None))
        found = False
        for key, value in values.items():
            if isinstance(value, (dict, list)):
                continue
            number, text_value = trl.scalar(value) if not isinstance(value, str) else (None, value)
            if number is None and text_value is None:
                continue
            rows.append((record_no, int(step), key, number, text_value))
            found = True
        if not found:
            ctx.ignore("history row without scalars")
        return found

    @staticmethod
    def _store(ctx: FileContext, rows: list[tuple], config: dict, summary: dict, meta: dict) -> None:
        frame = pl.DataFrame(rows, schema={"line_no": pl.Int64, "step": pl.Int64, "tag": pl.String,
                                           "value": pl.Float64, "text_value": pl.String}, orient="row")
        is_clock = pl.col("tag") == WANDB_WALL_CLOCK
        clock = with_segments(frame.select("line_no", "step")).join(
            frame.filter(is_clock).select("line_no", logged_at="value"), on="line_no")
        frame = frame.filter(~is_clock)
        tags = frame.get_column("tag").unique().to_list()
        plain = {key: value for key, value in config.items() if key not in WANDB_BOOKKEEPING}
        framework = detect_framework(plain) or framework_of_keys(tags)
        config_meta, _ = run_meta_from_config(plain, detect_framework(plain))
        frame = with_segments(frame.with_columns(key=pl.col("tag").map_elements(metric_key, return_dtype=pl.String)
                                                 if frame.height else pl.col("tag")))
        if framework == "trl":
            derived = trl.tokens_per_step(frame.select("segment", "step", "key", "value", "line_no")
                                          .filter(pl.col("value").is_not_null()), "segment")
            frame = pl.concat([frame, derived.with_columns(tag=pl.col("key"), text_value=pl.lit(None, pl.String))
                               .select(frame.columns)]).sort("line_no")
        claim_framework(ctx, framework)
        final = {metric_key(key): (str(value) if isinstance(value, float) and not math.isfinite(value) else value)
                 for key, value in summary.items()
                 if not key.startswith("_") and not isinstance(value, (dict, list))}
        ctx.run_meta.update({**{k: v for k, v in meta.items() if v is not None}, **config_meta,
                             "wandb_summary": final, **({"framework_detected": framework} if framework else {})})
        if isinstance(summary.get("_step"), int):
            ctx.run_meta["wandb_last_step"] = summary["_step"]
        if isinstance(config_meta.get("model"), str):
            ctx.begin_writes()
            ctx.con.execute("UPDATE runs SET model = coalesce(model, ?) WHERE run_id = ?",
                            [config_meta["model"], ctx.run_id])
        store_step_rows(ctx, frame.select("segment", "step", "key", "value", "text_value", "line_no"),
                        "_wandb_offline_rows")
        store_step_clock(ctx, clock, "_wandb_offline_clock")
