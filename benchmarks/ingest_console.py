"""Ingest speed for verl console logs: polytrace against a plain-Python regex loop, in one run.

Writes a large, realistic verl console log under benchmarks/out/ (Ray prefixes in ANSI colour, numpy
repr values, ~110 keys per metric line, and per step a tqdm update, warnings, worker log lines
and a pprinted dict), then measures:
  polytrace  the whole `polytrace ingest` process into a new on-disk store, --repeat times (the
             median wall time is the figure; the best is printed too), peak RSS;
  baseline   plain Python: per line, strip ANSI and the Ray prefix with `re`, anchor `step:`,
             split the pairs, unwrap and float() each value, then one bulk insert into DuckDB.
Prints MB/s, lines/s and the ratio polytrace / baseline.
With --clock, what reading the printed times costs (ingest/console/clock.py) instead: the same log, and
the same steps with every line stamped as `kubectl logs --timestamps` prints them (one step a minute),
each ingested --repeat times, the two kinds taking turns; prints the median wall and CPU seconds of each
and the stamped log's extra seconds per metric line, and checks that both stores hold the same rows and
the stamped one a console clock for every step.
Usage: python benchmarks/ingest_console.py [--mb 100] [--repeat 3] [--clock]
"""

from __future__ import annotations

import argparse
import os
import statistics
import textwrap
from pathlib import Path

import numpy as np

from _measure import baseline_run, ingest_runs, fresh_log_path

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "ingest_console"
PREFIX = "\x1b[36m(TaskRunner pid=14640)\x1b[0m "

KEYS = (
    [f"timing_s/{stage}" for stage in ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "step",
                                        "generate_sequences", "reshard")]
    + [f"timing_per_token_ms/{stage}" for stage in ("gen", "ref", "adv", "update_actor")]
    + [f"{group}/{stat}" for group in ("response_length", "prompt_length") for stat in ("mean", "max", "min", "clip_ratio")]
    + [f"global_seqlen/{stat}" for stat in ("min", "max", "minmax_diff", "balanced_min", "balanced_max", "mean")]
    + ["perf/total_num_tokens", "perf/time_per_step", "perf/throughput", "perf/mfu/actor", "perf/max_memory_allocated_gb"]
    + [f"actor/{name}" for name in ("entropy", "pg_loss", "pg_clipfrac", "ppo_kl", "grad_norm", "lr", "kl_loss")]
    + [f"critic/{group}/{stat}" for group in ("score", "rewards", "advantages", "returns") for stat in ("mean", "max", "min")]
    + [f"val-core/task{i:02d}/reward/mean@8" for i in range(40)]
    + [f"val-aux/task{i:02d}/acc/best@8/std" for i in range(20)]
    + ["training/global_step", "training/epoch"]
)


# The printed time of the first step of a stamped log (--clock), and the seconds between two steps.
CLOCK_START, CLOCK_STEP_S = 1_735_689_600.0, 60.0


def kubectl_stamp(seconds: float) -> str:
    """`kubectl logs --timestamps`' prefix: RFC 3339 in UTC with nanoseconds."""
    from datetime import datetime, timezone

    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


