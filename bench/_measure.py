"""Shared by the benchmark scripts: run a child process and measure it."""

from __future__ import annotations

import os
import subprocess
import time


def run_measured(argv: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of one child process; exits with its stderr when it fails."""
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    if status != 0:
        raise SystemExit(f"{argv[:3]} failed: {process.stderr.read().decode()[-500:]}")
    return seconds, usage.ru_maxrss / 1024
