"""TensorBoard event files (`events.out.tfevents.*`): the scalars a trainer logged per step.

Read with the `tensorboard` package's record reader (an optional dependency:
`pip install polytrace[tensorboard]`); without it the file is rejected with a one-line reason.
The accounting unit is the event record: `lines` counts records read.

Scalars come in two encodings and both are read: `simple_value` (TF1 and tensorboardX/PyTorch
writers) and a one-element tensor (TF2 and newer writers). Other summaries (histograms, images,
text) and header/graph events are ignored under named rules.

Tags map to keys as in the trainers' other logs: verl's tags are its metric keys; the `train/`
prefix of OpenRLHF and of TRL (the transformers Trainer) is removed and `eval/` kept (so
`train/policy_loss` -> `policy_loss`, `train/completions/mean_length` -> `completions/mean_length`).
A TRL run's cumulative `num_tokens` also gives `num_tokens/per_step` (`trl.tokens_per_step`).

Records are read with polytrace's own TFRecord reader (`scan_events`; the CRC-32C is tensorboard's).
A record that cannot be read (a truncated write, a CRC mismatch, a length past the end of the file)
is one damaged span, rejected as one record with its byte range; reading resyncs at the next whole
record, so the records before and after are kept. A record holding a malformed tensor is rejected
alone. A step lower than the previous event's starts a new segment.

NeMo-RL's GPU monitor (`ray/node.<n>.gpu.<i>.util`, ...; `formats/nemo_rl/gpu_monitor.py`) logs its
samples with a time for a step: they are engine samples on the wall clock, not steps, and its step
metric is ignored.
"""

from __future__ import annotations

import functools
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from polytrace_cli.lazy import polars as pl

from polytrace_cli.errors import ErrorCode, IngestError
from polytrace_cli.ingest.formats.trl import logged as trl
from polytrace_cli.ingest.arrow import ArrowStream
from polytrace_cli.ingest.base import STEP_MAX, STEP_MIN, FileContext, Ingester
from polytrace_cli.ingest.registry import register
from polytrace_cli.ingest.formats.nemo_rl import gpu_monitor
from polytrace_cli.ingest.step_rows import store_engine_samples, store_step_clock

EXTRA_HINT = "reading TensorBoard event files needs the tensorboard package: pip install 'polytrace[tensorboard]'"
RECORD_OVERHEAD_BYTES = 16  # length (8) + length CRC (4) + data CRC (4) around each record
LENGTH = struct.Struct("<QI")
CRC = struct.Struct("<I")


@dataclass(frozen=True)
class EventDamage:
    """Bytes start..end of an event file that hold no readable record."""

    start: int
    end: int
    why: str


def _masked_crc32c(data: bytes) -> int:
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    return masked_crc32c(data)


@functools.lru_cache(maxsize=4096)
def _length_crc(length_bytes: bytes) -> int:
    # Cached: resyncing through a zero-filled or repeating span asks for the same few lengths.
    return _masked_crc32c(length_bytes)


def _record_at(data: bytes, offset: int) -> tuple[bytes | None, str]:
    """(the data of the record at `offset`, '') when a whole record with both CRCs right starts
    there, else (None, why not)."""
    if offset + LENGTH.size > len(data):
        return None, "the file is cut short"
    length, length_crc = LENGTH.unpack_from(data, offset)
    if _length_crc(bytes(data[offset:offset + 8])) != length_crc:
        return None, "a record length whose CRC does not match"
    end = offset + LENGTH.size + length
    if end + CRC.size > len(data):
        return None, f"a record length of {length} bytes running past the end of the file"
    body = data[offset + LENGTH.size:end]
    if _masked_crc32c(body) != CRC.unpack_from(data, end)[0]:
        return None, "a record whose data CRC does not match"
    return body, ""


def scan_events(data: bytes) -> list[bytes | EventDamage]:
    """The records of a TFRecord event file (each `length` uint64, masked CRC-32C of the length,
    data, masked CRC-32C of the data) and the damaged spans between them. After damage, reading
    resyncs at the next offset where a whole record with both CRCs right starts (the length's CRC
    makes a false start unlikely); with none, the damage runs to the end of the file."""
    units: list[bytes | EventDamage] = []
    offset = 0
    while offset < len(data):
        body, why = _record_at(data, offset)
        if body is not None:
            units.append(body)
            offset += len(body) + RECORD_OVERHEAD_BYTES
            continue
        resync = _next_record(data, offset + 1)
        units.append(EventDamage(offset, resync, why))
        offset = resync
    return units