def write_log(path: Path, megabytes: float, seed: int = 0, stamped: bool = False,
              steps_wanted: int | None = None) -> tuple[int, int]:
    """A log of about `megabytes` MB (or of `steps_wanted` steps); `stamped`: every line begins with the
    time of its step (`kubectl_stamp`, CLOCK_STEP_S apart). Returns (lines, metric lines)."""
    rng = np.random.default_rng(seed)
    target = megabytes * 1e6
    written = lines = steps = 0
    with open(path, "w") as handle:
        while (written < target) if steps_wanted is None else (steps < steps_wanted):
            steps += 1
            values = rng.lognormal(0.0, 2.0, len(KEYS))
            pairs = []
            for key, value in zip(KEYS, values):
                if key.startswith(("perf/total", "response_length/max", "prompt_length/max", "training/")):
                    pairs.append(f"{key}:np.int64({int(value * 1000)})")
                else:
                    pairs.append(f"{key}:np.float64({float(value)!r})")
            block = [
                f"{PREFIX}step:{steps} - " + " - ".join(pairs),
                f"Training Progress:  {steps % 100}%|███       | {steps}/99999 [1:10:40<6:31:06, 64.47s/it]\r"
                f"Training Progress:  {steps % 100}%|███       | {steps}/99999 [1:11:40<6:31:06, 64.47s/it]",
                f"{PREFIX}/opt/verl/verl/utils/torch_functional.py:12: UserWarning: clip_grad_norm_ is deprecated",
                "(WorkerDict pid=3001, ip=10.0.0.2) INFO 01-05 10:00:00 model_runner.py:1 Graph capturing finished",
                "(WorkerDict pid=3001, ip=10.0.0.2) kwargs: n=8 temperature=1.0 [repeated 7x across cluster]",
                f"{PREFIX}{{'val-core/task00/reward/mean@8': {float(values[0])!r},",
                f"{PREFIX} 'val-aux/task00/acc/best@8/std': {float(values[1])!r}}}",
                f"{PREFIX}local_global_step_folder: checkpoints/global_step_{steps}",
            ]
            if stamped:
                stamp = kubectl_stamp(CLOCK_START + steps * CLOCK_STEP_S)
                block = [f"{stamp} {line}" for line in block]
            text = "\n".join(block) + "\n"
            handle.write(text)
            written += len(text.encode())
            lines += len(block)
    return lines, steps


BASELINE = textwrap.dedent(
    r"""
    import re, sys, duckdb, pyarrow as pa
    path, db = sys.argv[1], sys.argv[2]
    ansi = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
    prefix = re.compile(r"^\s*(?:\([A-Za-z_][\w.\-]* pid=\d+(?:, ip=[0-9A-Fa-f.:]+)?\)\s*)+")
    anchor = re.compile(r"^step:(\d+) - (.*)$")
    wrapped = re.compile(r"^np\.[a-z_]+\d*\((.*)\)$")
    cols = {"line_no": [], "step": [], "key": [], "value": []}
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            line = prefix.sub("", ansi.sub("", line.rstrip("\n").split("\r")[-1]))
            m = anchor.match(line)
            if not m:
                continue
            step = int(m.group(1))
            for pair in m.group(2).split(" - "):
                key, _, text = pair.partition(":")
                w = wrapped.match(text)
                cols["line_no"].append(line_no); cols["step"].append(step); cols["key"].append(key)
                cols["value"].append(float(w.group(1) if w else text))
    con = duckdb.connect(db)
    rows = pa.table(cols)
    con.execute("CREATE TABLE step_metrics AS SELECT * FROM rows")
    con.close()
    """
)


