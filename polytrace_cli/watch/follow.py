"""Following a log as it grows: poll its size, ingest its complete new lines, judge each new step,
and say when the job crashed, stalled or the file was cut.

Every `poll` seconds the file (or every file under a folder) is stat'ed; when it grew, its complete
lines are ingested (`ingest_paths(..., complete_lines=True)`: only the appended lines are read) and
the new steps judged (`judge.StepJudge`). Events, as JSON-able dicts (schemas/watch.schema.json):

    step       every new step: seconds, expected_s, slow, causes; a step judged before its values were
               final (first seen from a progress bar, its metric record landing later) comes again,
               `corrected`, judged on the record's values (`judge.StepJudge`)
    validation every step whose validation metrics landed (keys with a format's validation prefix,
               `val-core/...`, `test_score/...`, `eval/...`): their values, once per step; a
               validation run before training (verl's `step:0` line) is one, though not a step
    alert      kind slow_step (a slow step; `corrected` when a corrected step is slow),
               slow_step_withdrawn (a step alerted slow that its corrected values show is not), efficiency (with a baseline, `baseline.BaselineBand`: a
               stage's seconds at the step's workload left the baseline's band), baseline (the
               watched run does not compare with the baseline like for like), crash (a fatal error in
               the new lines, `ingest.crashes`: a traceback's final line, an OOM, an NCCL timeout, a
               dead Ray task or actor, a signal, never a warning, a retry, a shutdown block or a config
               entry; named once a poll sees no growth, from the lines since its first sign; when
               CRASH_QUIET_POLLS polls in all pass without growth, STARTUP_CRASH_QUIET_POLLS before the
               job's first step, watching ends with EXIT_CRASH; a step logged after the crash's lines
               means the job lives on, and watching goes on), stall (no new step for
               `stall_factor` × the usual time between steps, and for at least STALL_MIN_POLLS
               polls: a gap is not seen finer than the poll; none once the run reached its
               configured last step), async (an asynchronous run's trainer waiting above its usual
               share of the step, or staleness or dropped samples growing, K steps in a row:
               `watch.asynchronous`)
    truncated  the file shrank: it is read again whole

The usual time between steps is the median of the wall-clock gaps between steps as they landed
over the last STALL_WINDOW steps (k steps landing together after a gap g count as k gaps of g / k);
with fewer than STALL_MIN_GAPS such gaps, the model's typical step seconds. With `idle_exit`,
watching ends (exit 0) after that many seconds without growth.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import duckdb

from polytrace_cli.errors import PolytraceError
from polytrace_cli.ingest.crashes import crash_start, first_crash, plain
from polytrace_cli.ingest.files import last_newline_end, path_text, walk
from polytrace_cli.semantics.step_facts import pairs_after_sql
from polytrace_cli.store.queries import run_id_if_any
from polytrace_cli.watch.asynchronous import AsyncAlerts
from polytrace_cli.watch.baseline import BaselineBand
from polytrace_cli.watch.judge import StepJudge

EXIT_CRASH = 3
# Polls without growth after a crash's lines (the first alerts it) before watching ends with EXIT_CRASH.
CRASH_QUIET_POLLS = 5
# Gaps between steps needed before the stall rule uses them instead of the model's step time.
STALL_MIN_GAPS = 3
STALL_WINDOW = 20
# A stall lasts at least this many poll intervals, however short the usual gap between steps.
STALL_MIN_POLLS = 10
# Polls without growth after a crash's lines before watching ends, while the job has logged no step yet:
# start-up (loading models, compiling, a first generation) may pause long after harmless noise.
STARTUP_CRASH_QUIET_POLLS = 30


@dataclass
class WatchSettings:
    """How `watch_log` follows: poll interval, idle exit, stall factor, the run's name."""

    poll: float = 1.0
    idle_exit: float | None = None
    stall_factor: float = 3.0
    run: str | None = None


@dataclass
class WatchResult:
    """How watching ended: `exit_code` 0 (idle), EXIT_CRASH (a crash in the log, `reason` says which)."""

    exit_code: int = 0
    reason: str = ""
    steps: int = 0
    alerts: int = 0
    run: str | None = None


def crash_in(text: str) -> tuple[str, str] | None:
    """(cause, reason) of the first crash in `text` (`ingest.crashes`: a traceback's final line, an
    OOM, an NCCL timeout, a dead Ray task or actor, a signal; never a warning, a retry, an
    `Exception ignored in:` block or a config entry), ANSI codes and Ray prefixes removed; None
    when its lines hold none."""
    crash = first_crash(text.splitlines())
    if crash is None:
        start = crash_start(text.splitlines())
        return None if start is None else ("traceback", plain(text.splitlines()[start]).strip()[:300])
    return crash.cause, crash.reason


