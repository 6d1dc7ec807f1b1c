"""Following a log as it grows: poll its size, ingest its complete new lines, judge each new step,
and say when the job crashed, stalled or the file was cut.

Every `poll` seconds the file (or every file under a folder) is stat'ed; when it grew, its complete
lines are ingested (`ingest_paths(..., complete_lines=True)`: only the appended lines are read) and
the new steps judged (`judge.StepJudge`). Events, as JSON-able dicts (schemas/watch.schema.json):

    step       every new step: seconds, expected_s, slow, causes
    alert      kind slow_step (a slow step), crash (an OOM, an NCCL timeout or a traceback in the
               new lines, named once the file stops growing, from the lines since its first sign;
               watching then ends with EXIT_CRASH), stall (no new step for `stall_factor` × the
               usual time between steps)
    truncated  the file shrank: it is read again whole

The usual time between steps is the median of the wall-clock gaps between steps as they landed
over the last STALL_WINDOW steps (k steps landing together after a gap g count as k gaps of g / k);
with fewer than STALL_MIN_GAPS such gaps, the model's typical step seconds. With `idle_exit`,
watching ends (exit 0) after that many seconds without growth.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb

from polytrace_cli.errors import PolytraceError
from polytrace_cli.ingest.files import last_newline_end, walk
from polytrace_cli.watch.judge import StepJudge

EXIT_CRASH = 3
# Gaps between steps needed before the stall rule uses them instead of the model's step time.
STALL_MIN_GAPS = 3
STALL_WINDOW = 20
# The crash signs searched in new lines, in order: (cause, pattern).
CRASH_SIGNS = (
    ("oom", re.compile(r"CUDA out of memory|OutOfMemoryError|out of memory", re.IGNORECASE)),
    ("nccl_timeout", re.compile(r"NCCL.*(?:time(?:d)? ?out)|Watchdog caught collective operation timeout",
                                re.IGNORECASE)),
    ("traceback", re.compile(r"Traceback \(most recent call last\)")),
)
_RAY_PREFIX = re.compile(r"^\(\w+ pid=\d+[^)]*\)\s*")
_EXCEPTION_LINE = re.compile(r"^[\w.]*(?:Error|Exception|Interrupt)\b.*")


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
    """(cause, reason) of the first crash sign in `text` (see CRASH_SIGNS): for a traceback, its
    exception line (the last line naming an Error or Exception), else the matching line."""
    lines = [_RAY_PREFIX.sub("", line).strip() for line in text.splitlines()]
    for cause, pattern in CRASH_SIGNS:
        for index, line in enumerate(lines):
            if pattern.search(line):
                if cause == "traceback":
                    after = [later for later in lines[index + 1:] if _EXCEPTION_LINE.match(later)]
                    return cause, (after[-1] if after else line)[:300]
                return cause, line[:300]
    return None


class _Files:
    """Sizes and the part already scanned for crash signs, per file followed."""

    def __init__(self, path: Path):
        self.path = path
        self.sizes: dict[Path, int] = {}
        self.scanned: dict[Path, int] = {}

    def current(self) -> dict[Path, int]:
        files = [p for p, _, problem in walk([self.path]) if not problem] if self.path.exists() else []
        sizes = {}
        for file in files:
            try:
                sizes[file] = file.stat().st_size
            except OSError:
                continue
        return sizes

    def new_text(self, file: Path, end: int) -> str:
        """The complete lines of `file` after the part scanned so far (up to byte `end`)."""
        start = self.scanned.get(file, 0)
        if end <= start:
            return ""
        with open(file, "rb") as handle:
            handle.seek(start)
            data = handle.read(end - start)
        cut = data.rfind(b"\n")
        if cut < 0:
            return ""
        self.scanned[file] = start + cut + 1
        return data[:cut + 1].decode("utf-8", errors="replace")


def watch_log(con: duckdb.DuckDBPyConnection, path: Path, on_event: Callable[[dict], None],
              settings: WatchSettings = WatchSettings(), on_run: Callable[[str], None] | None = None,
              clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> WatchResult:
    """Follow `path` (a log file or a run folder) until it stays idle `settings.idle_exit` seconds
    or a crash is seen in it; `on_event` gets each event as it happens (see the module), `on_run`
    the run's name once its first rows are stored."""
    from polytrace_cli.ingest.runner import ingest_paths

    if not path.exists():
        raise PolytraceError(f"{path}: no such file or directory")
    files = _Files(path)
    result = WatchResult()
    judge: StepJudge | None = None
    last_growth = last_step_at = clock()
    gaps: list[float] = []
    stalled_at_step: int | None = None
    crash_text: dict[Path, str] = {}  # per file, its text from the first crash sign on
    last_step: int | None = None

    def emit(event: dict) -> None:
        if event["event"] == "alert":
            result.alerts += 1
        on_event(event)

    while True:
        now = clock()
        sizes = files.current()
        # A file is read once it holds a complete line (its format is sniffed from its first bytes).
        grown = {f: s for f, s in sizes.items() if s != files.sizes.get(f) and (s < files.sizes.get(f, 0) or (
            s and last_newline_end(f, s)))}
        for file, size in grown.items():
            if size < files.sizes.get(file, 0):
                emit({"event": "truncated", "file": str(file), "bytes": size, "previous_bytes": files.sizes[file]})
                files.scanned[file] = 0
        if grown:
            last_growth = now
            reports = ingest_paths(con, list(grown), run_name=settings.run, complete_lines=True, batch=False)
            for report in reports:
                if report.failed:
                    emit({"event": "alert", "kind": "ingest", "reason": f"{report.path}: {report.message}"})
            run_name = next((r.run for r in reports if r.run and r.rows), None) or result.run
            if run_name and judge is None:
                result.run = run_name
                run_id = con.execute("SELECT run_id FROM runs WHERE name = ?", [run_name]).fetchall()
                judge = StepJudge(con, run_id[0][0]) if run_id else None
                if on_run is not None:
                    on_run(run_name)
            for file, size in grown.items():
                text = files.new_text(file, size)
                if crash_text.get(file) is not None:
                    crash_text[file] += text
                elif crash_in(text):
                    crash_text[file] = text
            files.sizes.update(grown)
            steps = judge.new_steps() if judge is not None else []
            if steps:
                if last_step is not None:  # k steps in one gap landed gap / k apart
                    gaps.extend([(now - last_step_at) / len(steps)] * len(steps))
                last_step_at, stalled_at_step = now, None
            for record in steps:
                last_step = record["step"]
                result.steps += 1
                emit({"event": "step", **record})
                if record["slow"]:
                    emit({"event": "alert", "kind": "slow_step", "step": record["step"], "seconds": record["seconds"],
                          "expected_s": record["expected_s"], "causes": record["causes"]})
        elif crash_text:
            # The job's last lines have landed: the crash is named from all of them.
            file, text = next(iter(crash_text.items()))
            cause, reason = crash_in(text)
            emit({"event": "alert", "kind": "crash", "cause": cause, "reason": reason, "file": str(file),
                  "step": last_step})
            result.exit_code, result.reason = EXIT_CRASH, f"{cause}: {reason}"
            return result
        if judge is not None and last_step is not None and stalled_at_step != last_step:
            usual = statistics.median(gaps[-STALL_WINDOW:]) if len(gaps) >= STALL_MIN_GAPS else judge.typical_s
            if usual and now - last_step_at > settings.stall_factor * usual:
                stalled_at_step = last_step
                emit({"event": "alert", "kind": "stall", "step": last_step,
                      "seconds_since_step": round(now - last_step_at, 3), "usual_gap_s": round(usual, 3)})
        if settings.idle_exit is not None and now - last_growth >= settings.idle_exit:
            result.reason = f"no growth for {settings.idle_exit:g} s"
            return result
        sleep(settings.poll)


def event_json(event: dict) -> str:
    """One event as one line of strict JSON."""
    return json.dumps(event, allow_nan=False, default=str)
