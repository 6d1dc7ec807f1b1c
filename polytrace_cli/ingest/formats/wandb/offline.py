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
counted under `<type> record`. A record whose CRC does not match, or a truncated tail, ends the
readable part: the records before are kept and the damage is rejected as one record with its byte
offset. A step lower than the previous row's starts a new segment.
"""

from __future__ import annotations

import json
import math
import re
import struct
import zlib
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


def read_records(data: bytes, magic: tuple = MAGIC, label: str = "wandb") -> tuple[list[bytes], int | None]:
    """(the records' data in order, byte offset where the readable part ends or None when the
    whole file read). Raises IngestError when the file header is not `magic` (wandb's; SwanLab writes
    the same LevelDB-style log behind its own header)."""
    if len(data) < FILE_HEADER.size or FILE_HEADER.unpack_from(data) != magic:
        raise IngestError(f"not a {label} record log: the file does not start with the"
                          f" {magic[0].decode(errors='replace')} header", ErrorCode.CORRUPT_FILE)
    records: list[bytes] = []
    pending: bytes | None = None
    offset = FILE_HEADER.size
    record_start = offset
    while offset < len(data):
        room = BLOCK_BYTES - offset % BLOCK_BYTES
        if room < RECORD_HEADER.size:
            offset += room
            continue
        if offset + RECORD_HEADER.size > len(data):
            return records, record_start
        checksum, length, kind = RECORD_HEADER.unpack_from(data, offset)
        if checksum == 0 and length == 0 and kind == 0:
            offset += room  # zero padding to the end of the block
            continue
        body = data[offset + RECORD_HEADER.size:offset + RECORD_HEADER.size + length]
        if len(body) < length or zlib.crc32(body, zlib.crc32(bytes([kind]))) != checksum:
            return records, record_start
        if kind == FIRST:
            record_start, pending = offset, body
        elif kind in (MIDDLE, LAST) and pending is not None:
            pending += body
            if kind == LAST:
                records.append(pending)
                pending = None
        elif kind == FULL:
            records.append(body)
        else:
            return records, record_start
        offset += RECORD_HEADER.size + length
        if pending is None:
            record_start = offset
    return records, (record_start if pending is not None else None)


def _key(item) -> str:
    return item.key or ".".join(item.nested_key)


def _json_value(text: str):
    try:
        return json.loads(text)
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
        records, damaged_at = read_records(data)
        rows: list[tuple] = []
        system: list[tuple] = []
        config: dict = {}
        summary: dict = {}
        meta: dict = {}
        decoded: list = []
        for body in records:
            try:
                decoded.append(wandb_internal_pb2.Record.FromString(body))
            except DecodeError:
                decoded.append(None)
        # Keys that `define_metric(..., step_metric=KEY)` made another key's step (slime's `rollout/step`).
        step_keys = list(dict.fromkeys(record.metric.step_metric for record in decoded
                                       if record is not None and record.WhichOneof("record_type") == "metric"
                                       and record.metric.step_metric))
        used_step_keys: set[str] = set()
        for record_no, record in enumerate(decoded, start=1):
            if record is None:
                ctx.reject(record_no, "record is not a valid wandb Record protobuf", None, code=ErrorCode.UNPARSABLE_LINE)
                continue
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
                for item in record.summary.update:
                    summary[_key(item)] = _json_value(item.value_json)
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
        ctx.lines = len(records)
        if used_step_keys:
            meta["wandb_step_metrics"] = sorted(used_step_keys)
        if damaged_at is not None:
            ctx.lines += 1
            ctx.reject(len(records) + 1, f"record log damaged after {len(records)} readable records: byte {damaged_at}"
                       f" of {len(data)} is a truncated or corrupt record; the records before it are kept",
                       code=ErrorCode.CORRUPT_FILE)
            ctx.note(f"damaged at byte {damaged_at} of {len(data)}; {len(records)} records kept")
        self._store(ctx, rows, config, summary, meta)
        store_engine_samples(ctx, pl.DataFrame(system, orient="row", schema={
            "line_no": pl.Int64, "ts": pl.Float64, "instance": pl.String, "name": pl.String, "value": pl.Float64})
            .with_columns(engine=pl.lit("wandb-system"), metric=pl.lit("gpu_utilization"), labels=pl.lit("{}")),
            "_wandb_system")

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
        if isinstance(step, bool) or not isinstance(step, (int, float)) or step != int(step):
            ctx.reject(record_no, "history row has no whole-number _step", json.dumps(items)[:300],
                       code=ErrorCode.MISSING_FIELD if step is None else ErrorCode.TYPE_ERROR)
            return False
        if not STEP_MIN <= step <= STEP_MAX:
            ctx.reject(record_no, f"step {step} is outside the step range", None, code=ErrorCode.OUT_OF_RANGE)
            return False
        found = False
        for key, text in items.items():
            if key == WANDB_WALL_CLOCK:
                moment = _json_value(text)
                if isinstance(moment, (int, float)) and not isinstance(moment, bool) and math.isfinite(moment):
                    rows.append((record_no, int(step), WANDB_WALL_CLOCK, float(moment), None))
                continue
            if key in WANDB_CLOCK_KEYS:
                continue
            value = _json_value(text)
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
