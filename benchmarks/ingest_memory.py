"""Peak memory of ingesting one large file, at two sizes, to see how it grows with the file.

Layouts, generated once under benchmarks/out/ingest_memory/:
  multiturn  a PolyTrace Search-R1 multi-turn trace (`multiturn_workload_step_0.jsonl`: one line per
             trajectory with its per-turn and per-tool-call lists), made by repeating the records of
             the real trace in ../shared/data (prompt groups renumbered) up to --multiturn-mb MB, and
             one of half that size;
  console    a verl console log as `ingest_console.py` writes it, --console-mb MB and half that.
Each figure is the peak resident memory (ru_maxrss of the child, which load does not change) of the
whole `polytrace ingest` process into a new on-disk store, beside the same for the file of half the
size and for the process's fixed cost (ingesting a one-line trace). Memory grows sub-linearly when
the large file's peak over the fixed cost is less than twice the half file's.
Targets: 20 MB multi-turn trace <= 400 MB, 100 MB console log <= 500 MB.
Usage: python benchmarks/ingest_memory.py [--only multiturn,console] [--multiturn-mb 20] [--console-mb 100]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from _measure import run_measured
from ingest_console import write_log

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "ingest_memory"
SEARCH_R1 = (HERE.parent.parent / "shared" / "data" / "polytrace" / "search_r1" / "profile" / "multiturn_workload_log"
             / "0617_0223" / "multiturn_workload_step_0.jsonl")


def write_multiturn(path: Path, megabytes: float) -> int:
    """Repeat the real Search-R1 records, each copy with its own prompt groups, up to `megabytes` MB;
    returns the number of trajectories."""
    records = [json.loads(line) for line in SEARCH_R1.read_text().splitlines() if line.strip()]
    groups = 1 + max(record["prompt_group_id"] for record in records)
    written = count = copy = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        while written < megabytes * 1e6:
            for record in records:
                line = json.dumps({**record, "prompt_group_id": record["prompt_group_id"] + copy * groups}) + "\n"
                handle.write(line)
                written += len(line)
                count += 1
            copy += 1
    return count


def peak_mb(log: Path, *options: str) -> tuple[float, float]:
    """(wall seconds, peak RSS MB) of one `polytrace ingest` of `log` into a new store."""
    store = OUT / "store.duckdb"
    for stale in (store, store.with_name(store.name + ".wal")):
        stale.unlink(missing_ok=True)
    os.sync()
    result = run_measured([sys.executable, "-m", "polytrace_cli.cli", "ingest", "--db", str(store), *options, str(log)])
    store.unlink(missing_ok=True)
    return result


def measure(name: str, files: dict[str, Path], target_mb: float, *options: str) -> None:
    results = {label: peak_mb(path, *options) for label, path in files.items()}
    print(f"{name}:")
    for label, (seconds, rss) in results.items():
        size = files[label].stat().st_size / 1e6
        print(f"  {label:6s} {size:7.1f} MB  peak RSS {rss:6.0f} MB  ({seconds:.2f} s, load {os.getloadavg()[0]:.1f})")
    base = results["fixed"][1]
    full, half = results["full"][1] - base, results["half"][1] - base
    print(f"  above the fixed cost: full {full:.0f} MB, half {half:.0f} MB: x{full / max(half, 1):.2f} for x2 the bytes"
          f" ({'sub-linear' if full < 2 * half else 'not sub-linear'}); target {target_mb:.0f} MB:"
          f" {'met' if results['full'][1] <= target_mb else 'not met'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="multiturn,console")
    parser.add_argument("--multiturn-mb", type=float, default=20.0)
    parser.add_argument("--console-mb", type=float, default=100.0)
    args = parser.parse_args()
    chosen = args.only.split(",")
    if "multiturn" in chosen:
        if not SEARCH_R1.exists():
            print(f"multiturn: skipped, {SEARCH_R1} is absent")
        else:
            files = {}
            for label, mb in (("full", args.multiturn_mb), ("half", args.multiturn_mb / 2), ("fixed", 0)):
                path = OUT / "multiturn" / label / "multiturn_workload_step_0.jsonl"
                if not path.exists():
                    write_multiturn(path, mb)
                files[label] = path
            measure("multiturn", files, 400)
    if "console" in chosen:
        files = {}
        for label, mb in (("full", args.console_mb), ("half", args.console_mb / 2), ("fixed", 0.0001)):
            path = OUT / "console" / label / "train.log"
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                write_log(path, mb)
            files[label] = path
        measure("console", files, 500, "--format", "verl-console")


if __name__ == "__main__":
    main()
