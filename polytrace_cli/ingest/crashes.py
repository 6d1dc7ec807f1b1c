"""Which lines of a console log say the job died, and which only look as if they did.

A crash is a fatal error, one of:

- the final line of a traceback: the exception line (`ValueError: ...`,
  `ray.exceptions.RayTaskError(ChunkedEncodingError): ...`) that ends a block begun by
  `Traceback (most recent call last):` at the start of a line, as Python prints an uncaught
  exception (a traceback behind a logging prefix, `ERROR:2026-03-26 22:35:46,212:Traceback ...`,
  was logged by a handler that caught it: the job went on). For Ray's `RayTaskError(Name)` the
  worker's own `...Name: ...` line below it is the reason;
- running out of memory (`torch.cuda.OutOfMemoryError`, `CUDA out of memory`, `CUDA error: out of memory`);
- an NCCL timeout or failure (`Watchdog caught collective operation timeout`, `NCCL timeout`,
  `NCCL error`, `ProcessGroupNCCL ... timed out`);
- a dead Ray task or actor (`RayTaskError`, `RayActorError`, `ActorDiedError`, `The actor died
  unexpectedly`, `A worker died or was killed`);
- a signal (`Fatal Python error`, `Segmentation fault`, `received signal 9`, `SIGKILL`/`SIGTERM`/
  `SIGSEGV`/`SIGABRT`, torchrun's `exitcode: -9`, a line `Killed`), except a Ray worker's
  `*** SIGTERM received ...`: Ray stops its workers so whenever the driver shuts down.

Never a crash: a warning (a line naming `Warning` or `WARN`), a retry (`Retrying`, `will retry`:
an HTTP 502 that was retried), Python's `Exception ignored in: ...` block (a harmless error at
shutdown, its traceback and exception line included), or a config entry that names a sign
(`'nccl_timeout': 600`, `nccl_timeout: 600`, `trainer.nccl_timeout=600`).

Lines are read without ANSI colour codes and Ray actor prefixes, so no reason shown carries them.
The first crash of the lines is the one reported: later errors are usually its consequences.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from polytrace_cli.ingest.console_lines import ANSI_PATTERN, RAY_PREFIX_PATTERN

# (cause, pattern) of the one-line signs, in the order they are tried on a line.
LINE_SIGNS: tuple[tuple[str, str], ...] = (
    ("oom", r"OutOfMemoryError|CUDA out of memory|CUDA error: out of memory"),
    ("nccl_timeout", r"Watchdog caught collective operation timeout|\bNCCL\b.{0,40}\b(?:time(?:d)? ?out|Timeout)"
                     r"|ProcessGroupNCCL.{0,80}(?:timed out|Timeout\(ms\))|\bNCCL (?:error|failure)\b"),
    ("ray", r"\bRay(?:Task|Actor)Error\b|\bActorDiedError\b|The actor died unexpectedly|A worker died or was killed"),
    ("signal", r"Fatal Python error|Segmentation fault|received signal \d+|\bSIG(?:KILL|TERM|SEGV|ABRT|BUS)\b"
               r"|exitcode\s*:\s*-\d+|^Killed$"),
)
TRACEBACK = r"Traceback \(most recent call last\)"
# An exception line: a dotted name ending in Error, Exception, Interrupt or Exit, perhaps with a
# wrapped cause in parentheses (Ray's `RayTaskError(ChunkedEncodingError)`), then `:` or the end.
EXCEPTION_LINE = r"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)(?:\([\w.]+\))?(?::|$)"
# Lines that name a sign without being one.
WARNING = r"Warning\b|\bWARN(?:ING)?\b|\bwarn\(|\bwarnings\.warn"
RETRY = r"(?i:\bretr(?:y|ying|ies|ied)\b)"
CONFIG_ENTRY = (r"^[\s{\[(,]*['\"][^'\"]+['\"]\s*:\s*"           # a dict's entry: 'key': value
                r"|^\s*-{0,2}[\w.\-]+\s*[:=]\s*[\w.\-/+]*\s*,?\s*$")  # key: value, key=value, --key=value
IGNORED_BLOCK = r"^Exception ignored in\b"
# How far an `Exception ignored in:` block or a traceback is followed for its exception line.
BLOCK_LINES = 200

_SIGNS = [(cause, re.compile(pattern)) for cause, pattern in LINE_SIGNS]
_TRACEBACK = re.compile(TRACEBACK)
_EXCEPTION = re.compile(EXCEPTION_LINE)
_HARMLESS = re.compile(f"{WARNING}|{RETRY}")
_CONFIG = re.compile(CONFIG_ENTRY)
_IGNORED = re.compile(IGNORED_BLOCK)
_ANSI = re.compile(ANSI_PATTERN)
_RAY = re.compile(RAY_PREFIX_PATTERN)


@dataclass(frozen=True)
class Crash:
    """A fatal error: its cause (oom, nccl_timeout, ray, signal, traceback), the line that says it
    (ANSI-free, at most 300 characters) and its index among the lines read."""

    cause: str
    reason: str
    index: int

    def __str__(self) -> str:
        return self.reason


# A Ray worker told to stop (`(WorkerDict pid=7) *** SIGTERM received at time=...`): Ray ends its
# workers so when the driver shuts down, after a run that finished as much as after one that failed.
_WORKER_STOPPED = re.compile(r"\bSIGTERM\b")


def _from_a_worker(line: str) -> bool:
    return bool(_RAY.match(_ANSI.sub("", line)))


def plain(line: str) -> str:
    """A line without ANSI codes, carriage-return redraws before its last piece, or Ray prefix."""
    line = _ANSI.sub("", line).rstrip("\r\n")
    if "\r" in line:
        line = line.rsplit("\r", 1)[-1]
    return _RAY.sub("", line).rstrip()


def _exception_cause(line: str) -> str:
    name = line.split(":", 1)[0]
    if "OutOfMemory" in name:
        return "oom"
    if re.search(r"Ray(?:Task|Actor)Error|ActorDiedError", name):
        return "ray"
    if "NCCL" in name or "DistBackendError" in name:
        return "nccl_timeout"
    return "traceback"


_WRAPPED = re.compile(r"^[\w.]*Ray(?:Task|Actor)Error\(([\w.]+)\)")


def _wrapped_cause(texts: list[str], end: int, final: str) -> str:
    """For Ray's `RayTaskError(Name): ...`, the remote exception line `...Name: ...` printed in the
    worker's traceback below it (the error that killed the task), else `final` itself."""
    wrapped = _WRAPPED.match(final)
    if wrapped is None:
        return final
    name = wrapped.group(1)
    for line in texts[end + 1:end + 1 + BLOCK_LINES]:
        text = line.strip()
        if _EXCEPTION.match(text) and text.split(":", 1)[0].endswith(name) and not _WRAPPED.match(text):
            return text
    return final


