"""SwanLab's record log in an offline run folder (`swanlog/run-<time>-<id>/`): every scalar the run logged.

SwanLab writes the LevelDB-style log wandb does (32 KiB blocks of records, each behind a CRC-32,
length and piece type) behind its own 7-byte header: `:SWL`, magic 0xE1D6, and a version that says
how each record is written:

- version 1, `backup.swanlab` (SwanLab up to 0.7): one JSON object per record,
  `{"model_type": "Scalar", "data": {"key": ..., "step": ..., "metric": {"data": ...}}}`, with
  `Header`, `Project`, `Experiment`, `Column`, `Log`, `Runtime` and `Footer` records beside;
  NaN and infinities are the texts `"NaN"`, `"INF"`, `"-INF"` (`swanlab/data/...`);
- version 2, `run-<id>.swanlab` (SwanLab 0.8 on: the `swanlab.record.v1.Record` protobuf, `swanlab/proto/swanlab/record/
  v1/record.proto`): a `scalar` (key 1, step 2, value 5 holding the double `number`), `column`,
  `start` (project, name, id), `finish` (state, error), `log`, `media` or `save` record. They are
  decoded from the protobuf wire format with their field numbers, so no SwanLab package is needed.

The accounting unit is the record. Scalars become step metrics (the `train/` prefix dropped as for
TensorBoard and wandb); those of SwanLab's own system monitor (columns of the SYSTEM class, keys
`__swanlab__.*`, timed by the clock, not by steps) and every other record are ignored under a named
rule. The run's project, name, id, tags and how it finished go to the run meta (`swanlab_*`). A step
lower than the scalar's previous one starts a new segment. A record whose CRC does not match, or a
cut tail, ends the readable part: the records before are kept and the damage is rejected as one
record with its byte offset; a record that does not decode is rejected alone.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from polytrace_cli.lazy import polars as pl

from polytrace_cli.errors import ErrorCode, IngestError
from polytrace_cli.ingest.base import STEP_MAX, STEP_MIN, FileContext, Ingester
from polytrace_cli.ingest.formats.swanlab import names
from polytrace_cli.ingest.formats.tensorboard.events import claim_framework, framework_of_keys, metric_key
from polytrace_cli.ingest.formats.wandb.offline import FILE_HEADER, read_records
from polytrace_cli.ingest.registry import register
from polytrace_cli.ingest.step_rows import store_step_rows

IDENT, MAGIC = b":SWL", 0xE1D6
SYSTEM_PREFIX = "__swanlab__"
SPECIAL_NUMBERS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "infinity": math.inf, "-infinity": -math.inf}
# Record fields of `swanlab.record.v1.Record` (version 2) and of the messages inside.
RECORD_TYPES = {10: "start", 11: "finish", 12: "column", 13: "scalar", 14: "media", 16: "log", 20: "save"}
RUN_STATES = {0: "running", 1: "finished", 2: "crashed", 3: "aborted"}
COLUMN_CLASS_SYSTEM = 2


def wire_fields(data: bytes) -> list[tuple[int, int | float | bytes]]:
    """The (field number, value) pairs of one protobuf message: varints as ints, 64-bit fields as
    doubles, length-delimited fields as bytes (32-bit fields as their raw int). Raises ValueError
    when the bytes are not a message."""
    fields, offset, end = [], 0, len(data)

    def varint() -> int:
        nonlocal offset
        shift = result = 0
        while True:
            if offset >= end or shift > 63:
                raise ValueError("truncated varint")
            byte = data[offset]
            offset += 1
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                return result
            shift += 7

    while offset < end:
        tag = varint()
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            fields.append((number, varint()))
        elif wire == 1:
            if offset + 8 > end:
                raise ValueError("truncated 64-bit field")
            fields.append((number, struct.unpack_from("<d", data, offset)[0]))
            offset += 8
        elif wire == 2:
            length = varint()
            if offset + length > end:
                raise ValueError("truncated length-delimited field")
            fields.append((number, data[offset:offset + length]))
            offset += length
        elif wire == 5:
            if offset + 4 > end:
                raise ValueError("truncated 32-bit field")
            fields.append((number, struct.unpack_from("<I", data, offset)[0]))
            offset += 4
        else:
            raise ValueError(f"wire type {wire}")
        if number == 0:
            raise ValueError("field number 0")
    return fields


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _text(value) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _number(value) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        return SPECIAL_NUMBERS.get(value.strip().lower())
    return None


class _Run:
    """What a record log says, record by record: scalars (record number, key, step, value), system
    keys, run facts, and the records ignored by rule."""

    def __init__(self, ctx: FileContext):
        self.ctx = ctx
        self.scalars: list[tuple[int, str, int, float]] = []
        self.system: set[str] = set()
        self.meta: dict = {}

    def scalar(self, record_no: int, key: str, step: int, value: float | None) -> None:
        if key in self.system or key.startswith(SYSTEM_PREFIX):
            self.ctx.ignore("system monitor scalar")
        elif not STEP_MIN <= step <= STEP_MAX:
            self.ctx.reject(record_no, f"record {record_no}: step {step} is outside the step range", None,
                            code=ErrorCode.OUT_OF_RANGE)
        elif value is None:
            self.ctx.reject(record_no, f"record {record_no}: scalar {key!r} holds no number", None, code=ErrorCode.TYPE_ERROR)
        else:
            self.scalars.append((record_no, metric_key(key), step, value))
            self.ctx.stored += 1

    def json_record(self, record_no: int, body: bytes) -> None:
        """A version-1 record."""
        record = json.loads(body)
        kind, data = record.get("model_type"), record.get("data") or {}
        if kind == "Scalar":
            metric = data.get("metric") or {}
            self.scalar(record_no, str(data["key"]), int(data["step"]), _number(metric.get("data")))
            return
        if kind == "Column" and data.get("cls") == "SYSTEM":
            self.system.add(str(data.get("key")))
        elif kind == "Project":
            self.meta["swanlab_project"] = data.get("name")
        elif kind == "Experiment":
            self.meta.update({"swanlab_run_name": data.get("name"), "swanlab_run_id": data.get("id"),
                              "swanlab_tags": data.get("tags") or []})
        elif kind == "Footer":
            self.meta["swanlab_state"] = "finished" if data.get("success") else "crashed"
        self.ctx.ignore(f"{kind or 'untyped'} record")

    def proto_record(self, record_no: int, body: bytes) -> None:
        """A version-2 record (`swanlab.record.v1.Record`)."""
        kinds = [(number, value) for number, value in wire_fields(body) if number in RECORD_TYPES]
        if not kinds:
            self.ctx.ignore("untyped record")
            return
        number, payload = kinds[-1]
        kind = RECORD_TYPES[number]
        fields = wire_fields(payload) if isinstance(payload, bytes) else []
        if kind == "scalar":
            values = dict(fields)
            inner = dict(wire_fields(values[5])) if isinstance(values.get(5), bytes) else {}
            number = inner.get(1, 0.0)
            self.scalar(record_no, _text(values.get(1, b"")), _signed(values.get(2, 0)),
                        number if isinstance(number, float) else None)
            return
        values = dict(fields)
        if kind == "column" and values.get(1) == COLUMN_CLASS_SYSTEM:
            self.system.add(_text(values.get(3, b"")))
        elif kind == "start":
            self.meta.update({"swanlab_project": _text(values.get(1, b"")), "swanlab_run_name": _text(values.get(4, b"")),
                              "swanlab_run_id": _text(values.get(10, b"")),
                              "swanlab_tags": [_text(value) for field, value in fields if field == 6]})
        elif kind == "finish":
            self.meta["swanlab_state"] = RUN_STATES.get(values.get(1, 0), "unknown")
            if values.get(2):
                self.meta["swanlab_error"] = _text(values[2])[:300]
        self.ctx.ignore(f"{kind} record")


@register
class SwanlabRecordsIngester(Ingester):
    name = "swanlab-records"
    version = "1"
    framework = None
    description = "SwanLab offline run record log (swanlog/run-*/run-<id>.swanlab, backup.swanlab): scalars, run"
    metric_aliases = names.METRIC_ALIASES
    validation_prefixes = names.VALIDATION_PREFIXES

    def sniff(self, path: Path, head: bytes) -> bool:
        return path.suffix == ".swanlab" and head.startswith(IDENT)

    def load(self, ctx: FileContext) -> None:
        data = ctx.path.read_bytes()
        if len(data) < FILE_HEADER.size:
            raise IngestError("SwanLab record log shorter than its header", ErrorCode.CORRUPT_FILE)
        ident, magic, version = FILE_HEADER.unpack_from(data)
        if (ident, magic) != (IDENT, MAGIC) or version not in (1, 2):
            raise IngestError(f"not a SwanLab record log this version reads (header {ident!r}, version {version})",
                              ErrorCode.CORRUPT_FILE)
        records, damaged_at = read_records(data, (IDENT, MAGIC, version), "SwanLab")
        run = _Run(ctx)
        read = run.json_record if version == 1 else run.proto_record
        for record_no, body in enumerate(records, start=1):
            try:
                read(record_no, body)
            except (ValueError, KeyError, TypeError, AttributeError) as error:
                ctx.reject(record_no, f"record {record_no} does not decode: {error}", body[:300], code=ErrorCode.CORRUPT_FILE)
        ctx.lines = len(records)
        if damaged_at is not None:
            ctx.lines += 1
            ctx.reject(len(records) + 1, f"record log damaged at byte {damaged_at} of {len(data)}: a truncated or"
                       " corrupt record; the records before it are kept", None, code=ErrorCode.CORRUPT_FILE)
            ctx.note(f"damaged at byte {damaged_at}; {len(records)} records kept")
        frame = pl.DataFrame(run.scalars, schema={"line_no": pl.Int64, "key": pl.String, "step": pl.Int64,
                                                  "value": pl.Float64}, orient="row")
        back = (pl.col("step") < pl.col("step").shift(1).over("key")).fill_null(False).cast(pl.Int32)
        frame = frame.with_columns(segment=back.cum_sum().over("key"), text_value=pl.lit(None, pl.String))
        ctx.run_meta.update({"swanlab_record_version": version, **run.meta})
        claim_framework(ctx, framework_of_keys(frame.get_column("key").unique().to_list()))
        store_step_rows(ctx, frame.select("segment", "step", "key", "value", "text_value", "line_no"), "_swanlab_scalars")
