"""Ingest of a folder of many small runs: `--engine local` against `--engine ray` with 1 and 2 workers.

Writes 24 runs with `polytrace synth` (math, code and search presets in turn: packed lengths, DAPO
filter batches, reward timings, multi-turn trajectories) under benchmarks/out/, then measures, in
this one run, each whole `polytrace ingest` process into a fresh on-disk store:
  local       --engine local (the default)
  ray, 1      --engine ray --workers 1 (a local Ray started by the command, one worker CPU)
  ray, 2      --engine ray --workers 2
  ray start   a bare `ray.init(num_cpus=2)` + `ray.shutdown()`: the fixed cost inside the Ray figures
and checks that the three stores hold the same rows in every file-owned table, `files` and `runs`
(ids and timings aside). Usage: python benchmarks/ingest_ray.py [--runs N] [--steps N] [--batch N]
"""

from __future__ import annotations

import argparse
import math
import shutil
import subprocess
import sys
from pathlib import Path

from _measure import run_measured

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "ingest_ray"
TASKS = ("math", "code", "search")

RAY_START = (
    "import logging, ray\n"
    "ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)\n"
    "ray.shutdown()\n"
)


def write_runs(root: Path, runs: int, steps: int, batch: int) -> None:
    """`runs` synthetic runs under root/run_NN, tasks in turn, each with its own seed."""
    for index in range(runs):
        task = TASKS[index % len(TASKS)]
        subprocess.run([sys.executable, "-m", "polytrace_cli.cli", "synth", "--task", task, "--out",
                        str(root / f"run_{index:02d}_{task}"), "--num-steps", str(steps), "--batch", str(batch),
                        "--n", "8", "--dp-ranks", "4", "--seed", str(index)], check=True, stdout=subprocess.DEVNULL)


def snapshot(db: Path) -> dict[str, list]:
    """The stored rows, as the Ray test compares them."""
    import duckdb

    sys.path.insert(0, str(HERE.parent))
    from polytrace_cli.ingest.base import file_owned_tables

    con = duckdb.connect(str(db), read_only=True)
    out = {}
    for table in file_owned_tables(con):
        columns = {row[0] for row in con.execute(
            "SELECT column_name FROM duckdb_columns() WHERE table_name = ?", [table]).fetchall()}
        dropped = ", ".join(c for c in ("file_id", "run_id") if c in columns)
        out[table] = con.execute(f"SELECT r.name, f.path, t.* EXCLUDE ({dropped}) FROM {table} t JOIN files f "
                                 "USING (file_id) JOIN runs r ON r.run_id = f.run_id ORDER BY ALL").fetchall()
    out["files"] = con.execute("SELECT r.name, f.* EXCLUDE (file_id, run_id, seconds, ingested_at) FROM files f "
                               "JOIN runs r USING (run_id) ORDER BY ALL").fetchall()
    out["runs"] = con.execute("SELECT * EXCLUDE (run_id, created_at) FROM runs ORDER BY ALL").fetchall()
    con.close()
    return {t: [tuple("NaN" if isinstance(v, float) and math.isnan(v) else v for v in row) for row in rows]
            for t, rows in out.items()}


def main() -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=24)
    parser.add_argument("--steps", type=int, default=8, help="steps per run")
    parser.add_argument("--batch", type=int, default=128, help="prompts per step (x8 responses)")
    args = parser.parse_args()
    try:
        import ray  # noqa: F401
    except ModuleNotFoundError:
        print("skipped: Ray is not installed (pip install 'polytrace[ray]')")
        return []
    shutil.rmtree(OUT, ignore_errors=True)
    logs = OUT / "logs"
    write_runs(logs, args.runs, args.steps, args.batch)
    files = [p for p in logs.rglob("*") if p.is_file()]
    size_mb = sum(p.stat().st_size for p in files) / 1e6
    polytrace = [sys.executable, "-m", "polytrace_cli.cli", "ingest", str(logs)]
    methods = [("local", []), ("ray, 1 worker", ["--engine", "ray", "--workers", "1"]),
               ("ray, 2 workers", ["--engine", "ray", "--workers", "2"])]
    results, stores = [], []
    for name, options in methods:
        store = OUT / f"{name.replace(' ', '_').replace(',', '')}.duckdb"
        seconds, rss = run_measured(polytrace + ["--db", str(store), *options])
        results.append({"method": name, "seconds": seconds, "rss_mb": rss})
        stores.append(store)
    seconds, rss = run_measured([sys.executable, "-c", RAY_START])
    results.append({"method": "ray start + shutdown alone (2 CPUs)", "seconds": seconds, "rss_mb": rss})

    reference = snapshot(stores[0])
    same = all(snapshot(store) == reference for store in stores[1:])
    samples = len(reference.get("sample_groups", [])) and sum(len(row[-1]) for row in reference["sample_groups"])
    print(f"logs: {args.runs} runs, {len(files)} files, {size_mb:,.1f} MB, {samples:,} packed response lengths")
    print(f"{'method':38s} {'seconds':>8s} {'MB/s':>7s} {'driver peak RSS MB':>19s}")
    for r in results:
        rate = f"{size_mb / r['seconds']:7.1f}" if not r["method"].startswith("ray start") else "      -"
        print(f"{r['method']:38s} {r['seconds']:8.2f} {rate} {r['rss_mb']:19.0f}")
    print(f"stores identical (every file-owned table, files, runs): {'yes' if same else 'NO'}")
    shutil.rmtree(OUT, ignore_errors=True)
    if not same:
        raise SystemExit("the Ray ingest stored something other than the local ingest")
    return results


if __name__ == "__main__":
    main()
