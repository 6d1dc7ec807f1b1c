"""Ingest speed for the layouts real runs write: many step files, many tiny files, a bad line.

Generates once (cached under benchmarks/out/ingest_layouts/) and times, in this one run:
  steps      400 `packed_lengths_step_N.jsonl` files of about 225 KB (93 MB, 6.5 M responses);
  tiny       5,000 one-line step files;
  bad line   one 93 MB trace with one line that is not JSON in the middle, and its clean twin.
Each figure is the whole `polytrace ingest` process into a new on-disk store (median of 3 of wall
and of CPU seconds, disk synced first, the worst peak RSS), printed beside its baseline measured in
the same run, the methods taking turns run by run: the plain-Python loop (json.loads per line, rows collected, one bulk insert into DuckDB) over
the same files, or the clean twin for the bad line. The step files are also read by DuckDB alone
(`read_json` with typed columns, no value checks, same layout): the floor of a read in DuckDB; and by DuckDB
with polytrace's strict decoding beside it, then also with its hashing, and nothing else (no store): the
floor of any ingest keeping both. The load average is printed beside each figure (the machine may be shared).
`--where` also runs one ingest of each chosen many-file layout under cProfile and prints where its
time goes (profiling slows the Python parts a little; DuckDB's parts are timed as they are; the
hashing and strict-decoding threads are not profiled: their time shows as the waits of the main one).
`--before CHECKOUT` also times `polytrace ingest` from an earlier checkout of the project (its
package imported from there), in turns with the others, and prints both ratios.
Usage: python benchmarks/ingest_layouts.py [--only steps,tiny,bad] [--repeat 3] [--where] [--before CHECKOUT]
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import sys
import textwrap
from pathlib import Path

import numpy as np

from _measure import run_child, run_measured

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "ingest_layouts"
N_SAMPLING = 16
STEP_FILES, LINES_PER_STEP = 400, 1_016  # 400 x 1,016 x 16 = 6.5 M responses
TINY_FILES = 5_000
BIG_LINES = STEP_FILES * LINES_PER_STEP


def trace_lines(first_index: int, count: int, rng: np.random.Generator) -> list[str]:
    """`count` packed-lengths lines (2 DP ranks, n_sampling 16) numbered from `first_index`."""
    prompts = rng.lognormal(5.0, 0.3, count).astype(int)
    outputs = np.minimum(rng.lognormal(6.5, 1.0, (count, N_SAMPLING)).astype(int) + 1, 20480)
    lines = []
    for i in range(count):
        index = first_index + i
        lines.append(
            f'{{"step": {index // LINES_PER_STEP}, "rank": {(index % 2) * 4}, "dp_rank": {index % 2}, "tp_rank": 0, '
            f'"local_index": {(index % LINES_PER_STEP) // 2}, "input": {prompts[i]}, '
            f'"output": [{", ".join(map(str, outputs[i]))}], "n_sampling": {N_SAMPLING}, "validate": false}}\n'
        )
    return lines


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("".join(lines))


def generate() -> dict[str, Path]:
    """The layouts, written once; a folder is reused when its completion marker exists."""
    layouts = {"steps": OUT / "steps", "tiny": OUT / "tiny", "bad": OUT / "bad", "clean": OUT / "clean"}
    marker = OUT / ".complete"
    if marker.exists():
        return layouts
    shutil.rmtree(OUT, ignore_errors=True)
    for folder in layouts.values():
        folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    every_line: list[str] = []
    for step in range(STEP_FILES):
        lines = trace_lines(step * LINES_PER_STEP, LINES_PER_STEP, rng)
        _write(layouts["steps"] / f"packed_lengths_step_{step}.jsonl", lines)
        every_line.extend(lines)
    tiny = trace_lines(0, TINY_FILES, rng)
    for step, line in enumerate(tiny):
        _write(layouts["tiny"] / f"packed_lengths_step_{step}.jsonl", [line])
    _write(layouts["clean"] / "packed_lengths_step_0.jsonl", every_line)
    middle = len(every_line) // 2
    every_line[middle] = every_line[middle][: len(every_line[middle]) // 2] + "\n"  # cut short: not JSON
    _write(layouts["bad"] / "packed_lengths_step_0.jsonl", every_line)
    marker.touch()
    return layouts


BASELINE = textwrap.dedent(
    """
    import json, sys, duckdb, pyarrow as pa
    from pathlib import Path
    folder, db = Path(sys.argv[1]), sys.argv[2]
    names = ("step", "rank", "dp_rank", "tp_rank", "local_index", "input", "validate", "output")
    cols = {k: [] for k in names}
    for path in sorted(folder.glob("*.jsonl")):
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                for k in names:
                    cols[k].append(r[k])
    con = duckdb.connect(db)
    rows = pa.table(cols)
    con.execute("CREATE TABLE sample_groups AS SELECT * FROM rows")
    con.close()
    """
)


# DuckDB alone, reading the files into the same one-row-per-line layout with its own lax typing
# (5.7 rounded into an integer, "5" read as 5): the floor a checked read is measured against.
DUCKDB_ALONE = textwrap.dedent(
    """
    import sys, duckdb
    from pathlib import Path
    folder, db = Path(sys.argv[1]), sys.argv[2]
    files = sorted(str(p) for p in folder.glob("*.jsonl"))
    con = duckdb.connect(db)
    con.execute("CREATE TABLE sample_groups AS SELECT * FROM read_json(?, format='newline_delimited', filename=true,"
                " columns={'step': 'INTEGER', 'rank': 'INTEGER', 'dp_rank': 'INTEGER', 'tp_rank': 'INTEGER',"
                " 'local_index': 'INTEGER', 'input': 'INTEGER', 'output': 'INTEGER[]', 'n_sampling': 'INTEGER',"
                " 'validate': 'BOOLEAN'})", [files])
    con.close()
    """
)


# What any strict ingest of the step files must do beyond DuckDB's read, and nothing else: the same read
# with polytrace's strict decoding of every file in a thread beside it (the check the issue keeps:
# DuckDB's reader types laxly), and with `hash` also the sha256 and line count of every file (what
# tells an unchanged or grown file at the next ingest) in a second thread. No store, no `files`
# rows, no checks of the stored rows: a floor under any ingest that keeps both.
REQUIRED_WORK = DUCKDB_ALONE.replace(
    "con = duckdb.connect(db)",
    textwrap.dedent(
        """
        import threading
        from polytrace_cli.ingest.files import hash_and_count
        from polytrace_cli.ingest.formats.polytrace.packed import PackedLengthsIngester
        from polytrace_cli.ingest.jsonl import strict_file_records
        refused = []
        def decode():  # a thread cannot end the process: the refusal is raised after the join
            refused.extend(path for path in files if not strict_file_records(path, PackedLengthsIngester.spec))
        jobs = [decode] + ([lambda: [hash_and_count(Path(path)) for path in files]] if sys.argv[3] == "hash" else [])
        threads = [threading.Thread(target=job) for job in jobs]
        for thread in threads:
            thread.start()
        con = duckdb.connect(db)
        """
    ),
).replace("con.close()", "con.close()\nfor thread in threads:\n    thread.join()\n"
          "if refused:\n    raise SystemExit(f'the strict decoder refused {refused[0]}')")


def folder_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.iterdir()) / 1e6


def timed_in_turns(methods: dict, repeat: int) -> dict[str, dict]:
    """Per method (name -> argv for a store): median wall and CPU seconds of `repeat` runs, the methods
    taking turns run by run (so each sees the same load), each into a new store with the disk synced
    first; the worst peak RSS and the 1-minute load average before each run."""
    results = {name: {"runs": [], "cpu": [], "rss": [], "load": []} for name in methods}
    for attempt in range(repeat):
        for name, argv_for_store in methods.items():
            store = OUT / f"store_{attempt}.duckdb"
            for stale in (store, store.with_name(store.name + ".wal")):
                stale.unlink(missing_ok=True)
            os.sync()
            result = results[name]
            result["load"].append(os.getloadavg()[0])
            took, cpu, peak = run_child(argv_for_store(store))
            result["runs"].append(took)
            result["cpu"].append(cpu)
            result["rss"].append(peak)
            store.unlink(missing_ok=True)
    for result in results.values():
        result.update(seconds=statistics.median(result["runs"]), cpu_seconds=statistics.median(result["cpu"]),
                      rss_mb=max(result["rss"]))
    return results


def show(name: str, mb: float, result: dict) -> None:
    runs = ", ".join(f"{s:.2f}" for s in result["runs"])
    loads = ", ".join(f"{value:.1f}" for value in result["load"])
    print(f"  {name:34s} {result['seconds']:7.2f} s  CPU {result['cpu_seconds']:5.2f} s  {mb / result['seconds']:7.1f} MB/s"
          f"  peak RSS {result['rss_mb']:5.0f} MB  (runs {runs}; load avg {loads})")


# Phases of one ingest, as the functions that carry them out (cumulative seconds under cProfile).
PHASES = [
    ("walk the folder", "files.py", "walk"),
    ("sniff each file (read and hash: a thread)", "runner.py", "_batch_member"),
    ("skip unchanged files", "runner.py", "_drop_unchanged"),
    ("typed read into the table, strict decoding", "runner.py", "_store_batch_direct"),
    ("  of which the read and INSERT (DuckDB)", "jsonl.py", "insert_typed_rows"),
    ("batch read into records (DuckDB), decoding", "jsonl.py", "load_batch_records"),
    ("write rows from records, files rows, commit", "runner.py", "_store_batch"),
    ("decide the runs' semantics", "runner.py", "decide_semantics"),
    ("open and close the store (checkpoint)", "ingest.py", "_ingest_into_store"),
]


def where_time_goes(folder: Path) -> None:
    """One profiled ingest of `folder`: the process's wall time and each phase's share of it."""
    import pstats

    store, profile = OUT / "where.duckdb", OUT / "where.prof"
    for stale in (store, store.with_name(store.name + ".wal")):
        stale.unlink(missing_ok=True)
    took, _ = run_measured([sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "polytrace_cli.cli", "ingest",
                            str(folder), "--db", str(store)])
    stats = pstats.Stats(str(profile)).stats
    print(f"  where the time goes (one profiled run, {took:.2f} s wall):")
    def cumulative(file_name: str, function: str) -> float:
        return sum(value[3] for (path, _, name), value in stats.items() if path.endswith(file_name) and name == function)

    accounted = 0.0
    for label, file_name, function in PHASES:
        seconds = cumulative(file_name, function)
        if function == "_ingest_into_store":
            seconds -= cumulative("runner.py", "ingest_paths")
        if not label.startswith(" "):
            accounted += seconds
        print(f"    {label:44s} {seconds:6.2f} s")
    print(f"    {'the rest (interpreter, imports, output)':44s} {took - accounted:6.2f} s")
    store.unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="steps,tiny,bad", help="comma-separated: steps, tiny, bad")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--where", action="store_true", help="also print where one ingest's time goes")
    parser.add_argument("--before", type=Path, help="an earlier checkout, its ingest timed in turns with this one")
    args = parser.parse_args()
    layouts = generate()
    polytrace = [sys.executable, "-m", "polytrace_cli.cli", "ingest"]
    chosen = args.only.split(",")

    def ingest(folder: Path):
        return lambda store: polytrace + [str(folder), "--db", str(store)]

    def plain(folder: Path):
        return lambda store: [sys.executable, "-c", BASELINE, str(folder), str(store)]

    before = args.before.resolve() if args.before else None
    if before:
        compileall.compile_dir(before / "polytrace_cli", quiet=1)

    def ingest_before(folder: Path):
        # `env` sets the earlier checkout first on the path; this folder holds no package to shadow it.
        return lambda store: ["env", f"PYTHONPATH={before}", *polytrace, str(folder), "--db", str(store)]

    for name, title in (("steps", f"{STEP_FILES} step files"), ("tiny", f"{TINY_FILES:,} one-line files")):
        if name not in chosen:
            continue
        folder = layouts[name]
        mb = folder_mb(folder)
        print(f"{title} ({mb:.1f} MB):")
        methods = {"polytrace ingest (whole process)": ingest(folder), "plain-Python loop": plain(folder)}
        if before:
            methods["polytrace ingest, before"] = ingest_before(folder)
        if name == "steps":
            methods["DuckDB alone, unchecked (floor)"] = (
                lambda store: [sys.executable, "-c", DUCKDB_ALONE, str(folder), str(store)])
            for label, extra in (("strict decoding", "decode"), ("strict decoding, hashing", "hash")):
                methods[f"DuckDB + {label}, no store"] = (
                    lambda store, extra=extra: [sys.executable, "-c", REQUIRED_WORK, str(folder), str(store), extra])
        results = timed_in_turns(methods, args.repeat)
        for method, result in results.items():
            show(method, mb, result)
        loop = results["plain-Python loop"]
        for label, method in (("polytrace", "polytrace ingest (whole process)"), ("before", "polytrace ingest, before")):
            if method not in results:
                continue
            ours = results[method]
            print(f"  {label} vs plain Python: {loop['seconds'] / ours['seconds']:.2f}x faster"
                  f" (CPU {loop['cpu_seconds'] / ours['cpu_seconds']:.2f}x)")
            if name == "steps":
                alone = results["DuckDB alone, unchecked (floor)"]
                print(f"  {label} vs DuckDB alone: {ours['seconds'] / alone['seconds']:.2f}x its time"
                      f" (CPU {ours['cpu_seconds'] / alone['cpu_seconds']:.2f}x)")
        if name == "steps":
            alone = results["DuckDB alone, unchecked (floor)"]
            for method in ("DuckDB + strict decoding, no store", "DuckDB + strict decoding, hashing, no store"):
                floor = results[method]
                print(f"  {method}: {floor['seconds'] / alone['seconds']:.2f}x DuckDB alone,"
                      f" {loop['seconds'] / floor['seconds']:.2f}x faster than plain Python")
            print(f"  the targets' limits this run: 1.5x DuckDB alone = {1.5 * alone['seconds']:.2f} s,"
                  f" 5x plain Python = {loop['seconds'] / 5:.2f} s")
        if args.where:
            where_time_goes(folder)
    if "bad" in chosen:
        mb = folder_mb(layouts["clean"])
        print(f"one {mb:.0f} MB file, one bad line in the middle:")
        methods = {"polytrace ingest, one bad line": ingest(layouts["bad"]),
                   "polytrace ingest, clean twin": ingest(layouts["clean"])}
        if before:
            methods["before, one bad line"] = ingest_before(layouts["bad"])
            methods["before, clean twin"] = ingest_before(layouts["clean"])
        results = timed_in_turns(methods, args.repeat)
        for method, result in results.items():
            show(method, mb, result)
        for label, prefix in (("polytrace", "polytrace ingest, "), ("before", "before, ")):
            if prefix + "clean twin" not in results:
                continue
            bad, clean = results[prefix + "one bad line"], results[prefix + "clean twin"]
            print(f"  {label} bad / clean: {bad['seconds'] / clean['seconds']:.2f}x"
                  f" (CPU {bad['cpu_seconds'] / clean['cpu_seconds']:.2f}x)")
    print("targets: steps >= 100 MB/s and >= 5x plain Python, peak RSS < 2 GB; tiny within 3x of plain Python;"
          " bad line within 2x of clean")


if __name__ == "__main__":
    main()