def clock_cost(megabytes: float, repeat: int) -> None:
    """The --clock run (module docstring)."""
    import sys

    import duckdb

    from _measure import run_child

    plain = fresh_log_path(OUT, "train.log")
    lines, steps = write_log(plain, megabytes)
    stamped = plain.with_name("stamped.log")
    stamped_lines, stamped_steps = write_log(stamped, megabytes, stamped=True, steps_wanted=steps)
    assert (stamped_lines, stamped_steps) == (lines, steps)
    os.sync()
    polytrace = Path(sys.executable).with_name("polytrace")
    timed: dict[str, list[tuple[float, float]]] = {"plain": [], "stamped": []}
    for _ in range(repeat):
        for name, log in (("plain", plain), ("stamped", stamped)):
            store = OUT / f"{name}.duckdb"
            store.unlink(missing_ok=True)
            os.sync()
            wall, cpu, _ = run_child([str(polytrace), "ingest", "--db", str(store), "--format", "verl-console",
                                      str(log)])
            timed[name].append((wall, cpu))
    counts = {}
    for name in timed:
        con = duckdb.connect(str(OUT / f"{name}.duckdb"), read_only=True)
        counts[name] = con.execute("SELECT (SELECT count(*) FROM step_metrics), (SELECT count(*) FROM step_clock"
                                   " WHERE source = 'console')").fetchall()[0]
        con.close()
    print(f"logs: {steps:,} metric lines x {len(KEYS)} keys, {lines:,} lines; plain {plain.stat().st_size / 1e6:.1f} MB,"
          f" stamped {stamped.stat().st_size / 1e6:.1f} MB")
    print(f"{'':8} {'wall s':>8} {'cpu s':>8}   runs (wall/cpu)")
    medians = {}
    for name, runs in timed.items():
        medians[name] = (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
        print(f"{name:8} {medians[name][0]:8.2f} {medians[name][1]:8.2f}   "
              + ", ".join(f"{w:.2f}/{c:.2f}" for w, c in runs))
    for label, index in (("wall", 0), ("cpu", 1)):
        extra = medians["stamped"][index] - medians["plain"][index]
        print(f"printed times cost ({label}): {extra:+.2f} s = {extra / medians['plain'][index]:+.1%},"
              f" {extra / steps * 1e6:+,.0f} us per metric line")
    print(f"rows: plain {counts['plain'][0]:,}, stamped {counts['stamped'][0]:,}; console clock steps: plain"
          f" {counts['plain'][1]:,}, stamped {counts['stamped'][1]:,} of {steps:,}")
    if counts["plain"][0] != counts["stamped"][0] or counts["plain"][1] or counts["stamped"][1] != steps:
        raise SystemExit("the stamped log's store differs from the plain one's")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0, help="size of the generated log in MB")
    parser.add_argument("--repeat", type=int, default=3, help="timed polytrace runs (median and best reported)")
    parser.add_argument("--clock", action="store_true",
                        help="time the log with and without printed times instead (module docstring)")
    args = parser.parse_args()
    if args.clock:
        clock_cost(args.mb, args.repeat)
        return
    log = fresh_log_path(OUT, "train.log")
    lines, steps = write_log(log, args.mb)
    os.sync()  # the log's dirty pages go to disk now, not during the timed ingest
    size_mb = log.stat().st_size / 1e6
    print(f"log: {size_mb:.1f} MB, {lines:,} lines, {steps:,} metric lines x {len(KEYS)} keys")

    store = OUT / "store.duckdb"
    runs = ingest_runs(log, store, args.repeat, "--format", "verl-console")
    ours, ours_rss = statistics.median(s for s, _ in runs), max(r for _, r in runs)
    print("polytrace runs: " + ", ".join(f"{s:.2f} s" for s, _ in runs)
          + f"; best {min(s for s, _ in runs):.2f} s = {size_mb / min(s for s, _ in runs):.1f} MB/s; median below")
    theirs, theirs_rss, _ = baseline_run(BASELINE, OUT, log)

    import duckdb

    con = duckdb.connect(str(store), read_only=True)
    stored = con.execute("SELECT count(*) FROM step_metrics").fetchall()[0][0]
    con.close()
    expected = steps * len(KEYS)
    print(f"{'':10} {'seconds':>8} {'MB/s':>8} {'lines/s':>11} {'peak MB':>8}")
    for name, seconds, rss in (("polytrace", ours, ours_rss), ("baseline", theirs, theirs_rss)):
        print(f"{name:10} {seconds:8.2f} {size_mb / seconds:8.1f} {lines / seconds:11,.0f} {rss:8.0f}")
    print(f"ratio polytrace / baseline: {theirs / ours:.2f}x   (step_metrics rows {stored:,}, expected {expected:,})")
    if stored != expected:
        raise SystemExit("row count mismatch")


if __name__ == "__main__":
    main()
