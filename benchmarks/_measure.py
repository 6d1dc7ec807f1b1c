"""Shared by the benchmark scripts: run a child process and measure it."""

from __future__ import annotations

import compileall
import functools
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "polytrace_cli"


@functools.cache
def fresh_log_path(out: Path, name: str) -> Path:
    """`out/run/name` in an emptied `out/run` folder (the run folder the generated log is written into)."""
    out.mkdir(parents=True, exist_ok=True)
    folder = out / "run"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    return folder / name


def compile_package() -> None:
    """Write the package's bytecode, as `pip install` does, so that no timed run compiles sources
    (a shell with PYTHONDONTWRITEBYTECODE set would otherwise compile them in every run)."""
    compileall.compile_dir(PACKAGE, quiet=1)


def run_measured(argv: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of one child process; exits with its stderr when it fails."""
    seconds, _, rss = run_child(argv)
    return seconds, rss


def run_child(argv: list[str], env: dict | None = None) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds (user + system, all its threads) and peak RSS (MB) of one child
    process (with `env`, by default this one's); exits with its stderr when it fails. CPU time
    barely changes with the machine's load."""
    compile_package()
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    if status != 0:
        raise SystemExit(f"{argv[:3]} failed: {process.stderr.read().decode()[-500:]}")
    return seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def ingest_runs(log: Path, store: Path, repeat: int, *options: str) -> list[tuple[float, float]]:
    """(wall seconds, peak RSS MB) of `repeat` whole `polytrace ingest` processes of `log` (with
    `options`), each into a new store at `store`, the disk synced before each."""
    polytrace = Path(sys.executable).with_name("polytrace")
    runs = []
    for _ in range(repeat):
        store.unlink(missing_ok=True)
        os.sync()  # the previous store's removal is not left to the timed run
        runs.append(run_measured([str(polytrace), "ingest", "--db", str(store), *options, str(log)]))
    return runs


def baseline_run(script: str, folder: Path, log: Path) -> tuple[float, float, Path]:
    """(wall seconds, peak RSS MB, its store) of a plain-Python baseline `script` run on `log`; the
    script is written to `folder` and takes the log and a new store's path as arguments."""
    store, path = folder / "baseline.duckdb", folder / "baseline.py"
    store.unlink(missing_ok=True)
    path.write_text(script)
    seconds, rss = run_measured([sys.executable, str(path), str(log), str(store)])
    return seconds, rss, store


def stored_counts(store: Path) -> tuple[int, int, int]:
    """(step_metrics rows, lines read, lines stored) of a store: what two reads of the same log must share."""
    import duckdb

    con = duckdb.connect(str(store), read_only=True)
    try:
        return con.execute("SELECT (SELECT count(*) FROM step_metrics), (SELECT sum(lines) FROM files),"
                           " (SELECT sum(stored) FROM files)").fetchall()[0]
    finally:
        con.close()