def crashes(lines: Sequence[str], first_only: bool = False) -> list[Crash]:
    """The fatal errors of `lines` (see the module), in order; only the first with `first_only`."""
    found: list[Crash] = []
    texts = [plain(line) for line in lines]
    workers = [_from_a_worker(line) for line in lines]
    index = 0
    while index < len(texts):
        text = texts[index].strip()
        if _IGNORED.match(text):
            index = _block_end(texts, index) + 1
            continue
        if _TRACEBACK.match(text):
            end = _block_end(texts, index)
            final = texts[end].strip() if end > index else ""
            if final and _EXCEPTION.match(final) and not _HARMLESS.search(final.split(":", 1)[0]):
                final = _wrapped_cause(texts, end, final)
                found.append(Crash(_exception_cause(final), final[:300], end))
                index = end + 1
            else:
                index += 1
            if found and first_only:
                return found
            continue
        if text and not _HARMLESS.search(text) and not _CONFIG.match(text):
            for cause, pattern in _SIGNS:
                if pattern.search(text) and not (workers[index] and _WORKER_STOPPED.search(text)):
                    found.append(Crash(cause, text[:300], index))
                    break
            if found and first_only:
                return found
        index += 1
    return found


def first_crash(lines: Sequence[str]) -> Crash | None:
    """The first fatal error of `lines`, or None."""
    found = crashes(lines, first_only=True)
    return found[0] if found else None


def _block_end(texts: list[str], start: int) -> int:
    """The index of the exception line that ends the traceback (or `Exception ignored in:` block)
    begun at `start`: the first line after it, not indented, that names an exception; `start` when
    none follows within BLOCK_LINES."""
    for index in range(start + 1, min(len(texts), start + 1 + BLOCK_LINES)):
        line = texts[index]
        if line[:1].isspace() or not line:
            continue
        if _EXCEPTION.match(line.strip()):
            return index
        if _TRACEBACK.search(line) or line.startswith("During handling") or line.startswith("The above exception"):
            continue
    return start


def crash_start(lines: Sequence[str]) -> int | None:
    """The index of the line where the first crash of `lines` begins (a traceback's header, whether
    its final line has landed or not; a one-line sign), or None: what a follower of a growing log
    waits on before it names the crash from the lines since (`first_crash`). An `Exception ignored
    in:` block is passed over once its exception line has landed, and waited on until then."""
    texts = [plain(line) for line in lines]
    index = 0
    while index < len(texts):
        text = texts[index].strip()
        if _IGNORED.match(text):
            end = _block_end(texts, index)
            if end == index:
                return None
            index = end + 1
            continue
        if _TRACEBACK.match(text):
            end = _block_end(texts, index)
            final = texts[end].strip() if end > index else ""
            if end == index or not _HARMLESS.search(final.split(":", 1)[0]):
                return index
            index = end + 1
            continue
        if text and not _HARMLESS.search(text) and not _CONFIG.match(text) \
                and any(pattern.search(text) for _, pattern in _SIGNS) \
                and not (_from_a_worker(lines[index]) and _WORKER_STOPPED.search(text)):
            return index
        index += 1
    return None
