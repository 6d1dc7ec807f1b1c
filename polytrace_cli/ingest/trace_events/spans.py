"""Trace events to spans: what every trace-event reader shares.

The events of a file are read in pieces (`events.py`) into temporary tables, sorted by kind:

- ranges: `X` events (`ts`, `dur`), and `B`/`E` pairs matched per thread (the k-th `B` opened at
  nesting level L ends at the k-th `E` that closes level L);
- kernels (`cat` kernel, gpu_memcpy, gpu_memset) and their launches (`cuda_runtime`/`cuda_driver`
  events, joined by `args.correlation`): summed, never stored;
- `M` events naming processes and threads;
- everything else counted under a named ignore rule (CPU operators of a profiler trace, counters,
  instants, flow and async events).

Each range becomes one `spans` row. Its GPU kernel time `busy_us` is, for a CPU range, the summed
duration of the kernels launched from its thread while it was open (a range's kernels count in every
range that encloses it); for a range on a GPU stream (Kineto's `gpu_user_annotation`), the summed
overlap of that stream's kernels with it. Each GPU with kernels also gets one span `gpu kernels`
from its first kernel's start to its last kernel's end, whose `busy_us` is the time at least one of
its kernels ran (the union of their intervals): its idle time is the span's length minus `busy_us`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import duckdb

from polytrace_cli.errors import ErrorCode
from polytrace_cli.ingest.base import FileContext
from polytrace_cli.scratch import scratch_folder
from polytrace_cli.ingest.trace_events.pieces import split_piece
from polytrace_cli.ingest.trace_events.stages import ROLE_WORDS, STAGE_PATTERNS
from polytrace_cli.store.sql import database_file

EVENT_COLUMNS = ("{'ph': 'VARCHAR', 'name': 'VARCHAR', 'cat': 'VARCHAR', 'pid': 'VARCHAR', 'tid': 'VARCHAR', "
                 "'ts': 'DOUBLE', 'dur': 'DOUBLE', 'args': 'JSON'}")
KERNEL_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver", "runtime", "driver")
# The categories of a PyTorch profiler trace that are operators, not ranges: counted, not stored.
OPERATOR_CATEGORIES = ("cpu_op", "python_function", "operator", "cpu_instant_event", "ac2g", "fwdbwd", "cuda_sync")
# The profiler's own spans in its trace (the profiling window, its overhead).
PROFILER_CATEGORIES = ("trace", "overhead")

IGNORE_RULES = {
    "metadata": "metadata event (names a process or thread)",
    "kernel": "GPU kernel (summed into its ranges)",
    "launch": "kernel launch (links a kernel to its range)",
    "operator": "CPU operator inside a range",
    "profiler": "the profiler's own span (its window or overhead)",
    "instant": "instant event",
    "counter": "counter event",
    "other": "flow, async or object event",
}


def stage_of(name: str) -> str | None:
    """The canonical stage a range's name gives (`names.STAGE_PATTERNS`), tried on the whole name and
    on its last dotted part (`fsdp_engine.train_batch` → `train_batch`); None for other names."""
    for candidate in (name, name.rsplit(".", 1)[-1]):
        lowered = candidate.strip().lower()
        for pattern, stage in STAGE_PATTERNS:
            if re.fullmatch(pattern, lowered):
                return stage
    return None


def role_in(text: str | None) -> str | None:
    """The role a process or thread name says (`ray::ActorWorker`, `[rollout] Rank 0, Process`), or None."""
    if not text:
        return None
    lowered = text.lower()
    for word, role in ROLE_WORDS:
        if re.search(word, lowered):
            return role
    return None


_RANK_IN_TEXT = re.compile(r"\brank[ _\-#:]*(\d+)", re.IGNORECASE)


def rank_in(text: str | None) -> int | None:
    """The rank a process or thread name carries (`rank_0`, `Rank 3, Process`), or None."""
    match = _RANK_IN_TEXT.search(text or "")
    return int(match.group(1)) if match else None


ROLE_OF_STAGE = {"gen": "rollout", "old_log_prob": "actor", "update_actor": "actor", "ref": "ref",
                 "values": "critic", "update_critic": "critic", "reward": "reward", "update_weights": "actor",
                 "step": "driver", "adv": "driver", "testing": "driver", "save_checkpoint": "driver"}


@dataclass
class SpanSource:
    """What a reader knows about a file's events before reading them."""

    role: str | None = None        # the file's role (from its name); else from process names, then stages
    rank: int | None = None
    dp_rank: int | None = None
    tp_rank: int | None = None
    pp_rank: int | None = None
    cp_rank: int | None = None
    replica: int | None = None
    step: int | None = None        # the step the whole file covers (verl's discrete mode)
    clock: str = "file"            # 'wall' when offset_us + ts is µs since the Unix epoch
    offset_us: float = 0.0         # added to every `ts`
    operators_are_ranges: bool = True   # False for profiler traces: cpu_op and similar are counted only
    sources_are_lines: bool = False     # source_event is a line number (JSON lines), else an event index
    extra: dict = field(default_factory=dict)


