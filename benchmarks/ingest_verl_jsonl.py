"""Ingest speed for verl's file logger (JSON lines): polytrace against a plain-Python loop, in one run.

Writes a verl file-logger log under benchmarks/out/ (`{"step": N, "data": {...}}` per line, the ~110
keys of `ingest_console.KEYS`, a few bare NaN tokens and nulls as older and newer writers print
them), then measures:
  polytrace  the whole `polytrace ingest` process into a new on-disk store, --repeat times (the
             median wall time is the figure), peak RSS;
  baseline   plain Python: json.loads per line (with Python's own reading of NaN), one row per
             key/value pair, then one bulk insert into DuckDB.
Prints MB/s, pairs/s and the ratio polytrace / baseline; checks both stored every pair.
Usage: python benchmarks/ingest_verl_jsonl.py [--mb 100] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import textwrap
from pathlib import Path

import numpy as np

from _measure import baseline_run, ingest_runs, fresh_log_path
from ingest_console import KEYS

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "ingest_verl_jsonl"


def write_log(path: Path, megabytes: float, seed: int = 0) -> int:
    """A file-logger log of about `megabytes` MB; returns its number of lines (one step each)."""
    rng = np.random.default_rng(seed)
    target, written, steps = megabytes * 1e6, 0, 0
    with open(path, "w") as handle:
        while written < target:
            steps += 1
            values = rng.lognormal(0.0, 2.0, len(KEYS))
            data = {key: (int(value * 1000) if key.startswith(("perf/total", "training/")) else float(value))
                    for key, value in zip(KEYS, values)}
            text = json.dumps({"step": steps, "data": data})
            if steps % 50 == 0:
                text = text.replace('"actor/grad_norm": ', '"actor/grad_norm": NaN, "actor/old_grad_norm": ', 1)
            if steps % 70 == 0:
                text = text.replace('"actor/kl_loss": ', '"actor/kl_loss": null, "actor/old_kl_loss": ', 1)
            handle.write(text + "\n")
            written += len(text) + 1
    return steps


BASELINE = textwrap.dedent(
    r"""
    import json, sys, duckdb, pyarrow as pa
    path, db = sys.argv[1], sys.argv[2]
    cols = {"line_no": [], "step": [], "key": [], "value": []}
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            record = json.loads(line)
            step = record["step"]
            for key, value in record["data"].items():
                cols["line_no"].append(line_no); cols["step"].append(step); cols["key"].append(key)
                cols["value"].append(float("nan") if value is None else float(value))
    con = duckdb.connect(db)
    rows = pa.table(cols)
    con.execute("CREATE TABLE step_metrics AS SELECT * FROM rows")
    con.close()
    """
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0, help="size of the generated log in MB")
    parser.add_argument("--repeat", type=int, default=3, help="timed polytrace runs (median reported)")
    args = parser.parse_args()
    log = fresh_log_path(OUT, "metrics.jsonl")
    steps = write_log(log, args.mb)
    os.sync()
    size_mb = log.stat().st_size / 1e6
    print(f"log: {size_mb:.1f} MB, {steps:,} lines x ~{len(KEYS)} keys (load average {os.getloadavg()[0]:.1f})")

    store = OUT / "store.duckdb"
    runs = ingest_runs(log, store, args.repeat)
    ours, ours_rss = statistics.median(s for s, _ in runs), max(r for _, r in runs)
    theirs, theirs_rss, baseline_db = baseline_run(BASELINE, OUT, log)

    import duckdb

    counts = []
    for db in (store, baseline_db):
        con = duckdb.connect(str(db), read_only=True)
        counts.append(con.execute("SELECT count(*) FROM step_metrics").fetchall()[0][0])
        con.close()
    print("polytrace runs: " + ", ".join(f"{s:.2f} s" for s, _ in runs) + "; median below"
          f" (load average {os.getloadavg()[0]:.1f})")
    print(f"{'':10} {'seconds':>8} {'MB/s':>8} {'pairs/s':>11} {'peak MB':>8}")
    for name, seconds, rss in (("polytrace", ours, ours_rss), ("baseline", theirs, theirs_rss)):
        print(f"{name:10} {seconds:8.2f} {size_mb / seconds:8.1f} {counts[0] / seconds:11,.0f} {rss:8.0f}")
    print(f"ratio polytrace / baseline: {theirs / ours:.2f}x   (step_metrics rows: polytrace {counts[0]:,},"
          f" baseline {counts[1]:,})")
    if counts[0] != counts[1]:
        raise SystemExit("row count mismatch")


if __name__ == "__main__":
    main()
