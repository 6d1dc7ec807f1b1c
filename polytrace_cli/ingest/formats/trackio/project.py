"""A Trackio project file (`~/.cache/huggingface/trackio/<project>.db`, or under `TRACKIO_DIR`): SQLite.

Trackio (`trackio/sqlite_storage.py`) keeps each `trackio.log(metrics, step)` call as one row of
`metrics` (`run_id`, `run_name`, `step`, and the metrics as a JSON object, bytes or text), each run's
`trackio.init(config=...)` as one row of `configs`, and the CPU/GPU samples of `system_metrics`. The
accounting unit is the row; a rejected row is named by its table and `id`. JSON cannot hold NaN or infinities: Trackio writes them as the texts
`"NaN"`, `"Infinity"` and `"-Infinity"`, read back as numbers. Nested objects are joined with `/`;
media (`{"_type": ...}`) are not step metrics; the `train/` prefix is dropped as for TensorBoard and
wandb. Read with Python's `sqlite3` (no Trackio needed).

A `metrics` row's `timestamp` (ISO 8601 in UTC, stamped when Trackio's sender thread writes the
batch, every 0.5 s: `trackio/run.py` `BATCH_SEND_INTERVAL`) is its step's wall clock (`step_clock`).
A `system_metrics` row is one sample of `trackio.log_system` (its GPU monitor, `trackio/gpu.py`,
every `gpu_log_interval` seconds), stamped when taken: its GPUs' `gpu/<i>/utilization` (percent)
are engine samples (`engine_metrics`, `gpu_utilization` as a share, instance `gpu <i>`), read per
step window like MLflow's and wandb's system metrics; a row without one is ignored.

A project holds several runs: the first by its first row is the file's run, each other becomes a run
named `<run>-<Trackio run name>`. Within a run, a step lower than the one before starts a new segment
(a resumed run logging its steps again). The run's config gives the run meta as a wandb config does
(framework, model, n_sampling, GPUs), with `trackio_run_name`, `trackio_project` and the config itself
as `trackio_config`; without a config that names it, the keys name the framework.
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
from pathlib import Path

from polytrace_cli.lazy import polars as pl

from polytrace_cli.errors import ErrorCode, IngestError
from polytrace_cli.ingest.base import STEP_MAX, STEP_MIN, FileContext, Ingester
from polytrace_cli.ingest.formats.tensorboard.events import claim_framework, framework_of_keys, metric_key
from polytrace_cli.ingest.formats.trackio import names
from polytrace_cli.ingest.formats.wandb.run_files import detect_framework, run_meta_from_config
from polytrace_cli.ingest.registry import register
from polytrace_cli.ingest.sqlite_files import open_read_only
from polytrace_cli.ingest.step_rows import store_engine_samples, store_step_clock, store_step_rows, with_segments
from polytrace_cli.store.sql import fetch_first

SQLITE_HEADER = b"SQLite format 3\x00"
TRACKIO_COLUMNS = {"run_id", "run_name", "step", "metrics"}
SPECIAL_NUMBERS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
# A GPU's utilization in Trackio's system metrics (`trackio/gpu.py` `collect_gpu_metrics`), in percent;
# `gpu/mean_utilization` is their mean, not a GPU of its own.
SYSTEM_GPU_UTILIZATION = re.compile(r"gpu/(\d+)/utilization")
# Trackio's own entries in a config (who and when), kept out of the settings.
BOOKKEEPING = ("_Username", "_Created", "_Group")


class OutOfRange(ValueError):
    """A number in a row that a double cannot hold (`1e400`)."""


def _finite(text: str) -> float:
    number = float(text)
    if math.isinf(number):
        raise OutOfRange(f"{text} is out of range for a double")
    return number


def _decoded(blob) -> object:
    return json.loads(blob.decode("utf-8") if isinstance(blob, bytes) else blob, parse_float=_finite)


def _pairs(payload: dict, prefix: str = "") -> list[tuple[str, float | None, str | None]]:
    """(key, value, text_value) of a logged object: nested objects joined with `/`, media left out."""
    pairs = []
    for key, value in payload.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            if "_type" not in value:
                pairs += _pairs(value, f"{name}/")
        elif isinstance(value, bool):
            pairs.append((name, float(value), None))
        elif isinstance(value, (int, float)):
            pairs.append((name, float(value), None))
        elif isinstance(value, str):
            pairs.append((name, SPECIAL_NUMBERS[value], None) if value in SPECIAL_NUMBERS else (name, None, value))
        elif value is not None:
            pairs.append((name, None, json.dumps(value)))
    return pairs


def extra_run(ctx: FileContext, key: str, name: str) -> int:
    """The run holding the project's Trackio run `key` (found by its source, else created and named
    `<file's run>-<name>`)."""
    ctx.begin_writes()
    source = f"{ctx.path}#{key}"
    found = fetch_first(ctx.con, "SELECT run_id FROM runs WHERE source_dir = ?", [source])
    if found:
        return found[0]
    base = unique = f"{ctx.run_name}-{name}"
    attempt = 1
    while fetch_first(ctx.con, "SELECT 1 FROM runs WHERE name = ?", [unique]):
        attempt += 1
        unique = f"{base}-{attempt}"
    run_id = ctx.con.execute("SELECT nextval('run_id_seq')").fetchall()[0][0]
    ctx.con.execute("INSERT INTO runs (run_id, name, framework, source_dir, meta) VALUES (?, ?, NULL, ?, '{}')",
                    [run_id, unique, source])
    return run_id


def _system_rows(con: sqlite3.Connection) -> list[tuple]:
    """(id, run key, run name, timestamp, metrics) of `system_metrics`, the run keyed by `run_id` (by its
    name in files from before Trackio kept run ids there)."""
    columns = {row[1] for row in con.execute("PRAGMA table_info(system_metrics)")}
    key = "run_id" if "run_id" in columns else "run_name"
    return con.execute(f"SELECT id, {key}, run_name, timestamp, metrics FROM system_metrics ORDER BY id").fetchall()


def _seconds(timestamp: pl.Expr) -> pl.Expr:
    """Seconds since the epoch of Trackio's ISO 8601 timestamps (`datetime.now(timezone.utc).isoformat()`)."""
    return timestamp.str.to_datetime("%Y-%m-%dT%H:%M:%S%.f%:z", strict=False, time_zone="UTC").dt.epoch("us") / 1e6


