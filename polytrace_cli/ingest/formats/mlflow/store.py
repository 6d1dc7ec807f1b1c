"""MLflow local stores (verl's `mlflow` tracking backend, the transformers MLflow callback): the
`mlruns/` file store and the SQLite store (`mlflow.db`, MLflow 3's default), read without MLflow.

**File store** (`mlruns/<experiment>/<run>/`): one file per metric under `metrics/`, named by the
metric key (a key with '/' is a nested path: `metrics/timing_s/gen`), one line per logged value,
`timestamp value step` (milliseconds since the epoch; the value as Python prints a float, `nan`
included; the step). One file per parameter under `params/` and per tag under `tags/`, holding the
value; the run's `meta.yaml` (run name, status, start and end times). Every file of a run folder
belongs to the run (`ledger.derive_run`). A metric line is stored or rejected; a parameter or tag
file is one entry, stored into the run meta (`mlflow_params`, `mlflow_tags`).

**SQLite store**: tables `runs`, `metrics` (key, value, timestamp, run_uuid, step, is_nan: a NaN is
stored as 0 with is_nan = 1), `params` and `tags`, read with Python's `sqlite3`. The accounting unit
is the table row. The first run (by start time) is the file's run; every other run of the store
becomes a run of its own named `<run>-<MLflow run name>`. Rows of deleted runs are ignored.

In both, a key's step lower than its previous value (in time order) starts a new segment (a run
resumed and logging its steps again), and TRL's cumulative `num_tokens` gives
`num_tokens/per_step`. verl writes `@` in keys as `_at_`, since MLflow refuses '@'. Each step's
latest timestamp is its wall clock (`step_clock`). MLflow's system metrics (`system/...`, its step a
sample count, not a training step) go to `engine_metrics`: a GPU's utilization as `gpu_utilization`;
so do NeMo-RL's GPU monitor's (`ray/node.<n>.gpu.<i>.util`, its step a time: `nemo_rl/gpu_monitor.py`).
"""

from __future__ import annotations

import json
import re
import sqlite3
from contextlib import closing
from pathlib import Path

from polytrace_cli.lazy import polars as pl

from polytrace_cli.errors import ErrorCode, IngestError
from polytrace_cli.ingest.formats.trl import logged as trl
from polytrace_cli.ingest.base import STEP_MAX, STEP_MIN, FileContext, Ingester
from polytrace_cli.ingest.formats.nemo_rl import gpu_monitor
from polytrace_cli.ingest.formats.tensorboard.events import claim_framework, framework_of_keys
from polytrace_cli.ingest.formats.wandb.run_files import detect_framework, run_meta_from_config
from polytrace_cli.ingest.registry import register
from polytrace_cli.ingest.sqlite_files import open_read_only
from polytrace_cli.ingest.step_rows import store_engine_samples, store_step_clock, store_step_rows
from polytrace_cli.store.sql import fetch_first

METRIC_LINE = r"^\s*(-?\d+)\s+(\S+)\s+(-?\d+)\s*$"
SQLITE_HEADER = b"SQLite format 3\x00"
MLFLOW_TABLES = {"runs", "metrics", "params", "tags"}
# MLflow's system metrics (`mlflow.system_metrics`): logged with this prefix, on the wall clock.
SYSTEM_PREFIX = "system/"
SYSTEM_GPU_UTILIZATION = r"^system/(?:(node_[^/]+)/)?gpu_(\d+)_utilization_percentage$"
# The metrics rows with each column's SQLite storage class: MLflow declares value a double, step and
# timestamp BIGINT, but a SQLite column holds whatever was written into it (text, a fraction, ±inf).
METRIC_ROWS = """
    SELECT rowid, run_uuid, CAST(key AS TEXT),
           CASE WHEN typeof(value) IN ('real', 'integer') THEN CAST(value AS REAL) END, typeof(value),
           CASE WHEN typeof(timestamp) = 'integer' THEN timestamp END,
           CASE WHEN typeof(step) = 'integer' THEN step END,
           CASE WHEN typeof(step) = 'real' THEN step END, typeof(step), CASE WHEN is_nan = 1 THEN 1 ELSE 0 END
    FROM metrics"""


def _metric_schema() -> dict:
    """The polars schema of the METRIC_ROWS columns."""
    return {"line_no": pl.Int64, "run_uuid": pl.String, "key": pl.String, "value": pl.Float64,
            "value_type": pl.String, "timestamp": pl.Int64, "step": pl.Int64, "step_real": pl.Float64,
            "step_type": pl.String, "is_nan": pl.Int64}


