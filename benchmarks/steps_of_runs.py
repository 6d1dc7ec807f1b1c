"""Reading one run's steps as a store grows: the `steps` view against `catalog.steps_of_runs_sql`, in one run.

Writes a verl console log of --steps steps (20 timers and length aggregates per step) under
benchmarks/out/steps_of_runs/, ingests a copy of it as each of --runs runs into one on-disk store, and
at 1, 10 and --runs runs measures, taking turns, the CPU milliseconds of reading the first run's steps
into a polars frame:
  view       `SELECT <columns> FROM steps WHERE run_id = ?` (the view over every run and column, the run
             filter and the columns left to DuckDB to push down);
  own pairs  the same columns from `steps_of_runs_sql` (the run's pairs alone, aggregated as the view
             aggregates them); checked to give the same rows as the view;
and the whole step frame (`analyze.step_frame.step_frame`), which reads its steps the second way.
Prints the median of --repeat turns of each.
Usage: python benchmarks/steps_of_runs.py [--steps 300] [--runs 100] [--repeat 7]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "steps_of_runs"
TIMERS = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "testing", "save_checkpoint")
COLUMNS = ["step_s", *(f"{timer}_s" for timer in TIMERS if timer not in ("testing", "save_checkpoint")),
           "testing_s", "save_checkpoint_s", "response_length_mean", "response_length_max", "total_tokens"]


def write_log(path: Path, steps: int) -> None:
    lines = []
    for step in range(1, steps + 1):
        timers = {f"timing_s/{timer}": 1.0 + (step * 7 + i) % 5 for i, timer in enumerate(TIMERS[:6])}
        pairs = {**timers, "timing_s/step": sum(timers.values()) + 0.5,
                 "response_length/mean": 300.0 + step % 50, "response_length/max": 900.0 + step % 70,
                 "response_length/min": 10.0, "prompt_length/mean": 120.0, "actor/pg_loss": 0.01,
                 "actor/entropy": 0.5, "critic/score/mean": 0.4, "perf/total_num_tokens": 51200.0 + step,
                 "perf/throughput": 900.0, "actor/grad_norm": 0.2}
        lines.append(f"step:{step} - " + " - ".join(f"{key}:{value}" for key, value in pairs.items()))
    path.write_text("\n".join(lines) + "\n")


def cpu_ms(function, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.process_time()
        function()
        times.append(1000 * (time.process_time() - started))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    from polytrace_cli import Store
    from polytrace_cli.analyze.common import frame
    from polytrace_cli.analyze.step_frame import step_frame
    from polytrace_cli.ingest.driver import ingest_paths
    from polytrace_cli.store.catalog import steps_of_runs_sql

    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    log = OUT / "train.log"
    write_log(log, args.steps)
    store = Store.open(OUT / "store.duckdb")
    con = store.connection
    counts = sorted({1, min(10, args.runs), args.runs})
    listed = ", ".join(["run_id", "segment", "step", *COLUMNS, "is_validation_only", "has_testing", "has_checkpoint",
                        "truncated_line"])
    print(f"{args.steps} steps per run; CPU ms to read the first run's steps (median of {args.repeat})")
    print(f"{'runs':>6} {'pairs':>10} {'view':>8} {'own pairs':>10} {'ratio':>7} {'step frame':>11}")
    stored = 0
    for count in counts:
        while stored < count:
            folder = OUT / f"run{stored}"
            folder.mkdir()
            shutil.copy(log, folder / "train.log")
            ingest_paths(con, [folder], run_name=f"run{stored}")
            stored += 1
        first = con.execute("SELECT min(run_id) FROM runs").fetchall()[0][0]
        view_sql = f"SELECT {listed} FROM steps WHERE run_id = {first} ORDER BY segment, step"
        own_sql = f"SELECT {listed} FROM ({steps_of_runs_sql(f'({first})', COLUMNS)}) ORDER BY segment, step"
        if not frame(con, view_sql).equals(frame(con, own_sql)):
            raise SystemExit("the two reads disagree")
        view_times, own_times = [], []
        for _ in range(args.repeat):  # in turns, so that a change of the machine's speed falls on both
            view_times.append(cpu_ms(lambda: frame(con, view_sql), 1))
            own_times.append(cpu_ms(lambda: frame(con, own_sql), 1))
        view, own = statistics.median(view_times), statistics.median(own_times)
        whole = cpu_ms(lambda: step_frame(con, [first]), args.repeat)
        pairs = con.execute("SELECT count(*) FROM step_metrics").fetchall()[0][0]
        print(f"{count:6d} {pairs:10,} {view:8.1f} {own:10.1f} {view / own:6.1f}x {whole:11.1f}")
    store.close()


if __name__ == "__main__":
    main()
