"""Nsight Systems SQLite exports (`nsys export --type sqlite`).

The export is a SQLite database; what is read (names from NVIDIA's export schema):

- `NVTX_EVENTS`: push/pop and start/end ranges (`eventType` 59 and 60; marks and domain events are
  counted, not stored) with `start`/`end` in ns, the thread `globalTid` (process id in its bits 24-47,
  thread id in its low 24 bits), and the range's text: the `text` column in older exports, a
  `textId` into `StringIds(id, value)` in newer ones (both are looked for);
- `CUPTI_ACTIVITY_KIND_KERNEL` (and `_MEMCPY`, `_MEMSET` where present): GPU work with `start`,
  `end`, `deviceId`, `correlationId`; `CUPTI_ACTIVITY_KIND_RUNTIME`: the launches, on `globalTid`,
  with the same `correlationId`. A range's `busy_us` is the summed duration of the kernels launched
  from its thread while it was open; each device gets one `gpu kernels` span whose `busy_us` is the
  union of its kernels' intervals;
- `TARGET_INFO_SESSION_START_TIME.utcEpochNs` (newer exports): the session's start as wall clock.
  With it the spans are on wall clock and line up with other ranks' files; without it, the file's
  own clock;
- `ThreadNames(nameId, globalTid)` names lanes.

The columns differ between versions, so each table's columns are read from the database first and
only those present are asked for. Everything is summed inside SQLite; only the ranges come out.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from polytrace_cli.errors import ErrorCode, IngestError
from polytrace_cli.ingest.base import FileContext, Ingester
from polytrace_cli.ingest.formats.traces import names
from polytrace_cli.ingest.trace_events.spans import ROLE_OF_STAGE, rank_in, role_in, stage_of
from polytrace_cli.ingest.registry import register
from polytrace_cli.ingest.sqlite_files import open_read_only

RANGE_EVENT_TYPES = (59, 60)  # NvtxPushPopRange, NvtxStartEndRange
GPU_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in db.execute(f"PRAGMA table_info({table})")}


def _tables(db: sqlite3.Connection) -> set[str]:
    return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}


@register
class NsysSqliteIngester(Ingester):
    name = "nsys-sqlite"
    version = "1"
    framework = None
    description = "Nsight Systems SQLite export (nsys export --type sqlite): NVTX ranges, CUDA kernels summed"
    metric_aliases = names.METRIC_ALIASES
    validation_prefixes = names.VALIDATION_PREFIXES

    def sniff(self, path: Path, head: bytes) -> bool:
        return head.startswith(b"SQLite format 3\x00") and (b"NVTX_EVENTS" in head or b"CUPTI_ACTIVITY" in head
                                                             or path.suffix == ".sqlite" and b"StringIds" in head)

    def load(self, ctx: FileContext) -> None:
        try:
            db = open_read_only(ctx.path)
            tables = _tables(db)
        except sqlite3.Error as error:
            raise IngestError(f"not a readable SQLite export: {error}") from None
        try:
            if "NVTX_EVENTS" not in tables:
                raise IngestError("an Nsight Systems export without NVTX_EVENTS: no ranges to read")
            self._load(ctx, db, tables)
        except sqlite3.Error as error:
            raise IngestError(f"cannot read the Nsight Systems export: {error}") from None
        finally:
            db.close()

    def _load(self, ctx: FileContext, db: sqlite3.Connection, tables: set[str]) -> None:
        nvtx = _columns(db, "NVTX_EVENTS")
        strings = "StringIds" in tables
        text = "n.text" if "text" in nvtx else "NULL"
        if "textId" in nvtx and strings:
            text = f"coalesce({text}, (SELECT value FROM StringIds WHERE id = n.textId))"
        tid = "n.globalTid" if "globalTid" in nvtx else "NULL"
        types = ",".join(str(t) for t in RANGE_EVENT_TYPES)
        offset_ns, clock = 0, "file"
        if "TARGET_INFO_SESSION_START_TIME" in tables and "utcEpochNs" in _columns(db, "TARGET_INFO_SESSION_START_TIME"):
            row = db.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1").fetchone()
            if row and row[0]:
                offset_ns, clock = int(row[0]), "wall"
        busy_sql = "NULL"
        if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables and {"correlationId", "globalTid", "start"} <= _columns(db, "CUPTI_ACTIVITY_KIND_RUNTIME"):
            gpu = [t for t in GPU_TABLES if t in tables and {"start", "end", "correlationId"} <= _columns(db, t)]
            if gpu:
                work = " UNION ALL ".join(
                    f"SELECT correlationId, {'globalPid' if 'globalPid' in _columns(db, t) else 'NULL'} AS globalPid, "
                    f"end - start AS dur FROM {t}" for t in gpu)
                db.execute(f"CREATE TEMP TABLE gpu_work AS {work}")
                db.execute("CREATE INDEX temp.gpu_work_corr ON gpu_work (correlationId)")
                busy_sql = ("(SELECT sum(w.dur) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN gpu_work w "
                            "ON w.correlationId = r.correlationId AND (w.globalPid IS NULL OR w.globalPid = (r.globalTid / 16777216) * 16777216) "
                            "WHERE r.globalTid = n.globalTid AND r.start >= n.start AND r.start <= n.end)")
        thread_names: dict[int, str] = {}
        if "ThreadNames" in tables and strings and {"nameId", "globalTid"} <= _columns(db, "ThreadNames"):
            thread_names = dict(db.execute("SELECT t.globalTid, s.value FROM ThreadNames t JOIN StringIds s ON s.id = t.nameId"))
        total = db.execute("SELECT count(*) FROM NVTX_EVENTS").fetchone()[0]
        rows = db.execute(
            f"""SELECT n.rowid, {text}, n.start, n."end", {tid}, {busy_sql} FROM NVTX_EVENTS n
                WHERE n.eventType IN ({types}) AND n."end" IS NOT NULL ORDER BY n.start""").fetchall()
        file_rank = rank_in(ctx.path.name)
        file_role = role_in(ctx.path.name)
        spans = []
        bad = 0
        for rowid, name, start, end, global_tid, busy in rows:
            if name is None or start is None or end < start:
                ctx.reject(rowid, "an NVTX range without text or ending before it starts",
                           f"{name!r} {start} {end}", code=ErrorCode.CONSTRAINT_ERROR)
                bad += 1
                continue
            stage = stage_of(name)
            lane = thread_names.get(global_tid) or (f"thread {global_tid % 16777216}" if global_tid is not None else None)
            role = file_role or role_in(lane) or ROLE_OF_STAGE.get(stage or "", "trainer")
            t0 = start / 1000.0 + offset_ns / 1000.0
            spans.append((ctx.run_id, ctx.file_id, file_rank, role, lane, name, stage, t0, end / 1000.0 + offset_ns / 1000.0,
                          clock, t0 if clock == "wall" else None, None if busy is None else busy / 1000.0, rowid))
        kernels = 0
        for table in (t for t in GPU_TABLES if t in tables and {"start", "end"} <= _columns(db, t)):
            device = "deviceId" if "deviceId" in _columns(db, table) else "0"
            kernels += db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for dev, first, last, union in db.execute(
                    f"""WITH k AS (SELECT {device} AS d, start AS s, "end" AS e,
                               max("end") OVER (PARTITION BY {device} ORDER BY start, "end"
                                                ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach FROM {table}),
                        i AS (SELECT d, s, e, sum(CASE WHEN reach IS NULL OR s > reach THEN 1 ELSE 0 END)
                               OVER (PARTITION BY d ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS island FROM k),
                        m AS (SELECT d, island, min(s) AS s, max(e) AS e FROM i GROUP BY d, island)
                        SELECT d, min(s), max(e), sum(e - s) FROM m GROUP BY d""") if table == GPU_TABLES[0] else ():
                t0 = first / 1000.0 + offset_ns / 1000.0
                spans.append((ctx.run_id, ctx.file_id, file_rank, file_role or "trainer", f"gpu {dev}", "gpu kernels",
                              None, t0, last / 1000.0 + offset_ns / 1000.0, clock, t0 if clock == "wall" else None,
                              union / 1000.0, None))
        if spans:
            ctx.begin_writes()
            ctx.con.executemany(
                """INSERT INTO spans (run_id, file_id, rank, role, lane, name, stage, t0_us, t1_us, clock, wall_t0_us,
                                      busy_us, source_event, synthesized) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, false)""",
                spans)
            ctx.rows += len(spans)
        ranges = len(rows) - bad
        ctx.lines = total + kernels
        ctx.stored = ranges
        ctx.ignore("NVTX mark or domain event", total - len(rows))
        ctx.ignore("GPU kernel, copy or set (summed into its ranges)", kernels)

