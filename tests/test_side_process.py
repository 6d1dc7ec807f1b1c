"""A forked child's work comes back whole, and a child that fails or is cancelled costs nothing."""

from __future__ import annotations

import os
import time

import polars as pl
import pytest

from polytrace_cli import side_process

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


@pytest.fixture
def two_cpus(monkeypatch):
    monkeypatch.setattr(side_process.os, "cpu_count", lambda: 2)


def test_the_childs_value_comes_back(two_cpus):
    parent = os.getpid()
    # More than a pipe's buffer (64 KiB), so the child blocks on the write until the parent reads.
    pending = side_process.start(lambda: (os.getpid(), pl.DataFrame({"x": list(range(50_000))})))
    assert pending is not None
    child_pid, frame = side_process.finish(pending, lambda: pytest.fail("the child did the work"))
    assert child_pid not in (parent, None) and frame["x"].sum() == sum(range(50_000))


def test_a_failing_child_leaves_the_work_to_this_process(two_cpus):
    parent = os.getpid()

    def work():
        if os.getpid() != parent:
            raise RuntimeError("not in the child")
        return "done here"

    assert side_process.finish(side_process.start(work), work) == "done here"


def test_a_value_that_cannot_be_pickled_is_computed_here(two_cpus):
    parent = os.getpid()
    value = side_process.finish(side_process.start(lambda: (lambda: None) if os.getpid() != parent else "here"),
                                lambda: "here")
    assert value == "here"


def test_one_cpu_means_no_child(monkeypatch):
    monkeypatch.setattr(side_process.os, "cpu_count", lambda: 1)
    assert side_process.start(lambda: 1) is None
    assert side_process.finish(None, lambda: 7) == 7


def test_cancel_stops_a_running_child(two_cpus):
    pending = side_process.start(lambda: time.sleep(60))
    started = time.monotonic()
    pending.cancel()
    assert time.monotonic() - started < 10
    with pytest.raises(ChildProcessError):
        os.waitpid(pending.pid, os.WNOHANG)  # already reaped
    pending.cancel()  # a second cancel is harmless


def test_only_a_marked_process_without_a_polars_pool_is_fresh():
    """The command line marks its process fresh; a query starts polars' pool, after which a child
    may not use polars. (In a subprocess: this test process has long used polars.)"""
    import subprocess
    import sys

    from conftest import PROJECT_ROOT

    code = (
        "from polytrace_cli import side_process\n"
        "import polars as pl\n"
        "before = side_process.fresh()\n"
        "side_process.mark_fresh()\n"
        "marked = side_process.fresh()\n"
        "pl.DataFrame({'a': range(100_000)}).group_by('a').len()\n"
        "print(before, marked, side_process.fresh())\n"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                               env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
    assert completed.stdout.split() == ["False", "True", "False"], completed.stderr
    assert not side_process.fresh()