def _next_record(data: bytes, start: int) -> int:
    """The first offset from `start` where a whole record starts, or the file's size."""
    last = len(data) - RECORD_OVERHEAD_BYTES
    offset = start
    while offset <= last:
        if data[offset:offset + 12] == _ZERO_HEADER:
            # Twelve zero bytes are no record start (the masked CRC of a zero length is not zero): a
            # zero-filled span is passed at once, up to where its last 11 bytes could begin one.
            nonzero = _NONZERO.search(data, offset)
            offset = max(offset + 1, (nonzero.start() if nonzero else len(data)) - 11)
            continue
        length = int.from_bytes(data[offset:offset + 8], "little")
        if length <= last - offset and _record_at(data, offset)[0] is not None:
            return offset
        offset += 1
    return len(data)


_ZERO_HEADER = bytes(12)
_NONZERO = re.compile(rb"[^\x00]")


def metric_key(tag: str) -> str:
    """The store key for a TensorBoard tag or wandb key: OpenRLHF's `train/` prefix is dropped."""
    return tag[len("train/"):] if tag.startswith("train/") else tag


def framework_of_keys(keys) -> str | None:
    """'trl', 'nemo_rl', 'areal', 'slime', 'skyrl', 'roll', 'openrlhf' or 'verl' when the raw (unmapped)
    keys say so, else None. NeMo-RL times its steps under `timing/train/`, AReaL under `timeperf/`;
    slime's `perf/` keys name its own timers (verl's `perf/` holds throughput and memory)."""
    keys = list(keys)
    if trl.is_trl(keys):
        return "trl"
    if any(k.startswith("timing/train/") for k in keys):
        return "nemo_rl"
    if any(k.startswith("timeperf/") for k in keys):
        return "areal"
    if any(k in ("perf/train_wait_time", "perf/rollout_time", "perf/total_train_time", "rollout/step") for k in keys):
        return "slime"
    if any(k in ("timing/fwd_logprobs_values_reward", "timing/train_critic_and_policy", "generate/avg_num_tokens")
           for k in keys):
        return "skyrl"
    if any(k in ("time/step_generate", "time/step_train", "time/step_model_update") for k in keys):
        return "roll"
    if any(k.startswith(("timing_s/", "actor/", "critic/", "val-core/", "perf/")) for k in keys):
        return "verl"
    if any(k.startswith("train/") or k in ("policy_loss", "actor_lr") for k in keys):
        return "openrlhf"
    return None


def claim_framework(ctx: FileContext, framework: str | None) -> None:
    """Set the run's framework from this file's content when no file has set it yet."""
    if framework:
        from polytrace_cli.ingest.ledger import claim_run_framework

        ctx.begin_writes()
        claim_run_framework(ctx.con, ctx.run_id, framework)


def _scalar_of(value, tensor_util) -> float | None:
    kind = value.WhichOneof("value")
    if kind == "simple_value":
        return float(value.simple_value)
    if kind == "tensor":
        array = tensor_util.make_ndarray(value.tensor)
        if array.size == 1 and array.dtype.kind in "fiub":
            return float(array.reshape(()))
    return None


