"""Painting a report's figures on two cores writes exactly what painting them one by one writes."""

from __future__ import annotations

import os
import time

from polytrace_cli import side_process
from polytrace_cli.report import painting, style


def _figures(count: int):
    figures = []
    for index in range(count):
        figure, (ax,) = style.new_figure(width=4.0, height=2.0)
        ax.plot([0, 1, 2], [index, index + 1, index * 2])
        ax.set_title(f"figure {index}")
        figures.append(figure)
    return figures


def test_two_processes_write_the_same_files_as_one(tmp_path, monkeypatch):
    figures = _figures(5)
    serial = [(figure, tmp_path / f"serial_{i}.png", None) for i, figure in enumerate(figures)]
    monkeypatch.setattr(side_process.os, "cpu_count", lambda: 1)
    painting.paint_all(serial)
    monkeypatch.setattr(side_process.os, "cpu_count", lambda: 2)
    parent = os.getpid()
    painted_by = tmp_path / "painted_by"
    painted_by.mkdir()

    def paint(figure, png, svg):
        (painted_by / png.name).write_text(str(os.getpid()))
        return painting.paint_file(figure, png, svg)

    forked = [(figure, tmp_path / f"forked_{i}.png", tmp_path / f"forked_{i}.svg") for i, figure in enumerate(figures)]
    alongside = []
    seconds = painting.paint_all(forked, paint, alongside=lambda: alongside.append(time.sleep(0.5)))
    assert len(seconds) == 5 and all(s > 0 for s in seconds) and len(alongside) == 1
    for index in range(5):
        assert (tmp_path / f"forked_{index}.png").read_bytes() == (tmp_path / f"serial_{index}.png").read_bytes()
        assert (tmp_path / f"forked_{index}.svg").stat().st_size > 0
    painters = [(painted_by / f"forked_{i}.png").read_text() for i in range(5)]
    # The child paints from the start, while this process sleeps in `alongside`: the first figure is its.
    assert painters[0] != str(parent)


def test_the_two_processes_share_the_jobs_without_painting_one_twice(tmp_path, monkeypatch):
    monkeypatch.setattr(side_process.os, "cpu_count", lambda: 2)
    log = tmp_path / "log"

    def paint(figure, png, svg):
        with log.open("a") as out:  # one short append per job: the two processes' lines do not mix
            out.write(f"{png.name} {os.getpid()}\n")
        time.sleep(0.05)
        return 0.05

    figures = _figures(1) * 20
    seconds = painting.paint_all([(figures[0], tmp_path / f"f{i}.png", None) for i in range(20)], paint)
    assert seconds == [0.05] * 20
    lines = log.read_text().split()
    names, pids = lines[::2], lines[1::2]
    assert sorted(names) == sorted(f"f{i}.png" for i in range(20))  # each job once
    assert len(set(pids)) == 2  # both took jobs


def test_a_failing_child_leaves_its_share_to_the_parent(tmp_path, monkeypatch):
    monkeypatch.setattr(side_process.os, "cpu_count", lambda: 2)
    parent = os.getpid()

    def paint(figure, png, svg):
        if os.getpid() != parent:
            raise RuntimeError("the child cannot paint")
        return painting.paint_file(figure, png, svg)

    jobs = [(figure, tmp_path / f"f{i}.png", None) for i, figure in enumerate(_figures(4))]
    seconds = painting.paint_all(jobs, paint, alongside=lambda: time.sleep(0.2))  # the child takes a job first
    assert len(seconds) == 4 and all(s > 0 for s in seconds)
    assert all((tmp_path / f"f{i}.png").stat().st_size > 0 for i in range(4))