@register
class TrackioProjectIngester(Ingester):
    name = "trackio-sqlite"
    version = "1"
    framework = None
    description = "Trackio project file (<project>.db: metrics, configs), read with sqlite3"
    metric_aliases = names.METRIC_ALIASES
    validation_prefixes = names.VALIDATION_PREFIXES

    def sniff(self, path: Path, head: bytes) -> bool:
        if not head.startswith(SQLITE_HEADER):
            return False
        try:
            with open_read_only(path) as con:
                tables = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                columns = {row[1] for row in con.execute("PRAGMA table_info(metrics)")} if "metrics" in tables else set()
        except sqlite3.Error:
            return False
        return "configs" in tables and TRACKIO_COLUMNS <= columns

    def load(self, ctx: FileContext) -> None:
        try:
            con = open_read_only(ctx.path)
            try:
                tables = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                metrics = con.execute("SELECT id, run_id, run_name, step, metrics, timestamp FROM metrics"
                                      " ORDER BY id").fetchall()
                configs = con.execute("SELECT id, run_id, run_name, config FROM configs ORDER BY id").fetchall()
                system = _system_rows(con) if "system_metrics" in tables else []
            finally:
                con.close()
        except sqlite3.Error as error:
            raise IngestError(f"Trackio project file cannot be read: {error}", ErrorCode.UNREADABLE_FILE) from None
        ctx.lines = len(metrics) + len(configs) + len(system)
        rows, order, clock = [], {}, []
        for line_no, run_key, run_name, step, blob, logged in metrics:
            order.setdefault(run_key, run_name)
            if not STEP_MIN <= step <= STEP_MAX:
                ctx.reject(line_no, f"metrics row {line_no}: step {step} is outside the step range", None,
                           code=ErrorCode.OUT_OF_RANGE)
                continue
            try:
                payload = _decoded(blob)
                if not isinstance(payload, dict):
                    raise ValueError("not an object")
            except OutOfRange as error:
                ctx.reject(line_no, f"metrics row {line_no}: {error}", str(blob)[:300], code=ErrorCode.OUT_OF_RANGE)
                continue
            except (ValueError, UnicodeDecodeError) as error:
                ctx.reject(line_no, f"metrics row {line_no} is not a JSON object: {error}", str(blob)[:300],
                           code=ErrorCode.INVALID_JSON)
                continue
            ctx.stored += 1
            rows += [(run_key, line_no, step, metric_key(key), value, text) for key, value, text in _pairs(payload)]
            clock.append((run_key, line_no, step, logged))
        settings = {}
        for config_id, run_key, run_name, blob in configs:
            order.setdefault(run_key, run_name)
            try:
                config = _decoded(blob)
                if not isinstance(config, dict):
                    raise ValueError("not an object")
            except (ValueError, UnicodeDecodeError) as error:
                ctx.reject(config_id, f"configs row {config_id} (run {run_name!r}) is not a JSON object: {error}",
                           str(blob)[:300], code=ErrorCode.INVALID_JSON)
                continue
            ctx.stored += 1
            settings[run_key] = {key: value for key, value in config.items() if key not in BOOKKEEPING}
        samples = self._system_samples(ctx, system, order)
        frame = pl.DataFrame(rows, schema={"run_key": pl.String, "line_no": pl.Int64, "step": pl.Int64, "key": pl.String,
                                           "value": pl.Float64, "text_value": pl.String}, orient="row")
        clock = pl.DataFrame(clock, schema={"run_key": pl.String, "line_no": pl.Int64, "step": pl.Int64,
                                            "timestamp": pl.String}, orient="row").with_columns(
            logged_at=_seconds(pl.col("timestamp")))
        for index, (run_key, run_name) in enumerate(order.items()):
            run_id = ctx.run_id if index == 0 else extra_run(ctx, run_key, run_name)
            config = settings.get(run_key, {})
            own = frame.filter(pl.col("run_key") == run_key)
            framework = detect_framework(config) or framework_of_keys(own.get_column("key").unique().to_list())
            config_meta, _ = run_meta_from_config(config, detect_framework(config))
            meta = {"trackio_run_name": run_name, "trackio_project": ctx.path.stem, "trackio_config": config,
                    **config_meta}
            if index == 0:
                claim_framework(ctx, framework)
                ctx.run_meta.update(meta)
            else:
                from polytrace_cli.ingest.ledger import claim_run_framework, merge_run_meta

                claim_run_framework(ctx.con, run_id, framework)
                merge_run_meta(ctx.con, run_id, framework, meta, ctx.file_id, again=True)
            if own.height:
                store_step_rows(ctx, with_segments(own).select("segment", "step", "key", "value", "text_value",
                                                              "line_no"), "_trackio_metrics", run_id=run_id)
                store_step_clock(ctx, with_segments(clock.filter(pl.col("run_key") == run_key)),
                                 "_trackio_clock", run_id=run_id)
            store_engine_samples(ctx, samples.filter(pl.col("run_key") == run_key), "_trackio_system", run_id=run_id)
        if len(order) > 1:
            ctx.note(f"{len(order)} Trackio runs: the first is this file's run, the others runs of their own")

    @staticmethod
    def _system_samples(ctx: FileContext, system: list[tuple], order: dict) -> pl.DataFrame:
        """The GPUs' utilizations of the `system_metrics` rows (`gpu/<i>/utilization`, percent) as engine
        samples (a share, `gpu_utilization`) on the row's clock: a row holding one is stored, a row holding
        none ignored, a row that is not a JSON object or has no time rejected."""
        samples, idle = [], 0
        for row_id, run_key, run_name, stamp, blob in system:
            try:
                payload = _decoded(blob)
                if not isinstance(payload, dict):
                    raise ValueError("not an object")
            except (ValueError, UnicodeDecodeError) as error:
                ctx.reject(row_id, f"system_metrics row {row_id} is not a JSON object: {error}", str(blob)[:300],
                           code=ErrorCode.INVALID_JSON)
                continue
            found = [(name, value) for name, value, _ in _pairs(payload) if value is not None and math.isfinite(value)
                     and SYSTEM_GPU_UTILIZATION.fullmatch(name)]
            if not found:
                idle += 1
                continue
            order.setdefault(run_key, run_name)
            ctx.stored += 1
            samples += [(run_key, row_id, stamp, f"gpu {SYSTEM_GPU_UTILIZATION.fullmatch(name).group(1)}", name,
                         value / 100.0) for name, value in found]
        ctx.ignore("system metrics row without GPU utilization", idle)
        frame = pl.DataFrame(samples, orient="row", schema={
            "run_key": pl.String, "line_no": pl.Int64, "timestamp": pl.String, "instance": pl.String,
            "name": pl.String, "value": pl.Float64})
        frame = frame.with_columns(ts=_seconds(pl.col("timestamp")), engine=pl.lit("trackio-system"),
                                   metric=pl.lit("gpu_utilization"), labels=pl.lit("{}"))
        for row_id in frame.filter(pl.col("ts").is_null()).get_column("line_no").unique().sort().to_list():
            ctx.stored -= 1
            ctx.reject(row_id, f"system_metrics row {row_id}: its timestamp is not an ISO 8601 time", None,
                       code=ErrorCode.TYPE_ERROR)
        return frame.filter(pl.col("ts").is_not_null())
