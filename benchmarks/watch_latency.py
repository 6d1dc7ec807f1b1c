"""How soon `polytrace watch` tells a step after the line that ends it is written.

Writes a generated verl console log (the project's step-log generator, 60 steps) line by line into a
file that `polytrace watch --json --poll 0.1` follows in a child process, and notes, per step, the
time its `step:` line was about to be written and the time the watcher's `step` event arrived. Prints
the median, 90th percentile and largest delay, beside the poll interval (the least a poll-based reader
can promise) and the target: every step told within 4 s of its line.
Usage: python benchmarks/watch_latency.py [--steps N] [--line-delay SECONDS]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from polytrace_cli.workload.distributions import LengthModel, Marginal  # noqa: E402
from polytrace_cli.workload.steplog import StepTimeModel, console_text, step_table  # noqa: E402
from polytrace_cli.workload.synth import WorkloadSpec  # noqa: E402

POLL = 0.1
TARGET_S = 4.0
STEP_PREFIX = "(TaskRunner pid=27182) step:"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--line-delay", type=float, default=0.005)
    args = parser.parse_args()
    lengths = LengthModel(prompt=Marginal("lognorm", {"s": 0.2, "scale": 100.0}),
                          response=Marginal("lognorm", {"s": 0.5, "scale": 800.0}))
    spec = WorkloadSpec(task="math", steps=args.steps, batch=16, n=4, dp_ranks=4, max_response_len=4500,
                        drift=0.005, seed=11)
    model = StepTimeModel()
    lines = console_text(step_table(lengths, spec, model), spec, model).splitlines(keepends=True)
    with tempfile.TemporaryDirectory() as folder:
        log, db = Path(folder) / "train.log", Path(folder) / "watched.duckdb"
        log.write_text("")
        process = subprocess.Popen(
            [sys.executable, "-m", "polytrace_cli.cli", "watch", str(log), "--db", str(db), "--json",
             "--poll", str(POLL), "--idle-exit", "2"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
        arrived: dict[int, float] = {}

        def read() -> None:
            for line in process.stdout:
                event = json.loads(line)
                if event.get("event") == "step":
                    arrived.setdefault(event["step"], time.monotonic())

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        while not db.exists():
            time.sleep(0.05)
        written: dict[int, float] = {}
        with open(log, "a", encoding="utf-8") as handle:
            for line in lines:
                if line.startswith(STEP_PREFIX):
                    written.setdefault(int(line[len(STEP_PREFIX):].split(" ")[0]), time.monotonic())
                handle.write(line)
                handle.flush()
                time.sleep(args.line_delay)
        process.wait(timeout=120)
        reader.join(5)
    delays = sorted(arrived[step] - at for step, at in written.items() if step in arrived)
    missing = sorted(set(written) - set(arrived))
    if not delays:
        print("no step was told")
        return 1
    p90 = delays[min(len(delays) - 1, int(0.9 * len(delays)))]
    print(f"steps told: {len(delays)} of {len(written)} (never told: {missing or 'none'})")
    print(f"delay after the step's line: median {statistics.median(delays):.3f} s, p90 {p90:.3f} s, "
          f"max {delays[-1]:.3f} s (poll {POLL} s; target: every step within {TARGET_S:g} s)")
    return 0 if delays[-1] <= TARGET_S and not missing else 1


if __name__ == "__main__":
    sys.exit(main())