def _connect_read_only(path: Path) -> sqlite3.Connection:
    """A read-only sqlite3 connection to the file `path` (`open_read_only`). Text that is not UTF-8 reads
    with replacement characters."""
    con = open_read_only(path)
    con.text_factory = lambda data: data.decode("utf-8", errors="replace")
    return con


def _metric_row_problem() -> pl.Expr:
    """`problem` (reason, code) of a metrics row that cannot be stored, null for a good row: a step that
    is not a whole number or outside the step range, a value that is not a number (NaN is written as
    is_nan = 1, ±inf as ±max double by MLflow), a missing key."""
    def problem(reason: str, code: ErrorCode) -> pl.Expr:
        return pl.struct(reason=pl.lit(reason), code=pl.lit(code))

    step, value = pl.col("step"), pl.col("value")
    return (pl.when(pl.col("step_type") == "null").then(problem("metrics row has no step", ErrorCode.MISSING_FIELD))
            .when(pl.col("step_real").is_not_null()).then(problem("metrics row step {step} is not a whole number",
                                                                  ErrorCode.TYPE_ERROR))
            .when(step.is_null()).then(problem("metrics row step is {type}, not an integer", ErrorCode.TYPE_ERROR))
            .when(~step.is_between(STEP_MIN, STEP_MAX)).then(problem("metrics row step {step} is outside the step"
                                                                     " range", ErrorCode.OUT_OF_RANGE))
            .when(pl.col("key").is_null()).then(problem("metrics row has no key", ErrorCode.MISSING_FIELD))
            .when((pl.col("is_nan") == 0) & (pl.col("value_type") == "null")).then(
                problem("metrics row has no value", ErrorCode.MISSING_FIELD))
            .when((pl.col("is_nan") == 0) & value.is_null()).then(
                problem("metrics row value is {type}, not a number", ErrorCode.TYPE_ERROR))
            .when((pl.col("is_nan") == 0) & value.is_infinite()).then(
                problem("metrics row value {value} is beyond a double (MLflow writes no infinity)", ErrorCode.OUT_OF_RANGE))
            .otherwise(None).alias("problem"))


def run_folder_part(path: Path) -> tuple[Path, str, str] | None:
    """(run folder, part, key) when `path` lies under `<run>/metrics|params|tags/` of an MLflow
    file-store run (the run folder holds `meta.yaml`); the key is the path below the part."""
    for parent in path.parents:
        if parent.name in ("metrics", "params", "tags") and (parent.parent / "meta.yaml").is_file():
            return parent.parent, parent.name, path.relative_to(parent).as_posix()
    return None


def system_samples(rows: pl.DataFrame) -> pl.DataFrame:
    """MLflow's system metrics (`system/[node_<n>/]<name>`, logged on the wall clock, their step a sample
    count) as engine samples: a GPU's `gpu_<i>_utilization_percentage` as `gpu_utilization` (a share),
    every other series under its own name."""
    gpu = pl.col("key").str.extract(SYSTEM_GPU_UTILIZATION, 2)
    node = pl.col("key").str.extract(SYSTEM_GPU_UTILIZATION, 1)
    return rows.select(
        "line_no", ts=pl.col("timestamp") / 1000.0, engine=pl.lit("mlflow-system"),
        instance=pl.when(gpu.is_not_null()).then(pl.concat_str(pl.coalesce(node + pl.lit(" "), pl.lit("")),
                                                               pl.lit("gpu "), gpu)),
        name="key", metric=pl.when(gpu.is_not_null()).then(pl.lit("gpu_utilization")),
        labels=pl.lit("{}"), value=pl.when(gpu.is_not_null()).then(pl.col("value") / 100.0).otherwise(pl.col("value")),
    )


