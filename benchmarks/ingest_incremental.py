"""Re-ingest of a grown console log: reading only the appended lines, beside the first ingest and the
start-up of any command, in one run.

Writes a verl console log of --mb MB (the generator of `ingest_console.py`), then measures, each
as a whole `polytrace` process (median of --repeat runs):
  first ingest   `polytrace ingest` of the log into a new store;
  appended       the log grown by --grow percent (more steps, numbered on), `polytrace ingest` into
                 a copy of that store: only the new lines are read (status appended);
  whole re-read  `polytrace ingest` of the grown log into a new store: what reading it again costs;
  start-up       `polytrace runs` on the store: a command that reads almost nothing; and
                 `polytrace ingest` of the grown log into the appended store again (status unchanged):
                 the ingest command's own start-up (its libraries, the sniff, the file's hash).
Checks that the appended store holds the rows of the whole read. Figures in benchmarks/results.md.
Usage: python benchmarks/ingest_incremental.py [--mb 50] [--grow 1] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import sys
from pathlib import Path

from _measure import run_measured
from ingest_console import write_log

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "ingest_incremental"
POLYTRACE = str(Path(sys.executable).with_name("polytrace"))


def grow(log: Path, megabytes: float, steps_before: int) -> int:
    """Append about `megabytes` MB of steps numbered after `steps_before`; returns the steps added."""
    extra = OUT / "extra.log"
    _, steps = write_log(extra, megabytes, seed=1)
    text = re.sub(r"step:(\d+) - ", lambda m: f"step:{int(m.group(1)) + steps_before} - ", extra.read_text())
    with open(log, "a") as handle:
        handle.write(text)
    extra.unlink()
    return steps


def timed(argv: list[str], repeat: int, before=None) -> list[float]:
    runs = []
    for _ in range(repeat):
        if before:
            before()
        os.sync()
        runs.append(run_measured(argv)[0])
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=50.0, help="size of the first log in MB")
    parser.add_argument("--grow", type=float, default=1.0, help="growth in percent of the first log")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each (median reported)")
    args = parser.parse_args()
    shutil.rmtree(OUT, ignore_errors=True)
    (OUT / "run").mkdir(parents=True)
    log = OUT / "run" / "train.log"
    _, steps = write_log(log, args.mb)
    first_mb = log.stat().st_size / 1e6
    first, grown, whole = OUT / "first.duckdb", OUT / "grown.duckdb", OUT / "whole.duckdb"

    def fresh(store: Path):
        return lambda: store.unlink(missing_ok=True)

    ingest = [POLYTRACE, "ingest", "--format", "verl-console", "--db"]
    first_runs = timed([*ingest, str(first), str(log)], args.repeat, fresh(first))
    added = grow(log, args.mb * args.grow / 100, steps)
    grown_mb = log.stat().st_size / 1e6
    appended_runs = timed([*ingest, str(grown), str(log)], args.repeat, lambda: shutil.copy(first, grown))
    whole_runs = timed([*ingest, str(whole), str(log)], args.repeat, fresh(whole))
    startup_runs = timed([POLYTRACE, "runs", "--db", str(grown)], args.repeat)
    unchanged_runs = timed([*ingest, str(grown), str(log)], args.repeat)

    import duckdb

    counts = {}
    for name, store in (("appended", grown), ("whole", whole)):
        con = duckdb.connect(str(store), read_only=True)
        counts[name] = con.execute("SELECT (SELECT count(*) FROM step_metrics), (SELECT sum(lines) FROM files),"
                                   " (SELECT sum(stored) FROM files)").fetchall()[0]
        con.close()
    print(f"log: {first_mb:.1f} MB, {steps:,} steps; grown by {grown_mb - first_mb:.2f} MB ({added:,} steps)"
          f" to {grown_mb:.1f} MB")
    print(f"{'':28} {'median s':>9}  runs")
    for name, runs in (("first ingest", first_runs), ("appended (re-ingest, grown)", appended_runs),
                       ("whole re-read of grown log", whole_runs), ("start-up (polytrace runs)", startup_runs),
                       ("ingest start-up (unchanged)", unchanged_runs)):
        print(f"{name:28} {statistics.median(runs):9.2f}  " + ", ".join(f"{s:.2f}" for s in runs))
    beyond = statistics.median(appended_runs) - statistics.median(startup_runs)
    work = statistics.median(first_runs) - statistics.median(startup_runs)
    print(f"appended beyond start-up: {beyond:.2f} s = {beyond / work:.1%} of the first ingest's {work:.2f} s"
          " beyond start-up")
    own = statistics.median(appended_runs) - statistics.median(unchanged_runs)
    print(f"appended beyond the ingest start-up: {own:.2f} s = {own / work:.1%} of the first ingest's {work:.2f} s"
          " beyond start-up")
    print(f"rows (step_metrics, lines, stored): appended {counts['appended']}, whole {counts['whole']}")
    if counts["appended"] != counts["whole"]:
        raise SystemExit("the appended store differs from the whole read")


if __name__ == "__main__":
    main()
