"""Ingest speed for TRL console logs: polytrace against a plain-Python loop, in one run.

Writes a TRL GRPO console log under benchmarks/out/ (a progress bar redrawn with carriage returns
before each metrics dict of 16 keys, one dict per step), then measures:
  polytrace  the whole `polytrace ingest` process into a new on-disk store, --repeat times (the
             median wall time is the figure), peak RSS;
  baseline   plain Python: per line, the last progress-bar counter with `re`, the dict piece read
             with json.loads after swapping quotes, then one bulk insert into DuckDB.
Prints MB/s, steps/s, CPU seconds (user + system, all threads: what a loaded machine changes
least) and the ratios polytrace / baseline of both; and each side's fixed cost, the same process on
the log's first three lines (three dicts, each line with its carriage-return redraws), with the CPU
seconds each spends beyond it and their ratio.
With --layout, one of the layouts real TRL runs leave instead (`LAYOUTS`), made from the same log:
  interleaved  stdout and stderr in one file (`2>&1` to a pipe): the bar's draws as they happen, the
               dicts in clumps as stdout's buffer fills;
  stages       several trainings in one file (--stages), each its own bar and end-of-training dict;
  rotated      the run cut in two, `train.log.1` and the `train.log` it was rotated into, read as a folder;
each ingested --repeat times, taking turns with the single-stage log of as many steps; prints both
figures and the layout's cost beside it, and checks the rows each store holds.
Usage: python benchmarks/ingest_trl_console.py [--steps 50000] [--repeat 3] [--layout NAME] [--stages 3]
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


# How a TRL run's console output reaches a file. transformers' ProgressCallback.on_log prints each dict with
# `self.training_bar.write(str(shallow_logs))` (huggingface/transformers@55093b758b338fdc7903e778509523d755ae080d,
# src/transformers/trainer_callback.py), and tqdm's `tqdm.write` (tqdm/tqdm, tqdm/std.py) writes the message to
# sys.stdout while the bar draws on sys.stderr: under `2>&1` to a file or pipe, stdout is block-buffered
# (STDOUT_BUFFER bytes) and stderr is not, so the dicts arrive in clumps after the draws of their steps.
LAYOUTS = ("single", "interleaved", "stages", "rotated")
STDOUT_BUFFER = 8192
KEYS_STORED = 17  # a dict's 16 keys and the num_tokens/per_step polytrace derives from them


def _lines(path: Path) -> list[str]:
    """The file's lines, each with its newline; the carriage returns of the bar's draws kept within them."""
    return [line + "\n" for line in path.read_bytes().decode().split("\n")[:-1]]


def _records(path: Path) -> list[tuple[str, str]]:
    """The single-stage log's lines (`write_log`) as (what stderr drew: the bar's draws and the clear
    before the dict, what stdout wrote: the dict and its newline)."""
    records = []
    for line in _lines(path):
        cut = line.rindex("\r") + 1
        records.append((line[:cut], line[cut:]))
    return records


def write_interleaved(single: Path, path: Path) -> None:
    """The single-stage log as stdout and stderr interleave in one file: each step's draws at once, the
    dicts when STDOUT_BUFFER bytes of them are pending (and the rest at exit)."""
    pending, size = [], 0
    with path.open("w") as handle:
        for drawn, printed in _records(single):
            handle.write(drawn)
            pending.append(printed)
            size += len(printed.encode())
            if size >= STDOUT_BUFFER:
                handle.write("".join(pending))
                pending, size = [], 0
        handle.write("".join(pending))


def write_stages(path: Path, steps: int, stages: int) -> None:
    """`stages` trainings of steps / stages steps each, one after the other in one file (a script that
    trains several times, or a job started again into the same log), each with its own bar from 0 and
    the end-of-training dict the Trainer logs after its last step."""
    per_stage = steps // stages
    with path.open("w") as handle:
        for stage in range(stages):
            part = path.with_name(f"stage{stage}.log")
            write_log(part, per_stage, seed=stage)
            handle.write(part.read_bytes().decode())
            part.unlink()
            runtime = 2.0 * per_stage
            handle.write(repr({"train_runtime": runtime, "train_samples_per_second": 3.2,
                               "train_steps_per_second": round(per_stage / runtime, 3), "train_loss": 0.01,
                               "epoch": 1.0}) + "\n")


def write_rotated(single: Path, folder: Path) -> list[Path]:
    """The single-stage log rotated at its middle line: the older half as `train.log.1`, the rest as
    `train.log`, whose first line begins with the bar drawn on since (what a size-based rotation of
    the file leaves)."""
    lines = _lines(single)
    older, newer = folder / "train.log.1", folder / "train.log"
    older.write_text("".join(lines[:len(lines) // 2]))
    newer.write_text("".join(lines[len(lines) // 2:]))
    return [older, newer]


def layout_run(layout: str, steps: int, repeat: int, stages: int) -> None:
    """The --layout run (module docstring): the layout's log(s) and the single-stage log of as many steps,
    each ingested `repeat` times in turn; medians of wall and CPU seconds, and the rows each stored."""
    import shutil

    import duckdb

    single = fresh_log_path(OUT, "train.log")
    write_log(single, steps)
    folder = OUT / layout
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    if layout == "interleaved":
        write_interleaved(single, folder / "train.log")
    elif layout == "stages":
        write_stages(folder / "train.log", steps, stages)
        steps = steps // stages * stages
        single = fresh_log_path(OUT, "train.log")
        write_log(single, steps)
    else:
        write_rotated(single, folder)
    os.sync()
    sizes = {"single": single.stat().st_size / 1e6, layout: sum(p.stat().st_size for p in folder.iterdir()) / 1e6}
    inputs = {"single": [single], layout: sorted(folder.iterdir())}
    polytrace = Path(sys.executable).with_name("polytrace")
    timed: dict[str, list[tuple[float, float]]] = {"single": [], layout: []}
    for _ in range(repeat):
        for name in timed:
            store = OUT / f"{name}.duckdb"
            store.unlink(missing_ok=True)
            os.sync()
            wall, cpu, _ = run_child([str(polytrace), "ingest", "--db", str(store), "--format", "trl-console",
                                      "--run", "r", *map(str, inputs[name])])
            timed[name].append((wall, cpu))
    print(f"{layout}: {steps:,} steps x 16 keys in {', '.join(p.name for p in inputs[layout])}")
    print(f"{'':12} {'MB':>6} {'wall s':>8} {'CPU s':>8} {'steps/s':>10} {'rows':>10}   runs (wall/CPU)")
    medians, rows, pairs = {}, {}, {}
    for name, runs in timed.items():
        con = duckdb.connect(str(OUT / f"{name}.duckdb"), read_only=True)
        rows[name] = con.execute("SELECT count(*) FROM step_metrics").fetchall()[0][0]
        pairs[name] = set(con.execute("SELECT step, key, value FROM step_metrics").fetchall())
        con.close()
        medians[name] = (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
        print(f"{name:12} {sizes[name]:6.1f} {medians[name][0]:8.2f} {medians[name][1]:8.2f}"
              f" {steps / medians[name][0]:10,.0f} {rows[name]:10,}   " + ", ".join(f"{w:.2f}/{c:.2f}" for w, c in runs))
    print(f"{layout} / single: {medians[layout][0] / medians['single'][0]:.2f}x wall,"
          f" {medians[layout][1] / medians['single'][1]:.2f}x CPU")
    # The rotated-into log's first dict has no num_tokens/per_step: the count before it is in the older file.
    expected = {"single": steps * KEYS_STORED, layout: steps * KEYS_STORED - (layout == "rotated")}
    if rows != expected:
        raise SystemExit(f"rows stored: {rows}, expected {expected}")
    # Interleaved or rotated, the same run: its steps, keys and values are the single log's.
    if layout != "stages" and not pairs[layout] <= pairs["single"]:
        raise SystemExit(f"{len(pairs[layout] - pairs['single']):,} (step, key, value) rows not in the single log's store")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50_000, help="metrics dicts (steps) in the generated log")
    parser.add_argument("--repeat", type=int, default=3, help="timed polytrace runs (median reported)")
    parser.add_argument("--layout", choices=LAYOUTS, default="single",
                        help="time one of the layouts real runs leave instead (module docstring)")
    parser.add_argument("--stages", type=int, default=3, help="trainings in the file of --layout stages")
    args = parser.parse_args()
    if args.layout != "single":
        layout_run(args.layout, args.steps, args.repeat, args.stages)
        return
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
    # What each side costs per step beyond its fixed cost (the same process on three dicts): the work that grows
    # with the log, apart from interpreter start-up, imports and the new store.
    ours_work, theirs_work = ours_cpu - fixed_cpu, theirs_cpu - head_base_cpu
    print(f"CPU s beyond the fixed cost: polytrace {ours_work:.2f}, baseline {theirs_work:.2f}"
          f" (ratio {theirs_work / ours_work:.2f}x; {1e6 * ours_work / args.steps:.1f} against"
          f" {1e6 * theirs_work / args.steps:.1f} CPU us per step)")
    if stored != args.steps * 17:
        raise SystemExit("polytrace stored a different number of rows than the log holds")


if __name__ == "__main__":
    main()