class EventTables:
    """The temporary tables one file's events are sorted into, with the accounting of every event."""

    def __init__(self, ctx: FileContext, source: SpanSource):
        self.ctx = ctx
        self.con = ctx.con
        self.source = source
        self.events = 0
        self.counts: dict[str, int] = {}
        self.store = database_file(self.con)  # a piece is read from a file in the store's scratch folder
        operators = "(NULL)" if source.operators_are_ranges else _sql_list(OPERATOR_CATEGORIES)
        profiler = "(NULL)" if source.operators_are_ranges else _sql_list(PROFILER_CATEGORIES)
        self._kind_sql = f"""CASE
            WHEN ph IS NULL THEN 'bad:missing-field:event without "ph"'
            WHEN ph = 'M' THEN 'metadata'
            WHEN ph = 'X' AND (ts IS NULL OR dur IS NULL) THEN 'bad:missing-field:complete event without "ts" or "dur"'
            WHEN ph = 'X' AND (dur < 0 OR NOT isfinite(ts) OR NOT isfinite(dur)) THEN 'bad:out-of-range:negative or non-finite "dur" or "ts"'
            WHEN ph IN ('B', 'E') AND (ts IS NULL OR NOT isfinite(ts)) THEN 'bad:missing-field:begin or end event without "ts"'
            WHEN ph = 'X' AND lower(coalesce(cat, '')) IN {_sql_list(KERNEL_CATEGORIES)} THEN 'kernel'
            WHEN ph = 'X' AND lower(coalesce(cat, '')) IN {_sql_list(LAUNCH_CATEGORIES)} THEN 'launch'
            WHEN ph = 'X' AND lower(coalesce(cat, '')) IN {operators} THEN 'operator'
            WHEN ph = 'X' AND lower(coalesce(cat, '')) IN {profiler} THEN 'profiler'
            WHEN ph = 'X' AND name IS NULL THEN 'bad:missing-field:complete event without "name"'
            WHEN ph = 'X' THEN 'range'
            WHEN ph = 'B' AND name IS NULL THEN 'bad:missing-field:begin event without "name"'
            WHEN ph IN ('B', 'E') THEN 'pair'
            WHEN ph IN ('i', 'I', 'R') THEN 'instant'
            WHEN ph = 'C' THEN 'counter'
            ELSE 'other' END"""
        self.con.execute("""CREATE OR REPLACE TEMP TABLE _tr_events (idx BIGINT, kind VARCHAR, ph VARCHAR, name VARCHAR,
            cat VARCHAR, pid VARCHAR, tid VARCHAR, ts DOUBLE, dur DOUBLE, args JSON)""")
        self.con.execute("CREATE OR REPLACE TEMP TABLE _tr_kernels (pid VARCHAR, tid VARCHAR, ts DOUBLE, dur DOUBLE, corr BIGINT)")
        self.con.execute("CREATE OR REPLACE TEMP TABLE _tr_launches (pid VARCHAR, tid VARCHAR, ts DOUBLE, corr BIGINT)")

    def add_pieces(self, pieces: Iterable[bytes], line_numbers: Iterable[list[int]] | None = None) -> None:
        """Sort each piece's events (a JSON array's text) into the tables. With `line_numbers`, the
        events of each piece are lines of a JSON-lines file with those numbers. The next piece is cut
        (decompressed, scanned) in a thread while DuckDB reads this one: one piece ahead at most."""
        numbers = iter(line_numbers) if line_numbers is not None else None
        for piece in _one_ahead(pieces):
            lines = next(numbers) if numbers is not None else None
            self.add_piece(piece, lines)

    def add_piece(self, piece: bytes, lines: list[int] | None = None, parts: list[bytes] | None = None) -> None:
        """Sort one piece's events (a JSON array's text; with `lines`, the line numbers of its events)."""
        first = self.events
        with scratch_folder(self.store, "trace") as folder:
            path = os.path.join(folder, "piece.json")
            with open(path, "wb") as handle:
                handle.write(piece)
            try:
                # Read and sorted by kind in one pass: the piece is materialized once.
                self.con.execute(
                    f"CREATE OR REPLACE TEMP TABLE _tr_sorted AS SELECT *, {self._kind_sql} AS kind FROM ("
                    f"SELECT ? + row_number() OVER () - 1 AS idx, * FROM read_json(?, format='array', columns={EVENT_COLUMNS}))",
                    [first, path])
                read_whole = True
            except duckdb.Error:
                read_whole = False
        if not read_whole:
            self._add_piece_event_by_event(piece, lines, parts)
            return
        self._sort_piece(lines, sorted_already=True)

    def _add_piece_event_by_event(self, piece: bytes, lines: list[int] | None, parts: list[bytes] | None) -> None:
        rows = []
        parts = split_piece(piece) if parts is None else parts
        for offset, text in enumerate(parts):
            index = self.events + offset
            where = lines[offset] if lines is not None else index
            try:
                event = json.loads(text)
            except ValueError:
                self._reject(where, "an event that is not JSON", text, ErrorCode.INVALID_JSON)
                continue
            if not isinstance(event, dict):
                self._reject(where, "an event that is not a JSON object", text, ErrorCode.NOT_AN_OBJECT)
                continue
            problem = _event_problem(event)
            if problem:
                self._reject(where, problem, text, ErrorCode.TYPE_ERROR)
                continue
            rows.append((index, *(_text(event.get(k)) for k in ("ph", "name", "cat", "pid", "tid")),
                         _number(event.get("ts")), _number(event.get("dur")),
                         None if event.get("args") is None else json.dumps(event.get("args"))))
        count = len(parts)
        self.con.execute("""CREATE OR REPLACE TEMP TABLE _tr_piece (idx BIGINT, ph VARCHAR, name VARCHAR, cat VARCHAR,
            pid VARCHAR, tid VARCHAR, ts DOUBLE, dur DOUBLE, args JSON)""")
        if rows:
            self.con.executemany("INSERT INTO _tr_piece VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        self._sort_piece(lines, total=count)

    def _reject(self, where: int, reason: str, text: bytes, code: ErrorCode) -> None:
        line = where if self.source.sources_are_lines else where + 1
        self.ctx.reject(line, reason, text, code=code)

    def _sort_piece(self, lines: list[int] | None, total: int | None = None, sorted_already: bool = False) -> None:
        con = self.con
        if not sorted_already:
            con.execute(f"CREATE OR REPLACE TEMP TABLE _tr_sorted AS SELECT *, {self._kind_sql} AS kind FROM _tr_piece")
            con.execute("DROP TABLE _tr_piece")
        read = con.execute("SELECT count(*) FROM _tr_sorted").fetchall()[0][0]
        if lines is not None:
            # Event indexes become the lines they were read from.
            con.execute("CREATE OR REPLACE TEMP TABLE _tr_lines AS SELECT unnest(?::BIGINT[]) AS line, "
                        "generate_subscripts(?::BIGINT[], 1) - 1 AS offset", [lines, lines])
            con.execute(f"UPDATE _tr_sorted SET idx = l.line FROM _tr_lines l WHERE _tr_sorted.idx - {self.events} = l.offset")
        for kind, count in con.execute("SELECT kind, count(*) FROM _tr_sorted GROUP BY kind").fetchall():
            self.counts[kind] = self.counts.get(kind, 0) + count
        for idx, kind, raw in con.execute(
                "SELECT idx, kind, json_object('ph', ph, 'name', name, 'ts', ts, 'dur', dur)::VARCHAR FROM _tr_sorted "
                "WHERE kind LIKE 'bad:%' ORDER BY idx").fetchall():
            _, code, reason = kind.split(":", 2)
            self.ctx.reject(idx if self.source.sources_are_lines else idx + 1, reason, raw, code=code)
        con.execute("""INSERT INTO _tr_events SELECT idx, kind, ph, name, cat, pid, tid, ts, dur, args FROM _tr_sorted
                       WHERE kind IN ('metadata', 'range', 'pair')""")
        con.execute("""INSERT INTO _tr_kernels SELECT pid, tid, ts, dur,
                           TRY_CAST(json_extract_string(args, '$.correlation') AS BIGINT) FROM _tr_sorted WHERE kind = 'kernel'""")
        con.execute("""INSERT INTO _tr_launches SELECT pid, tid, ts,
                           TRY_CAST(json_extract_string(args, '$.correlation') AS BIGINT) FROM _tr_sorted WHERE kind = 'launch'""")
        self.events += total if total is not None else read
        con.execute("DROP TABLE _tr_sorted")

    def finish(self) -> int:
        """Write the spans, account for every event on the file's context; return the spans written."""
        try:
            return self._finish()
        finally:
            for name in ("_tr_events", "_tr_kernels", "_tr_launches", "_tr_ranges", "_tr_names", "_tr_busy",
                         "_tr_gpu", "_tr_lines"):
                self.con.execute(f"DROP TABLE IF EXISTS {name}")

    def _finish(self) -> int:
        con, ctx, source = self.con, self.ctx, self.source
        self._pair_ranges()
        unmatched = con.execute("SELECT idx, ph, name FROM _tr_events WHERE kind = 'pair' AND idx NOT IN "
                                "(SELECT b FROM _tr_ranges WHERE b IS NOT NULL UNION ALL SELECT e FROM _tr_ranges "
                                "WHERE e IS NOT NULL) ORDER BY idx").fetchall()
        for idx, ph, name in unmatched:
            reason = "a begin event that is never ended" if ph == "B" else "an end event with no begin on its thread"
            ctx.reject(idx if source.sources_are_lines else idx + 1, reason, f'{{"ph": "{ph}", "name": {json.dumps(name)}}}',
                       code=ErrorCode.CONSTRAINT_ERROR)
        self._busy_time()
        names = self._names()
        stages = {name: stage_of(name) for (name,) in con.execute("SELECT DISTINCT name FROM _tr_ranges").fetchall()}
        con.execute("CREATE OR REPLACE TEMP TABLE _tr_stage AS SELECT unnest(?::VARCHAR[]) AS name, unnest(?::VARCHAR[]) AS stage",
                    [list(stages), list(stages.values())])
        self._lanes(names)
        written = ctx.insert(
            f"""
            INSERT INTO spans (run_id, file_id, step, rank, dp_rank, tp_rank, pp_rank, cp_rank, role, replica, lane,
                               name, stage, t0_us, t1_us, clock, wall_t0_us, busy_us, source_event, synthesized)
            SELECT ?, ?, coalesce(r.step, ?), coalesce(l.rank, r.rank, ?), ?, ?, ?, ?,
                   coalesce(?, l.role, {_role_of_stage_sql('s.stage')}, 'trainer'), ?, l.lane, r.name, s.stage,
                   r.t0 + ?, r.t1 + ?, ?, CASE WHEN ? = 'wall' THEN r.t0 + ? END, b.busy, r.idx, false
            FROM _tr_ranges r
            LEFT JOIN _tr_stage s USING (name)
            LEFT JOIN _tr_lane l ON l.pid IS NOT DISTINCT FROM r.pid AND l.tid IS NOT DISTINCT FROM r.tid
            LEFT JOIN _tr_busy b ON b.idx = r.idx
            WHERE r.b IS NOT NULL OR r.e IS NULL
            """,
            [ctx.run_id, ctx.file_id, source.step, source.rank, source.dp_rank, source.tp_rank, source.pp_rank,
             source.cp_rank, source.role, source.replica, source.offset_us, source.offset_us, source.clock,
             source.clock, source.offset_us],
        )
        written += ctx.insert(
            """
            INSERT INTO spans (run_id, file_id, step, rank, dp_rank, tp_rank, pp_rank, cp_rank, role, replica, lane,
                               name, stage, t0_us, t1_us, clock, wall_t0_us, busy_us, source_event, synthesized)
            SELECT ?, ?, ?, ?, ?, ?, ?, ?, coalesce(?, 'trainer'), ?, 'gpu ' || pid, 'gpu kernels', NULL,
                   t0 + ?, t1 + ?, ?, CASE WHEN ? = 'wall' THEN t0 + ? END, busy, first_idx, false
            FROM _tr_gpu
            """,
            [ctx.run_id, ctx.file_id, source.step, source.rank, source.dp_rank, source.tp_rank, source.pp_rank,
             source.cp_rank, source.role, source.replica, source.offset_us, source.offset_us, source.clock,
             source.clock, source.offset_us],
        )
        self._step_by_containment()
        ranges = con.execute("SELECT count(*) FROM _tr_ranges WHERE b IS NOT NULL OR e IS NULL").fetchall()[0][0]
        ends = con.execute("SELECT count(*) FROM _tr_ranges WHERE e IS NOT NULL AND b IS NOT NULL").fetchall()[0][0]
        ctx.lines += self.events
        ctx.stored += ranges + ends
        for kind, rule in IGNORE_RULES.items():
            ctx.ignore(rule, self.counts.get(kind, 0))
        con.execute("DROP TABLE IF EXISTS _tr_stage")
        con.execute("DROP TABLE IF EXISTS _tr_lane")
        return written

    def _pair_ranges(self) -> None:
        """`_tr_ranges`: one row per range (idx, name, pid, tid, t0, t1, args, b, e); an X event has
        b = e = NULL; a B/E pair has the indexes of both; a lone B or E has the other NULL."""
        self.con.execute(
            """
            CREATE OR REPLACE TEMP TABLE _tr_levels AS
            SELECT idx, ph, name, pid, tid, ts, args,
                   sum(CASE WHEN ph = 'B' THEN 1 ELSE -1 END) OVER w + CASE WHEN ph = 'E' THEN 1 ELSE 0 END AS level
            FROM _tr_events WHERE kind = 'pair'
            WINDOW w AS (PARTITION BY pid, tid ORDER BY ts, idx ROWS UNBOUNDED PRECEDING)
            """)
        self.con.execute(
            """
            CREATE OR REPLACE TEMP TABLE _tr_ranges AS
            WITH numbered AS (
                SELECT *, row_number() OVER (PARTITION BY pid, tid, level, ph ORDER BY ts, idx) AS k FROM _tr_levels),
            pairs AS (
                SELECT b.idx AS b, e.idx AS e, b.name, b.pid, b.tid, b.ts AS t0, e.ts AS t1, b.args
                FROM (SELECT * FROM numbered WHERE ph = 'B') b
                FULL JOIN (SELECT * FROM numbered WHERE ph = 'E') e
                  ON b.pid IS NOT DISTINCT FROM e.pid AND b.tid IS NOT DISTINCT FROM e.tid AND b.level = e.level AND b.k = e.k
                       AND e.ts >= b.ts)
            SELECT idx, name, cat, pid, tid, ts AS t0, ts + dur AS t1, args, NULL::BIGINT AS b, NULL::BIGINT AS e
            FROM _tr_events WHERE kind = 'range'
            UNION ALL
            SELECT coalesce(b, e) AS idx, name, NULL, pid, tid, t0, t1, args, b, e FROM pairs WHERE b IS NOT NULL AND e IS NOT NULL
            """)
        self.con.execute("DROP TABLE _tr_levels")
        self.con.execute("""ALTER TABLE _tr_ranges ADD COLUMN step INTEGER""")
        self.con.execute("""ALTER TABLE _tr_ranges ADD COLUMN rank INTEGER""")
        self.con.execute(
            """UPDATE _tr_ranges SET
                 step = TRY_CAST(coalesce(json_extract_string(args, '$.step'), json_extract_string(args, '$.global_step'),
                                          json_extract_string(args, '$.global_steps')) AS INTEGER),
                 rank = TRY_CAST(json_extract_string(args, '$.rank') AS INTEGER)""")

    def _busy_time(self) -> None:
        """`_tr_busy` (idx, busy) for the ranges with kernels; `_tr_gpu` one row per GPU with kernels."""
        con = self.con
        con.execute(
            """
            CREATE OR REPLACE TEMP TABLE _tr_busy AS
            WITH launched AS (
                SELECT l.pid, l.tid, l.ts, k.dur FROM _tr_launches l JOIN _tr_kernels k USING (corr)
                WHERE l.corr IS NOT NULL),
            cpu AS (
                SELECT r.idx, sum(k.dur) AS busy FROM _tr_ranges r JOIN launched k
                  ON k.pid IS NOT DISTINCT FROM r.pid AND k.tid IS NOT DISTINCT FROM r.tid AND k.ts >= r.t0 AND k.ts <= r.t1
                GROUP BY r.idx),
            gpu AS (
                SELECT r.idx, sum(least(r.t1, k.ts + k.dur) - greatest(r.t0, k.ts)) AS busy
                FROM (SELECT * FROM _tr_ranges WHERE lower(coalesce(cat, '')) = 'gpu_user_annotation') r
                JOIN _tr_kernels k ON k.pid IS NOT DISTINCT FROM r.pid AND k.tid IS NOT DISTINCT FROM r.tid
                  AND k.ts < r.t1 AND k.ts + k.dur > r.t0
                GROUP BY r.idx)
            SELECT * FROM gpu UNION ALL SELECT * FROM cpu WHERE idx NOT IN (SELECT idx FROM gpu)
            """)
        con.execute(
            """
            CREATE OR REPLACE TEMP TABLE _tr_gpu AS
            WITH ordered AS (
                SELECT pid, ts, ts + dur AS t_end,
                       max(ts + dur) OVER (PARTITION BY pid ORDER BY ts, ts + dur ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
                FROM _tr_kernels),
            islands AS (
                SELECT pid, ts, t_end, sum(CASE WHEN reach IS NULL OR ts > reach THEN 1 ELSE 0 END)
                       OVER (PARTITION BY pid ORDER BY ts, t_end ROWS UNBOUNDED PRECEDING) AS island
                FROM ordered),
            merged AS (SELECT pid, island, min(ts) AS t0, max(t_end) AS t1 FROM islands GROUP BY pid, island)
            SELECT pid, min(t0) AS t0, max(t1) AS t1, sum(t1 - t0) AS busy, NULL::BIGINT AS first_idx
            FROM merged GROUP BY pid
            """)

    def _names(self) -> dict[tuple[str | None, str | None], tuple[str | None, str | None]]:
        """(pid, tid) → (process name, thread name) from the `M` events."""
        names: dict = {}
        process: dict = {}
        for pid, tid, kind, value in self.con.execute(
                """SELECT pid, tid, name, json_extract_string(args, '$.name') FROM _tr_events
                   WHERE kind = 'metadata' AND name IN ('process_name', 'thread_name')""").fetchall():
            if kind == "process_name":
                process[pid] = value
            else:
                names[(pid, tid)] = value
        return {"process": process, "thread": names}

    def _lanes(self, names: dict) -> None:
        """`_tr_lane` (pid, tid, role, rank, lane) for each thread that holds ranges."""
        source = self.source
        rows = []
        for pid, tid in self.con.execute("SELECT DISTINCT pid, tid FROM _tr_ranges").fetchall():
            process = names["process"].get(pid)
            thread = names["thread"].get((pid, tid))
            lane = thread or (f"{process} / {tid}" if process else f"{pid}/{tid}")
            # Names first, then the ids themselves (a writer may name its threads `rank_0` in `tid`).
            texts = (thread, process, tid, pid)
            ranks = [rank_in(text) for text in texts]
            rank = None if source.rank is not None else next((r for r in ranks if r is not None), None)
            role = next((r for r in (role_in(text) for text in texts) if r), None)
            rows.append((pid, tid, role, rank, lane))
        self.con.execute("CREATE OR REPLACE TEMP TABLE _tr_lane (pid VARCHAR, tid VARCHAR, role VARCHAR, rank INTEGER, lane VARCHAR)")
        if rows:
            self.con.executemany("INSERT INTO _tr_lane VALUES (?, ?, ?, ?, ?)", rows)

    def _step_by_containment(self) -> None:
        """A span of this file without a step takes the step of this file's `step` span that holds its start."""
        self.con.execute(
            """
            UPDATE spans SET step = w.step FROM (
                SELECT s.source_event, any_value(w.step ORDER BY w.t0_us DESC) AS step
                FROM spans s JOIN spans w ON w.file_id = s.file_id AND w.stage = 'step' AND w.step IS NOT NULL
                     AND s.t0_us >= w.t0_us AND s.t0_us <= w.t1_us
                WHERE s.file_id = ? AND s.step IS NULL
                GROUP BY s.source_event) w
            WHERE spans.file_id = ? AND spans.step IS NULL AND spans.source_event = w.source_event
            """, [self.ctx.file_id, self.ctx.file_id])


def _one_ahead(items: Iterable[bytes]) -> Iterator[bytes]:
    """The items of `items`, the next one produced in a thread while the caller uses this one."""
    import queue
    import threading

    slots: queue.Queue = queue.Queue(maxsize=1)
    done = object()
    stop = threading.Event()

    def offer(entry: tuple) -> bool:
        while not stop.is_set():
            try:
                slots.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not offer((True, item)):
                    return
            offer((True, done))
        except BaseException as error:  # handed to the caller, raised there
            offer((False, error))

    worker = threading.Thread(target=produce, name="trace-pieces", daemon=True)
    worker.start()
    try:
        while True:
            ok, item = slots.get()
            if not ok:
                raise item
            if item is done:
                return
            yield item
    finally:
        stop.set()
        worker.join()


def _sql_list(values: Iterable[str]) -> str:
    return "(" + ", ".join("'" + v.replace("'", "''") + "'" for v in values) + ")"


def _role_of_stage_sql(column: str) -> str:
    cases = " ".join(f"WHEN '{stage}' THEN '{role}'" for stage, role in ROLE_OF_STAGE.items())
    return f"(CASE {column} {cases} END)"


def _text(value) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value)


