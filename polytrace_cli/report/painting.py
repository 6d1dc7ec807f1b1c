"""Writing the drawn figures' files, on two cores when there are two.

Painting a figure into a PNG is single-threaded CPU work in matplotlib's Agg renderer and takes
most of a report's time. Once every figure is drawn, the process forks (`side_process`): the child
paints figures while the parent does its other work, then both paint what is left, so no figure is
drawn twice and no figure is pickled (the child has them already; it sends back only its seconds).
The child only paints and writes files; if it fails, the parent paints the child's share itself.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from matplotlib.figure import Figure

from polytrace_cli import side_process
from polytrace_cli.report import style


def paint_file(figure: Figure, png: Path, svg: Path | None) -> float:
    """Write the figure as PNG (and SVG when `svg` is given); returns the seconds it took."""
    started = time.perf_counter()
    style.save_png(figure, png)
    if svg is not None:
        figure.savefig(svg)
    return time.perf_counter() - started


def paint_all(jobs: Sequence[tuple[Figure, Path, Path | None]],
              paint: Callable[[Figure, Path, Path | None], float] = paint_file,
              alongside: Callable[[], None] | None = None) -> list[float]:
    """Paint every (figure, png, svg) job and run `alongside` (other work of this process); returns each
    job's seconds, in order.

    With two jobs or more and a second process to spare (`side_process.can_fork`), a forked child
    starts painting at once while this process runs `alongside`; then both take the jobs left, one at
    a time, from a shared queue (a pipe holding the jobs' indices, which the two read in turn), so
    neither waits for the other while jobs remain. Otherwise `alongside` runs, then the jobs are
    painted one after the other (also beyond QUEUE_LIMIT jobs). Jobs a failing child took are painted
    by this process.
    """
    if len(jobs) < 2 or len(jobs) > QUEUE_LIMIT or not side_process.can_fork():
        if alongside is not None:
            alongside()
        return [paint(*job) for job in jobs]
    queue = _job_queue(len(jobs))

    def paint_from_queue() -> dict[int, float]:
        done = {}
        while (index := _take(queue)) is not None:
            done[index] = paint(*jobs[index])
        return done

    pending = side_process.start(paint_from_queue)
    try:
        if alongside is not None:
            alongside()
        seconds = paint_from_queue()
    except BaseException:
        if pending is not None:
            pending.cancel()
        raise
    finally:
        os.close(queue)
    seconds |= side_process.finish(pending, dict)
    for index, job in enumerate(jobs):
        if index not in seconds:
            seconds[index] = paint(*job)
    return [seconds[index] for index in range(len(jobs))]


_INDEX = struct.Struct("<H")
# A pipe holds at least PIPE_BUF (512) bytes before a write blocks (POSIX): the most jobs the queue takes.
QUEUE_LIMIT = 512 // _INDEX.size


def _job_queue(count: int) -> int:
    """The read end of a pipe holding 0 .. count − 1, its write end closed (a read past them is EOF).
    Every index is written before anyone reads, and each read takes one whole index: a pipe serves
    concurrent reads one at a time."""
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"".join(_INDEX.pack(index) for index in range(count)))
    finally:
        os.close(write_end)
    return read_end


def _take(queue: int) -> int | None:
    data = os.read(queue, _INDEX.size)
    return _INDEX.unpack(data)[0] if data else None
