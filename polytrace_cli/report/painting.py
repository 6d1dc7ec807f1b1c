"""Writing the drawn figures' files, on two cores when there are two.

Painting a figure into a PNG is single-threaded CPU work in matplotlib's Agg renderer and takes
most of a report's time. Once every figure is drawn, the process forks (`side_process`): the child
paints every second figure while the parent paints the others, so no figure is drawn twice and no
figure is pickled (the child has them already; it sends back only its seconds). The child only
paints and writes files; if it fails, the parent paints the child's share itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from matplotlib.figure import Figure

from polytrace_cli.report import side_process, style


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
    paints every second job while this process paints the others and then runs `alongside`; otherwise
    the jobs are painted one after the other, then `alongside` runs. A child that fails leaves its
    share to this process.
    """
    theirs = list(range(1, len(jobs), 2))

    def paint_theirs() -> list[float]:
        return [paint(*jobs[index]) for index in theirs]

    pending = side_process.start(paint_theirs) if len(jobs) >= 2 else None
    if pending is None:
        seconds = [paint(*job) for job in jobs]
        if alongside is not None:
            alongside()
        return seconds
    seconds = [0.0] * len(jobs)
    try:
        for index in range(0, len(jobs), 2):
            seconds[index] = paint(*jobs[index])
        if alongside is not None:
            alongside()
    except BaseException:
        pending.cancel()
        raise
    for index, took in zip(theirs, side_process.finish(pending, paint_theirs)):
        seconds[index] = took
    return seconds
