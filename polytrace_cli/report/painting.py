"""Writing the drawn figures' files, on two cores when there are two.

Painting a figure into a PNG is single-threaded CPU work in matplotlib's Agg renderer and takes
most of a report's time. Once every figure is drawn, the process forks: the child paints every
second figure while the parent paints the others, so no figure is drawn twice and nothing needs
pickling (the child has the figures already). The child only paints and writes files, then ends
without any exit handler; if it fails, the parent paints the child's share itself.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from matplotlib.figure import Figure

from polytrace_cli.report import style


def paint_file(figure: Figure, png: Path, svg: Path | None) -> float:
    """Write the figure as PNG (and SVG when `svg` is given); returns the seconds it took."""
    started = time.perf_counter()
    style.save_png(figure, png)
    if svg is not None:
        figure.savefig(svg)
    return time.perf_counter() - started


def paint_all(jobs: Sequence[tuple[Figure, Path, Path | None]],
              paint: Callable[[Figure, Path, Path | None], float] = paint_file) -> list[float]:
    """Paint every (figure, png, svg) job; returns each job's seconds, in order.

    Forks when there are at least two jobs and two CPUs and no other Python thread runs (a fork
    copies only the calling thread); otherwise paints them one after the other.
    """
    if len(jobs) < 2 or (os.cpu_count() or 1) < 2 or not hasattr(os, "fork") or threading.active_count() > 1:
        return [paint(*job) for job in jobs]
    theirs = list(range(1, len(jobs), 2))
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: paint its share, report the seconds, end without exit handlers
        status = 1
        try:
            os.close(read_end)
            seconds = [paint(*jobs[index]) for index in theirs]
            os.write(write_end, json.dumps(seconds).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    seconds = [0.0] * len(jobs)
    try:
        for index in range(0, len(jobs), 2):
            seconds[index] = paint(*jobs[index])
    finally:
        with os.fdopen(read_end, "rb") as pipe:
            reported = pipe.read()
        _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) == 0:
        for index, took in zip(theirs, json.loads(reported)):
            seconds[index] = took
    else:
        for index in theirs:
            seconds[index] = paint(*jobs[index])
    return seconds