def first_crash_sign(text: str) -> int | None:
    """The index of the first line of `text` where a crash begins (`crashes.crash_start`), or None."""
    return crash_start(text.splitlines())


@dataclass
class _Crash:
    """A crash's lines as they land: the file, its text from the first sign on, that sign's line."""

    file: Path
    text: str
    line: int
    alerted: bool = False
    quiet_polls: int = 0


class _Files:
    """Sizes and modification times, and the part already scanned for crash signs (bytes and lines),
    per file followed."""

    def __init__(self, path: Path):
        self.path = path
        self.sizes: dict[Path, int] = {}
        self.stamps: dict[Path, int] = {}
        self.scanned: dict[Path, tuple[int, int]] = {}

    def current(self) -> dict[Path, tuple[int, int]]:
        """(size, modification time in ns) of each file under the path."""
        files = [p for p, _, problem in walk([self.path]) if not problem] if self.path.exists() else []
        stats = {}
        for file in files:
            try:
                stat = file.stat()
            except OSError:
                continue
            stats[file] = (stat.st_size, stat.st_mtime_ns)
        return stats

    def changed(self, file: Path, size: int, stamp: int) -> bool:
        """Whether the file is to be read again: it shrank, or it grew by a complete line, or it was
        written at the same size (rewritten, which the ingest tells from a touch)."""
        before = self.sizes.get(file)
        if size != before:
            return size < (before or 0) or bool(size and last_newline_end(file, size))
        return stamp != self.stamps.get(file, stamp)

    def new_text(self, file: Path, end: int) -> tuple[str, int]:
        """(the complete lines of `file` after the part scanned so far, up to byte `end`; the line
        number of the first of them)."""
        start, lines = self.scanned.get(file, (0, 0))
        if end <= start:
            return "", lines + 1
        with open(file, "rb") as handle:
            handle.seek(start)
            data = handle.read(end - start)
        cut = data.rfind(b"\n")
        if cut < 0:
            return "", lines + 1
        self.scanned[file] = (start + cut + 1, lines + data.count(b"\n", 0, cut + 1))
        return data[:cut + 1].decode("utf-8", errors="replace"), lines + 1


def _metric_lines(con: duckdb.DuckDBPyConnection, file: Path, before: int) -> tuple[int | None, int | None]:
    """(the last step logged before line `before` of `file`, the last line of `file` holding a step)."""
    row = con.execute(
        "SELECT max_by(sm.step, sm.line_no) FILTER (WHERE sm.line_no < ?), max(sm.line_no)"
        " FROM step_metrics sm JOIN files f USING (file_id) WHERE f.path = ?",
        [before, path_text(file.resolve())]).fetchall()
    return row[0] if row else (None, None)


class ValidationEvents:
    """The `validation` events of one run: each step (segment and step) whose stored pairs hold a
    validation key (`catalog.validation_key_sql` of the formats' declared prefixes), once.

    Each call reads only the pairs of lines not read before: per file, those after the lines it had
    at the last call (a file's pairs are only added to on later lines; a file read again whole gets
    a new id), so a poll costs what grew, not the run."""

    def __init__(self, con: duckdb.DuckDBPyConnection, run_id: int):
        from polytrace_cli.store.catalog import declared_names, validation_key_sql

        self.con, self.run_id = con, run_id
        self.is_validation = validation_key_sql(declared_names()[1])
        self.seen: set[tuple[int, int]] = set()
        self.lines_read: dict[int, int] = {}

    def new(self) -> list[dict]:
        """One event per step with validation values not yet given, in log order: step, segment and
        its numeric validation values by key (NaN and infinities as null)."""
        grown = [(file_id, lines) for file_id, lines in self.con.execute(
            "SELECT file_id, lines FROM files WHERE run_id = ?", [self.run_id]).fetchall()
            if self.lines_read.get(file_id) != lines]
        if not grown:
            return []
        selects, arguments = pairs_after_sql({file_id: self.lines_read.get(file_id) for file_id, _ in grown},
                                             "segment, step, key, value, line_no",
                                             f"text_value IS NULL AND ({self.is_validation})")
        rows = self.con.execute(
            f"SELECT segment, step, list(key ORDER BY line_no, key), list(value ORDER BY line_no, key)"
            f" FROM ({selects}) GROUP BY segment, step ORDER BY segment, step", arguments).fetchall()
        self.lines_read.update(grown)
        events = []
        for segment, step, keys, values in rows:
            if (segment, step) in self.seen:
                continue
            self.seen.add((segment, step))
            metrics = {key: value if value is not None and math.isfinite(value) else None
                       for key, value in zip(keys, values)}
            events.append({"event": "validation", "step": step, "segment": segment, "metrics": metrics})
        return events


