"""Ingest speed for TRL console logs: polytrace against a plain-Python loop, in one run.

Writes a TRL GRPO console log under benchmarks/out/ (a progress bar redrawn with carriage returns
before each metrics dict of 16 keys, one dict per step), then measures:
  polytrace  the whole `polytrace ingest` process into a new on-disk store, --repeat times (the
             median wall time is the figure), peak RSS;
  baseline   plain Python: per line, the last progress-bar counter with `re`, the dict piece read
             with json.loads after swapping quotes, then one bulk insert into DuckDB.
Prints MB/s, steps/s, CPU seconds (user + system, all threads: what a loaded machine changes
least) and the ratios polytrace / baseline of both; and each side's fixed cost, the same process on
the log's first three lines (three dicts, each line with its carriage-return redraws).
Usage: python benchmarks/ingest_trl_console.py [--steps 50000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import textwrap
from pathlib import Path

import numpy as np

from _measure import fresh_log_path, run_child

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "ingest_trl_console"


def write_log(path: Path, steps: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    lengths = rng.uniform(150, 900, size=steps)
    seconds = 2.0 + 0.012 * lengths
    elapsed = np.cumsum(seconds)
    tokens = np.cumsum((lengths + 150) * 64)
    with path.open("w") as handle:
        previous = f"  0%|          | 0/{steps} [00:00<?, ?it/s]"
        for i in range(steps):
            minutes, secs = divmod(int(elapsed[i]), 60)
            bar = f"{100 * (i + 1) // steps:3d}%|█         | {i + 1}/{steps} [{minutes:02d}:{secs:02d}<01:00, {seconds[i]:.2f}s/it]"
            metrics = {"loss": 0.0012, "grad_norm": 0.31, "learning_rate": 1e-06, "num_tokens": float(tokens[i]),
                       "completions/mean_length": float(lengths[i]), "completions/min_length": 12.0,
                       "completions/max_length": float(lengths[i] * 2), "completions/clipped_ratio": 0.0,
                       "rewards/accuracy_reward/mean": 0.5, "reward": 0.5, "reward_std": 0.3,
                       "frac_reward_zero_std": 0.25, "kl": 0.002, "entropy": 0.7,
                       "step_time": float(round(seconds[i], 3)), "epoch": round((i + 1) / steps, 2)}
            handle.write(f"\r{previous}\r{bar}\r{' ' * 40}\r{metrics!r}\n")
            previous = bar


BASELINE = textwrap.dedent(
    """
    import json, re, sys
    import duckdb, pyarrow as pa
    log, db = sys.argv[1], sys.argv[2]
    counter = re.compile(r"(\\d+)/\\d+ \\[")
    cols = {"step": [], "key": [], "value": []}
    step = None
    with open(log, encoding="utf-8") as handle:
        for line in handle:
            found = counter.findall(line)
            if found:
                step = int(found[-1])
            start = line.rfind("{'")
            if start < 0:
                continue
            for key, value in json.loads(line[start:].replace("'", '"')).items():
                cols["step"].append(step)
                cols["key"].append(key)
                cols["value"].append(float(value))
    con = duckdb.connect(db)
    rows = pa.table(cols)
    con.execute("CREATE TABLE step_metrics AS SELECT * FROM rows")
    con.close()
    """
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50_000, help="metrics dicts (steps) in the generated log")
    parser.add_argument("--repeat", type=int, default=3, help="timed polytrace runs (median reported)")
    args = parser.parse_args()
    log = fresh_log_path(OUT, "train.log")
    write_log(log, args.steps)
    os.sync()
    size_mb = log.stat().st_size / 1e6
    print(f"log: {size_mb:.1f} MB, {args.steps:,} steps x 16 keys")
    store = OUT / "store.duckdb"
    polytrace = Path(sys.executable).with_name("polytrace")
    runs = []
    for _ in range(args.repeat):
        store.unlink(missing_ok=True)
        os.sync()
        runs.append(run_child([str(polytrace), "ingest", "--db", str(store), "--format", "trl-console", str(log)]))
    ours, ours_cpu, ours_rss = (statistics.median(s for s, _, _ in runs), statistics.median(c for _, c, _ in runs),
                                max(r for _, _, r in runs))
    print("polytrace runs: " + ", ".join(f"{s:.2f} s ({c:.2f} s CPU)" for s, c, _ in runs))
    # The process's fixed cost (start-up, a new store, the run's record): the log's first three dicts.
    head = log.with_name("head.log")
    # Split at newlines alone: a line's carriage-return redraws belong to it (read_text would make them lines).
    head.write_bytes(b"\n".join(log.read_bytes().split(b"\n", 3)[:3]) + b"\n")
    head_store = OUT / "head.duckdb"
    head_store.unlink(missing_ok=True)
    fixed, fixed_cpu, _ = run_child([str(polytrace), "ingest", "--db", str(head_store), "--format", "trl-console",
                                     str(head)])
    print(f"polytrace on 3 dicts (fixed cost): {fixed:.2f} s ({fixed_cpu:.2f} s CPU)")
    script = OUT / "run" / "baseline.py"
    script.write_text(BASELINE)
    baseline_store = OUT / "run" / "baseline.duckdb"
    baseline_store.unlink(missing_ok=True)
    theirs, theirs_cpu, theirs_rss = run_child([sys.executable, str(script), str(log), str(baseline_store)])
    baseline_store.unlink(missing_ok=True)
    head_base, head_base_cpu, _ = run_child([sys.executable, str(script), str(head), str(baseline_store)])
    print(f"baseline on 3 dicts (its fixed cost): {head_base:.2f} s ({head_base_cpu:.2f} s CPU)")

    import duckdb

    con = duckdb.connect(str(store), read_only=True)
    stored = con.execute("SELECT count(*) FROM step_metrics").fetchall()[0][0]
    con.close()
    print(f"{'':10} {'seconds':>8} {'CPU s':>8} {'MB/s':>8} {'steps/s':>11} {'peak MB':>8}")
    for name, seconds, cpu, rss in (("polytrace", ours, ours_cpu, ours_rss), ("baseline", theirs, theirs_cpu, theirs_rss)):
        print(f"{name:10} {seconds:8.2f} {cpu:8.2f} {size_mb / seconds:8.1f} {args.steps / seconds:11,.0f} {rss:8.0f}")
    # polytrace also stores num_tokens/per_step for every step.
    print(f"ratio polytrace / baseline: {theirs / ours:.2f}x wall, {theirs_cpu / ours_cpu:.2f}x CPU"
          f"   (step_metrics rows {stored:,},"
          f" expected {args.steps * 17:,})")
    if stored != args.steps * 17:
        raise SystemExit("polytrace stored a different number of rows than the log holds")


if __name__ == "__main__":
    main()
