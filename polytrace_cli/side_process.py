"""Work done in a forked child process while this one goes on: a report's second core.

    pending = start(work)              # forks; the child runs work() and sends back its pickled result
    ...                                # this process does its own share meanwhile
    value = finish(pending, work)      # the child's result, or work() run here when the child failed

A fork copies only the calling thread, so the child must not use anything whose threads run in
this process: a DuckDB connection opened before the fork, or polars once this process has run a
query (its thread pool starts then). A child that only paints figures uses neither. A child that
opens a store of its own is started only from a `fresh()` process: the command line's entry point
vouches that it has run nothing yet (`mark_fresh`), and no polars thread pool runs. A test or a
notebook that calls the library is never fresh, and computes everything in one process. The child
ends with os._exit, so no exit handler or buffered output of this process runs twice.
"""

from __future__ import annotations

import os
import pickle
import re
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

# Set by the command line's entry point before it runs a command (see `fresh`).
_FRESH = False
# Threads of a library runtime that a forked child cannot use: polars' pool and its async runtime.
_RUNTIME_THREAD = re.compile(r"polars-\d+|tokio-rt-worker")


@dataclass
class Pending(Generic[T]):
    """A child process computing a value: its pid and the read end of the pipe it writes to."""

    pid: int
    read_end: int
    done: bool = False

    def collect(self) -> tuple[bool, T | None]:
        """(True, value) once the child has sent its value; (False, None) when it failed."""
        with os.fdopen(self.read_end, "rb") as pipe:
            payload = pipe.read()
        _, status = os.waitpid(self.pid, 0)
        self.done = True
        if os.waitstatus_to_exitcode(status) != 0 or not payload:
            return False, None
        try:
            return True, pickle.loads(payload)
        except Exception:
            return False, None

    def cancel(self) -> None:
        """Stop the child when it has not been collected (this process failed or was interrupted)."""
        if self.done:
            return
        self.done = True
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.close(self.read_end)
        os.waitpid(self.pid, 0)


def can_fork() -> bool:
    """True when a second process would run on a core of its own and the fork is safe for this
    process: os.fork exists, there are two CPUs or more and no other Python thread runs."""
    return hasattr(os, "fork") and (os.cpu_count() or 1) >= 2 and threading.active_count() == 1


def mark_fresh() -> None:
    """Say that this process is a command line's and has run nothing yet: until it uses polars or
    opens a store, a forked child may open a store of its own and use polars."""
    global _FRESH
    _FRESH = True


def _runtime_threads_run() -> bool:
    """True when a polars runtime thread runs in this process (also when the threads cannot be read)."""
    try:
        tasks = os.listdir("/proc/self/task")
        names = [open(f"/proc/self/task/{task}/comm").read().strip() for task in tasks]
    except OSError:
        return True
    return any(_RUNTIME_THREAD.fullmatch(name) for name in names)


def fresh() -> bool:
    """True when `mark_fresh` was called and no polars runtime thread runs yet (the caller also
    makes sure no DuckDB connection is open)."""
    return _FRESH and not _runtime_threads_run()


def start(work: Callable[[], T]) -> Pending[T] | None:
    """Run `work` in a forked child; None when `can_fork()` is false (do the work here instead)."""
    if not can_fork():
        return None
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(read_end)
            payload = pickle.dumps(work(), protocol=pickle.HIGHEST_PROTOCOL)
            with os.fdopen(write_end, "wb") as pipe:
                pipe.write(payload)
            status = 0
        except BaseException:  # noqa: BLE001 - any failure leaves the work to the parent, which reports it
            pass
        finally:
            os._exit(status)
    os.close(write_end)
    return Pending(pid, read_end)


def finish(pending: Pending[T] | None, work: Callable[[], T]) -> T:
    """The child's value, or `work()` run in this process when there was no child or it failed."""
    if pending is not None:
        sent, value = pending.collect()
        if sent:
            return value
    return work()