def _segments(frame: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """`frame` (..., step, timestamp, order) with `segment`: within `by`, in time order, a step
    lower than the one before starts a new segment."""
    frame = frame.sort([*by, "timestamp", "line_no"])
    back = (pl.col("step") < pl.col("step").shift(1).over(by)).fill_null(False).cast(pl.Int32)
    return frame.with_columns(segment=back.cum_sum().over(by))


def _with_tokens(frame: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """`frame` plus TRL's `num_tokens/per_step` rows when it holds `num_tokens`."""
    if trl.CUMULATIVE_TOKENS not in frame.get_column("key").unique().to_list():
        return frame
    group = pl.concat_str([pl.col(c).cast(pl.String) for c in [*by, "segment"]], separator="\x1f")
    derived = trl.tokens_per_step(frame.filter(pl.col("value").is_not_null()).with_columns(group=group))
    extra = frame.join(derived.select("line_no", "key", derived_value="value"), on="line_no") \
        .with_columns(key=pl.lit(trl.PER_STEP_TOKENS), value=pl.col("derived_value")).select(frame.columns)
    return pl.concat([frame, extra])


@register
class MlflowMetricIngester(Ingester):
    name = "mlflow-metric"
    version = "1"
    framework = None
    description = "MLflow file store metric file (mlruns/<exp>/<run>/metrics/<key>: timestamp value step)"

    def sniff(self, path: Path, head: bytes) -> bool:
        found = run_folder_part(path)
        return found is not None and found[1] == "metrics"

    def load(self, ctx: FileContext) -> None:
        _, _, key = run_folder_part(ctx.location)
        text = ctx.path.read_text(encoding="utf-8", errors="replace")
        lines = pl.DataFrame({"raw": text.split("\n")}).with_row_index("line_no", offset=1) \
            .with_columns(pl.col("line_no").cast(pl.Int64))
        if text.endswith("\n"):
            lines = lines.head(lines.height - 1)
        ctx.lines = lines.height
        parsed = lines.with_columns(
            timestamp=pl.col("raw").str.extract(METRIC_LINE, 1).cast(pl.Int64, strict=False),
            value_text=pl.col("raw").str.extract(METRIC_LINE, 2),
            step=pl.col("raw").str.extract(METRIC_LINE, 3).cast(pl.Int64, strict=False),
        ).with_columns(value=pl.col("value_text").cast(pl.Float64, strict=False))
        good = (pl.col("timestamp").is_not_null() & pl.col("step").is_between(STEP_MIN, STEP_MAX)
                & pl.col("value").is_not_null()
                & (pl.col("value").is_finite() | pl.col("value_text").str.contains("(?i)nan|inf")))
        blank = pl.col("raw").str.strip_chars() == ""
        ctx.ignore("blank line", parsed.filter(blank).height)
        for line_no, raw, step in parsed.filter(~good & ~blank).select("line_no", "raw", "step").iter_rows():
            ctx.reject(line_no, "not an MLflow metric line `timestamp value step`", raw,
                       code=ErrorCode.OUT_OF_RANGE if step is not None and not STEP_MIN <= step <= STEP_MAX else ErrorCode.UNPARSABLE_LINE)
        rows = parsed.filter(good).select("line_no", "step", "timestamp", "value",
                                          key=pl.lit(key), text_value=pl.lit(None, pl.String))
        ctx.stored = rows.height
        if key.startswith(SYSTEM_PREFIX):
            store_engine_samples(ctx, system_samples(rows), "_mlflow_system")
            return
        if key in gpu_monitor.MONITOR_STEP_KEYS:
            ctx.stored = 0
            ctx.ignore(gpu_monitor.STEP_RULE, rows.height)
            return
        if re.match(gpu_monitor.MONITOR_SERIES, key):
            store_engine_samples(ctx, gpu_monitor.monitor_samples(
                rows.with_columns(logged_at=pl.col("timestamp") / 1000.0)), "_mlflow_gpu_monitor")
            return
        rows = _with_tokens(_segments(rows, ["key"]), ["key"])
        claim_framework(ctx, framework_of_keys([key]))
        store_step_rows(ctx, rows.select("segment", "step", "key", "value", "text_value", "line_no"), "_mlflow_metric")
        store_step_clock(ctx, rows.with_columns(logged_at=pl.col("timestamp") / 1000.0), "_mlflow_metric_clock")


@register
class MlflowRunFileIngester(Ingester):
    name = "mlflow-run-file"
    version = "1"
    framework = None
    description = "MLflow file store run meta.yaml, params/ and tags/ files: run meta"

    def sniff(self, path: Path, head: bytes) -> bool:
        found = run_folder_part(path)
        if found is not None:
            return found[1] in ("params", "tags")
        return path.name == "meta.yaml" and b"run_id:" in head and b"experiment_id:" in head

    def load(self, ctx: FileContext) -> None:
        ctx.lines = 1
        ctx.stored = 1
        found = run_folder_part(ctx.location)
        if found is None:
            import yaml

            try:
                document = yaml.safe_load(ctx.path.read_text(encoding="utf-8", errors="replace"))
            except yaml.YAMLError:
                raise IngestError("meta.yaml is not valid YAML", ErrorCode.UNPARSABLE_LINE) from None
            if not isinstance(document, dict):
                raise IngestError("meta.yaml does not hold a mapping", ErrorCode.NOT_AN_OBJECT)
            ctx.run_meta.update({"mlflow_run_name": document.get("run_name"), "mlflow_run_id": document.get("run_id"),
                                 "mlflow_experiment_id": document.get("experiment_id"),
                                 "mlflow_start_time_ms": document.get("start_time"),
                                 "mlflow_end_time_ms": document.get("end_time")})
            return
        _, part, key = found
        value = ctx.path.read_text(encoding="utf-8", errors="replace")
        field = f"mlflow_{part}"
        current = fetch_first(ctx.con, "SELECT meta FROM runs WHERE run_id = ?", [ctx.run_id])
        merged = json.loads((current[0] if current else None) or "{}").get(field, {})
        merged[key] = value
        ctx.run_meta[field] = merged
        if part == "params":
            framework = detect_framework(_nested(merged))
            meta, _ = run_meta_from_config(_nested(merged), framework)
            ctx.run_meta.update(meta)
            claim_framework(ctx, framework)


def _nested(params: dict) -> dict:
    """Flat parameter names (`a.b.c` or `a/b/c`, as verl logs its config) as a nested config, values
    read as JSON where they are (`8` -> 8)."""
    config: dict = {}
    for name, text in params.items():
        parts = re.split(r"[./]", name)
        node = config
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                break
        else:
            try:
                node[parts[-1]] = json.loads(text)
            except ValueError:
                node[parts[-1]] = text
    return config


@register
class MlflowSqliteIngester(Ingester):
    name = "mlflow-sqlite"
    version = "1"
    framework = None
    description = "MLflow SQLite store (mlflow.db: runs, metrics, params, tags), read with sqlite3"

    def sniff(self, path: Path, head: bytes) -> bool:
        if not head.startswith(SQLITE_HEADER):
            return False
        try:
            with closing(_connect_read_only(path)) as con:
                tables = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.Error:
            return True  # a damaged SQLite file: `load` says why it cannot be read, rather than skip it
        return MLFLOW_TABLES <= tables or path.name == "mlflow.db"  # so named, a file without them is damaged

    def load(self, ctx: FileContext) -> None:
        try:
            with closing(_connect_read_only(ctx.path)) as con:
                tables = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                if not MLFLOW_TABLES <= tables:
                    raise IngestError(f"SQLite database without MLflow's tables ({', '.join(sorted(MLFLOW_TABLES - tables))}"
                                      " missing)", ErrorCode.MISSING_FIELD)
                runs = con.execute("SELECT run_uuid, name, status, start_time, end_time, lifecycle_stage,"
                                   " experiment_id FROM runs ORDER BY start_time, run_uuid").fetchall()
                metrics = con.execute(METRIC_ROWS).fetchall()
                params = con.execute("SELECT run_uuid, key, CAST(value AS TEXT) FROM params").fetchall()
                tags = con.execute("SELECT run_uuid, key, CAST(value AS TEXT) FROM tags").fetchall()
        except sqlite3.Error as error:
            raise IngestError(f"damaged SQLite database, its MLflow store cannot be read: {error}",
                              ErrorCode.CORRUPT_FILE) from None
        ctx.lines = len(metrics) + len(params) + len(tags)
        deleted = {run[0] for run in runs if run[5] == "deleted"}
        live = [run for run in runs if run[0] not in deleted]
        known = {run[0] for run in live}
        for rows, table in ((metrics, "metrics"), (params, "params"), (tags, "tags")):
            uuid_at = 1 if rows is metrics else 0
            ctx.ignore("row of a deleted MLflow run", sum(1 for row in rows if row[uuid_at] in deleted))
            for index, row in enumerate(rows):
                if row[uuid_at] not in known and row[uuid_at] not in deleted:
                    line_no = row[0] if rows is metrics else None
                    ctx.reject(line_no, f"{table} row of run {row[uuid_at]!r}, which the store's runs table does not"
                               " hold", None, code=ErrorCode.CONSTRAINT_ERROR)
        frame = pl.DataFrame([row for row in metrics if row[1] in known], schema=_metric_schema(), orient="row")
        problem = _metric_row_problem()
        for line_no, step, step_real, value, value_type, reason, code in frame.with_columns(problem).filter(
                pl.col("problem").is_not_null()).select(
                "line_no", "step", "step_real", "value", "value_type", pl.col("problem").struct.field("reason"),
                pl.col("problem").struct.field("code")).iter_rows():
            ctx.reject(line_no, reason.format(step=step if step is not None else step_real, value=value,
                                              type=value_type), None, code=code)
        frame = frame.with_columns(problem).filter(pl.col("problem").is_null()).with_columns(
            value=pl.when(pl.col("is_nan") == 1).then(float("nan")).otherwise(pl.col("value")),
            text_value=pl.lit(None, pl.String)).drop("problem", "step_real", "value_type", "step_type")
        ctx.stored = frame.height + sum(1 for rows in (params, tags) for row in rows if row[0] in known)
        system = frame.filter(pl.col("key").str.starts_with(SYSTEM_PREFIX))
        monitor = gpu_monitor.is_monitor_key(pl.col("key"))
        monitor_steps = frame.filter(pl.col("key").is_in(gpu_monitor.MONITOR_STEP_KEYS)).height
        ctx.stored -= monitor_steps
        ctx.ignore(gpu_monitor.STEP_RULE, monitor_steps)
        monitored = gpu_monitor.monitor_samples(
            frame.filter(monitor).with_columns(logged_at=pl.col("timestamp") / 1000.0), ["run_uuid"])
        frame = _with_tokens(_segments(frame.filter(~pl.col("key").str.starts_with(SYSTEM_PREFIX) & ~monitor),
                                       ["run_uuid", "key"]), ["run_uuid", "key"])
        for index, (uuid, name, status, start, end, _, experiment) in enumerate(live):
            run_id = ctx.run_id if index == 0 else self._extra_run(ctx, uuid, name)
            own_params = {key: value for run, key, value in params if run == uuid}
            own_tags = {key: value for run, key, value in tags if run == uuid}
            rows = frame.filter(pl.col("run_uuid") == uuid)
            keys = rows.get_column("key").unique().to_list()
            framework = detect_framework(_nested(own_params)) or framework_of_keys(keys)
            config_meta, _ = run_meta_from_config(_nested(own_params), detect_framework(_nested(own_params)))
            meta = {"mlflow_run_name": name, "mlflow_run_id": uuid, "mlflow_status": status,
                    "mlflow_experiment_id": experiment, "mlflow_start_time_ms": start, "mlflow_end_time_ms": end,
                    "mlflow_params": own_params, "mlflow_tags": own_tags, **config_meta}
            if index == 0:
                claim_framework(ctx, framework)
                ctx.run_meta.update(meta)
            else:
                from polytrace_cli.ingest.ledger import claim_run_framework, merge_run_meta

                claim_run_framework(ctx.con, run_id, framework)
                merge_run_meta(ctx.con, run_id, framework, meta, ctx.file_id, again=True)
            store_engine_samples(ctx, system_samples(system.filter(pl.col("run_uuid") == uuid)),
                                 "_mlflow_sqlite_system", run_id=run_id)
            store_engine_samples(ctx, monitored.filter(pl.col("run_uuid") == uuid), "_mlflow_sqlite_gpu_monitor",
                                 run_id=run_id)
            if rows.height:
                store_step_rows(ctx, rows.select("segment", "step", "key", "value", "text_value", "line_no"),
                                "_mlflow_sqlite", run_id=run_id)
                store_step_clock(ctx, rows.with_columns(logged_at=pl.col("timestamp") / 1000.0),
                                 "_mlflow_sqlite_clock", run_id=run_id)
        if len(live) > 1:
            ctx.note(f"{len(live)} MLflow runs: the first is this file's run, the others runs of their own")

    @staticmethod
    def _extra_run(ctx: FileContext, uuid: str, name: str | None) -> int:
        """The run holding the store's MLflow run `uuid` (found by its source, else created)."""
        ctx.begin_writes()
        source = f"{ctx.location}#{uuid}"
        found = fetch_first(ctx.con, "SELECT run_id FROM runs WHERE source_dir = ?", [source])
        if found:
            return found[0]
        base = f"{ctx.run_name}-{name or uuid}"
        unique, attempt = base, 1
        while fetch_first(ctx.con, "SELECT 1 FROM runs WHERE name = ?", [unique]):
            attempt += 1
            unique = f"{base}-{attempt}"
        run_id = ctx.con.execute("SELECT nextval('run_id_seq')").fetchall()[0][0]
        ctx.con.execute("INSERT INTO runs (run_id, name, framework, source_dir, meta) VALUES (?, ?, NULL, ?, '{}')",
                        [run_id, unique, source])
        return run_id