Lease = Callable[[], AbstractContextManager[duckdb.DuckDBPyConnection]]


def watch_log(store: duckdb.DuckDBPyConnection | Lease, path: Path, on_event: Callable[[dict], None],
              settings: WatchSettings = WatchSettings(), on_run: Callable[[str], None] | None = None,
              clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
              baseline: BaselineBand | None = None) -> WatchResult:
    """Follow `path` (a log file or a run folder) until it stays idle `settings.idle_exit` seconds
    or a crash is seen in it; `on_event` gets each event as it happens (see the module), `on_run`
    the run's name once its first rows are stored; with `baseline`, each training step's stages are
    also judged against the baseline run's band (`efficiency` alerts).

    `store` is a connection held throughout, or a lease: a callable whose context holds the store
    open (`with store() as con:`), taken only while a poll writes or reads it, so that between polls
    other processes open the store (`polytrace runs --wait 30` while `watch` runs)."""
    from polytrace_cli.ingest.driver import ingest_paths

    lease: Lease = (lambda: nullcontext(store)) if isinstance(store, duckdb.DuckDBPyConnection) else store
    if not path.exists():
        raise PolytraceError(f"{path}: no such file or directory")
    files = _Files(path)
    result = WatchResult()
    judge: StepJudge | None = None
    asynchronous = AsyncAlerts()
    validations: ValidationEvents | None = None
    last_growth = last_step_at = clock()
    gaps: list[float] = []
    stalled_at_step: int | None = None
    crash: _Crash | None = None
    total_steps: int | None = None
    last_step: int | None = None

    def emit(event: dict) -> None:
        if event["event"] == "alert":
            result.alerts += 1
        on_event(event)

    def alert_crash(con: duckdb.DuckDBPyConnection, crash: _Crash) -> bool:
        """Alert a crash whose lines have landed, named from all of them, with the last step before it;
        False (no alert) when, all landed, they hold no crash (a shutdown block, a caught error)."""
        named = crash_in(crash.text)
        if named is None:
            return False
        cause, reason = named
        step_before, _ = _metric_lines(con, crash.file, crash.line)
        emit({"event": "alert", "kind": "crash", "cause": cause, "reason": reason, "file": str(crash.file),
              "step": step_before if step_before is not None else last_step})
        crash.alerted, result.reason = True, f"{cause}: {reason}"
        return True

    while True:
        now = clock()
        stats = files.current()
        # A file is read once it holds a complete line (its format is sniffed from its first bytes).
        grown = {f: size for f, (size, stamp) in stats.items() if files.changed(f, size, stamp)}
        for file, size in grown.items():
            if size < files.sizes.get(file, 0):
                emit({"event": "truncated", "file": str(file), "bytes": size, "previous_bytes": files.sizes[file]})
                files.scanned[file] = (0, 0)
        if grown:
            with lease() as con:
                if judge is not None:  # the judges read through the connection of this poll
                    judge.con = validations.con = con
                reports = ingest_paths(con, list(grown), run_name=settings.run, complete_lines=True, batch=False)
                rewritten = {report.path for report in reports if report.status == "replaced"}
                for file, size in grown.items():
                    # Written over at the same size (a growth read whole is "replaced" too, for other reasons).
                    if path_text(file.resolve()) in rewritten and size == files.sizes.get(file):
                        emit({"event": "truncated", "file": str(file), "bytes": size,
                              "previous_bytes": files.sizes[file]})
                        files.scanned[file] = (0, 0)
                for report in reports:
                    if report.failed:
                        emit({"event": "alert", "kind": "ingest", "reason": f"{report.path}: {report.message}"})
                run_name = next((r.run for r in reports if r.run and r.rows), None) or result.run
                if run_name and judge is None:
                    result.run = run_name
                    run_id = run_id_if_any(con, run_name)
                    judge = StepJudge(con, run_id) if run_id is not None else None
                    validations = ValidationEvents(con, run_id) if run_id is not None else None
                    total_steps = configured_steps(con, run_name)
                    if on_run is not None:
                        on_run(run_name)
                for file, size in grown.items():
                    text, first_line = files.new_text(file, size)
                    if crash is not None and crash.file == file:
                        crash.text += text
                    elif crash is None and (sign := first_crash_sign(text)) is not None:
                        crash = _Crash(file, "".join(text.splitlines(keepends=True)[sign:]), first_line + sign)
                files.sizes.update(grown)
                files.stamps.update({file: stats[file][1] for file in grown})
                # Lines that stored nothing (progress bars, noise) bring no step: the run is not read again.
                stored = any(report.rows for report in reports)
                judged = judge.new_steps() if judge is not None and stored else []
                steps = [record for record in judged if not record.get("corrected")]
                if steps:
                    if last_step is not None:  # k steps in one gap landed gap / k apart
                        gaps.extend([(now - last_step_at) / len(steps)] * len(steps))
                    last_step_at, stalled_at_step = now, None
                # A validation follows its step's events; one without a step comes where its step would.
                validated = validations.new() if validations is not None and stored else []
                for record in judged:
                    while validated and (validated[0]["segment"], validated[0]["step"]) < (record["segment"], record["step"]):
                        emit(validated.pop(0))
                    corrected = record.pop("corrected", False)
                    was_slow = record.pop("was_slow", False)
                    if corrected:
                        # Judged before from what the log said then (a progress bar): the step's event and
                        # its slow alert come again, corrected; a slow alert it no longer earns is withdrawn.
                        emit({"event": "step", **record, "corrected": True})
                        if record["slow"]:
                            emit({"event": "alert", "kind": "slow_step", "step": record["step"],
                                  "seconds": record["seconds"], "expected_s": record["expected_s"],
                                  "causes": record["causes"], "corrected": True})
                        elif was_slow:
                            emit({"event": "alert", "kind": "slow_step_withdrawn", "step": record["step"],
                                  "seconds": record["seconds"], "expected_s": record["expected_s"]})
                        continue
                    last_step = record["step"]
                    result.steps += 1
                    emit({"event": "step", **record})
                    if record["slow"]:
                        emit({"event": "alert", "kind": "slow_step", "step": record["step"], "seconds": record["seconds"],
                              "expected_s": record["expected_s"], "causes": record["causes"]})
                    side = judge.rollout_side.get((record["segment"], record["step"]))
                    if side is not None:
                        for alert in asynchronous.observe(record["step"], *side):
                            emit(alert)
                    if validated and (validated[0]["segment"], validated[0]["step"]) == (record["segment"], record["step"]):
                        emit(validated.pop(0))
                for event in validated:
                    emit(event)
                if baseline is not None and steps:
                    for event in baseline.judge(con, judge.run_id, result.run or "", judge.last_frame):
                        emit(event)
                if steps and crash is not None and (_metric_lines(con, crash.file, crash.line)[1] or 0) > crash.line:
                    # Steps logged after the crash's lines: the job lives on.
                    if not crash.alerted:
                        alert_crash(con, crash)
                    crash, result.reason = None, ""
                # Idle time counts from when the growth was read: a slow read never eats the idle window.
                last_growth = clock()
        elif crash is not None:
            if not crash.alerted:
                with lease() as con:
                    if not alert_crash(con, crash):
                        crash = None
        if crash is not None and not grown:
            crash.quiet_polls += 1
            if crash.quiet_polls >= (CRASH_QUIET_POLLS if last_step is not None else STARTUP_CRASH_QUIET_POLLS):
                result.exit_code = EXIT_CRASH
                return result
        finished = total_steps is not None and last_step is not None and last_step >= total_steps
        if judge is not None and last_step is not None and stalled_at_step != last_step and not finished:
            usual = statistics.median(gaps[-STALL_WINDOW:]) if len(gaps) >= STALL_MIN_GAPS else judge.typical_s
            if usual and now - last_step_at > max(settings.stall_factor * usual, STALL_MIN_POLLS * settings.poll):
                stalled_at_step = last_step
                emit({"event": "alert", "kind": "stall", "step": last_step,
                      "seconds_since_step": round(now - last_step_at, 3), "usual_gap_s": round(usual, 3)})
        if settings.idle_exit is not None and now - last_growth >= settings.idle_exit:
            result.reason = f"no growth for {settings.idle_exit:g} s"
            return result
        sleep(settings.poll)


def configured_steps(con: duckdb.DuckDBPyConnection, run: str) -> int | None:
    """The run's `total_training_steps` from its config, when it names one."""
    row = con.execute("SELECT meta->>'total_training_steps' FROM runs WHERE name = ?", [run]).fetchall()
    try:
        return int(row[0][0]) if row and row[0][0] else None
    except ValueError:
        return None


def event_json(event: dict) -> str:
    """One event as one line of strict JSON."""
    return json.dumps(event, allow_nan=False, default=str)