def _number(value) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _event_problem(event: dict) -> str | None:
    """Why a decoded event cannot be read, or None."""
    for key in ("ts", "dur"):
        value = event.get(key)
        if value is not None and _number(value) is None:
            return f'"{key}" is not a number'
    for key in ("ph", "name", "cat"):
        value = event.get(key)
        if value is not None and not isinstance(value, str):
            return f'"{key}" is not a string'
    return None


def finish_pieces(ctx: FileContext, tables: EventTables, pieces) -> int:
    """Write the spans of a file read as `TracePieces`; an event cut off by the file's end is one
    rejected event, noted."""
    written = tables.finish()
    if pieces.problem:
        ctx.lines += 1
        ctx.reject(None, pieces.problem, code=ErrorCode.CORRUPT_FILE)
        ctx.note(f"{ctx.path.name}: {pieces.problem}; the {tables.events:,} events before it are kept")
    return written


def read_line_pieces(ctx: FileContext, tables: EventTables, pieces: Iterator[tuple[int, bytes]]) -> None:
    """Feed a JSON-lines file's pieces (`events.line_pieces`) to `tables`, each non-blank line one
    event; blank lines are ignored by name."""
    for first_line, piece in pieces:
        numbers: list[int] = []
        kept: list[bytes] = []
        lines = piece.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        for offset, line in enumerate(lines):
            if line.strip():
                numbers.append(first_line + offset)
                kept.append(line)
            else:
                ctx.ignore("blank line")
                ctx.lines += 1
        if kept:
            tables.add_piece(b"[" + b",".join(kept) + b"]", numbers, kept)
