"""Start-up cost of the command line, next to the cost of opening a DuckDB store at all.

Times, as the median of --repeat child processes each:
  help      `polytrace --help`
  runs      `polytrace runs` on a small store (one ingested trace)
  ingest    `polytrace ingest` of a one-line PolyTrace trace into a fresh store
  baseline  `python -c "import duckdb; duckdb.connect(store)"`: the floor any command that reads
            the store pays
Each --source is a checkout of the project (the default is this one); its figures are printed in a
column of their own, so two versions of the start-up code can be compared side by side.
Usage: python benchmarks/cli_start.py [--repeat N] [--source DIR ...]
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRACE_LINE = ('{"step": 0, "rank": 0, "dp_rank": 0, "tp_rank": 0, "local_index": 0, "input": 5, '
              '"output": [1, 2], "n_sampling": 2, "validate": false}\n')
NAMES = ("help", "runs", "ingest", "baseline")
CLI = "import sys; from polytrace_cli.cli import main; sys.argv[0] = 'polytrace'; main()"


def timed(argv: list[str], source: Path, folder: Path) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one child process run with `source` first on the
    import path. CPU time barely moves with machine load; wall time is what a user waits. The child
    runs in `folder`, outside any checkout: `python -c` puts its working folder ahead of PYTHONPATH."""
    env = dict(os.environ, PYTHONPATH=str(source))
    started = time.perf_counter()
    process = subprocess.Popen(argv, env=env, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    if status != 0:
        raise SystemExit(f"{argv[2:]} failed under {source}: {process.stderr.read().decode()[-500:]}")
    process.stderr.close()
    return seconds, usage.ru_utime + usage.ru_stime


def cases(source: Path, scratch: Path) -> dict[str, Callable[[], tuple[float, float]]]:
    """The timed runs for one checkout, each a callable returning (wall, CPU) seconds."""
    compileall.compile_dir(source / "polytrace_cli", quiet=1)
    python = sys.executable
    trace = scratch / "run" / "packed_lengths_step_0.jsonl"
    trace.parent.mkdir(parents=True, exist_ok=True)
    trace.write_text(TRACE_LINE)
    store = scratch / "small.duckdb"
    timed([python, "-c", CLI, "ingest", str(trace), "--db", str(store)], source, scratch)

    def fresh_ingest() -> tuple[float, float]:
        target = scratch / "fresh.duckdb"
        target.unlink(missing_ok=True)
        return timed([python, "-c", CLI, "ingest", str(trace), "--db", str(target)], source, scratch)

    return {
        "help": lambda: timed([python, "-c", CLI, "--help"], source, scratch),
        "runs": lambda: timed([python, "-c", CLI, "runs", "--db", str(store)], source, scratch),
        "ingest": fresh_ingest,
        "baseline": lambda: timed([python, "-c", f"import duckdb; duckdb.connect({str(store)!r}).close()"], source, scratch),
    }


def measure(sources: list[Path], scratch: Path, repeat: int) -> dict[Path, dict[str, tuple[float, float]]]:
    """Median (wall, CPU) seconds of each measurement per checkout. The checkouts take turns run by run, so a
    change in machine load touches every column alike."""
    timers = {source: cases(source, scratch / str(number)) for number, source in enumerate(sources)}
    samples: dict[Path, dict[str, list[tuple[float, float]]]] = {source: {name: [] for name in NAMES} for source in sources}
    for round_no in range(repeat + 1):
        for name in NAMES:
            for source in sources:
                seconds = timers[source][name]()
                if round_no:  # the first round only warms the file cache
                    samples[source][name].append(seconds)
    return {source: {name: (statistics.median(v[0] for v in values), statistics.median(v[1] for v in values))
                     for name, values in by_name.items()}
            for source, by_name in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="runs per measurement (the median is printed)")
    parser.add_argument("--source", type=Path, action="append", help="a checkout of the project (repeatable)")
    args = parser.parse_args()
    sources = [path.resolve() for path in (args.source or [HERE.parent])]
    scratch_root = Path(tempfile.mkdtemp(prefix="cli_start_"))
    try:
        columns = measure(sources, scratch_root, args.repeat)
    finally:
        shutil.rmtree(scratch_root, ignore_errors=True)
    load = os.getloadavg()[0]
    print(f"median of {args.repeat} runs, ms: wall / CPU (load average {load:.1f})")
    width = max(14, *(len(source.name) + 2 for source in sources))
    print(f"{'':10}" + "".join(f"{source.name:>{width}}" for source in sources))
    for name in NAMES:
        cells = (f"{columns[source][name][0] * 1000:.0f} / {columns[source][name][1] * 1000:.0f}" for source in sources)
        print(f"{name:10}" + "".join(f"{cell:>{width}}" for cell in cells))

if __name__ == "__main__":
    main()
