"""Shared by the benchmark scripts: run a child process and measure it."""

from __future__ import annotations

import compileall
import functools
import os
import subprocess
import time
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "polytrace_cli"


@functools.cache
def compile_package() -> None:
    """Write the package's bytecode, as `pip install` does, so that no timed run compiles sources
    (a shell with PYTHONDONTWRITEBYTECODE set would otherwise compile them in every run)."""
    compileall.compile_dir(PACKAGE, quiet=1)


def run_measured(argv: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of one child process; exits with its stderr when it fails."""
    compile_package()
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    if status != 0:
        raise SystemExit(f"{argv[:3]} failed: {process.stderr.read().decode()[-500:]}")
    return seconds, usage.ru_maxrss / 1024