@register
class TensorBoardEventsIngester(Ingester):
    name = "tensorboard-events"
    version = "3"
    framework = None
    description = "TensorBoard event file (events.out.tfevents.*): scalar summaries, simple or tensor"

    def sniff(self, path: Path, head: bytes) -> bool:
        return "tfevents" in path.name

    def load(self, ctx: FileContext) -> None:
        try:
            from google.protobuf.message import DecodeError
            from tensorboard.compat.proto import event_pb2
            from tensorboard.util import tensor_util
        except ImportError:
            raise IngestError(EXTRA_HINT, ErrorCode.UNREADABLE_FILE) from None
        data = ctx.path.read_bytes()
        steps: list[int] = []
        tags: list[str] = []
        values: list[float] = []
        record_nos: list[int] = []
        wall_times: list[float] = []
        units = scan_events(data)
        records = 0
        for record_no, unit in enumerate(units, start=1):
            if isinstance(unit, EventDamage):
                ctx.reject(record_no, f"event file damaged after {records} readable records: bytes {unit.start} to"
                           f" {unit.end} of {len(data)} hold no readable record ({unit.why}); the records before"
                           " and after them are kept", code=ErrorCode.CORRUPT_FILE)
                ctx.note(f"damaged at bytes {unit.start}-{unit.end} of {len(data)}")
                continue
            records += 1
            try:
                event = event_pb2.Event.FromString(unit)
            except (DecodeError, RecursionError, ValueError):
                ctx.reject(record_no, "event record is not a valid Event protobuf", None, code=ErrorCode.UNPARSABLE_LINE)
                continue
            kind = event.WhichOneof("what")
            if kind == "summary" and not STEP_MIN <= event.step <= STEP_MAX:
                ctx.reject(record_no, f"step {event.step} is outside the step range", None, code=ErrorCode.OUT_OF_RANGE)
                continue
            if kind != "summary":
                ctx.ignore("file header" if kind == "file_version" else f"{kind or 'empty'} event")
                continue
            try:
                scalars = [(value.tag, scalar) for value in event.summary.value
                           if (scalar := _scalar_of(value, tensor_util)) is not None]
            except Exception as error:  # tensor_util raises ValueError, TypeError, ... on a malformed tensor
                ctx.reject(record_no, f"event record holds a malformed tensor: {type(error).__name__}", None,
                           code=ErrorCode.UNPARSABLE_LINE)
                continue
            if scalars and all(tag in gpu_monitor.MONITOR_STEP_KEYS for tag, _ in scalars):
                ctx.ignore(gpu_monitor.STEP_RULE)
                continue
            for tag, scalar in scalars:
                steps.append(event.step)
                tags.append(tag)
                values.append(scalar)
                record_nos.append(record_no)
                wall_times.append(event.wall_time)
            if scalars:
                ctx.stored += 1
            else:
                ctx.ignore("non-scalar summary")
        ctx.lines = len(units)
        self._store(ctx, steps, tags, values, record_nos, wall_times)

    @staticmethod
    def _store(ctx: FileContext, steps, tags, values, record_nos, wall_times) -> None:
        frame = pl.DataFrame(
            {"step": steps, "tag": tags, "value": values, "line_no": record_nos, "wall_time": wall_times},
            schema={"step": pl.Int64, "tag": pl.String, "value": pl.Float64, "line_no": pl.Int64,
                    "wall_time": pl.Float64},
        )
        monitor = gpu_monitor.is_monitor_key(pl.col("tag"))
        samples = frame.filter(monitor).select("line_no", "step", "value", key="tag", logged_at="wall_time")
        if samples.height:
            store_engine_samples(ctx, gpu_monitor.monitor_samples(samples), "_tensorboard_gpu_monitor")
        frame = frame.filter(~monitor).with_columns(
            key=pl.when(pl.col("tag").str.starts_with("train/"))
            .then(pl.col("tag").str.strip_prefix("train/")).otherwise(pl.col("tag")),
            segment=(pl.col("step") < pl.col("step").shift(1)).fill_null(False).cum_sum().cast(pl.Int32),
        )
        if frame.height == 0:
            ctx.note("no step scalars in this event file" if samples.height else "no scalar summaries in this event file")
            return
        framework = framework_of_keys(frame["tag"].unique().to_list())
        claim_framework(ctx, framework)
        if framework == "trl":
            frame = trl.shadow_old_mean_length(frame, ["segment", "step"])
            derived = trl.tokens_per_step(frame.select("segment", "step", "key", "value", "line_no"), "segment")
            timed = trl.wall_time_step_seconds(frame)
            covered = trl.steps_covered_rows(frame, "segment")
            if timed.height:
                ctx.note(f"no step_time logged: {timed.height} step time(s) from the events' wall time "
                         f"({trl.WALL_TIME_STEP_S})")
            frame = pl.concat([frame, derived.with_columns(tag=pl.col("key"), wall_time=None).select(frame.columns),
                               timed.with_columns(tag=pl.col("key"), wall_time=None).select(frame.columns),
                               covered.with_columns(tag=pl.col("key"), wall_time=None).select(frame.columns)],
                              how="vertical_relaxed")
        ctx.con.register("_tensorboard_scalars", ArrowStream(frame))
        try:
            ctx.insert(
                "INSERT INTO step_metrics (run_id, segment, step, key, value, file_id, line_no)"
                " SELECT ?, segment, step, key, value, ?, line_no"
                " FROM _tensorboard_scalars",
                [ctx.run_id, ctx.file_id],
            )
        finally:
            ctx.con.unregister("_tensorboard_scalars")
        store_step_clock(ctx, frame.rename({"wall_time": "logged_at"}), "_tensorboard_clock")
        if frame["segment"].max():
            ctx.note(f"step went backwards {frame['segment'].max()} time(s): stored as separate segments")

