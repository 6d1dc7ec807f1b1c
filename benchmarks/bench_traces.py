"""Profiler traces in, timelines out: polytrace against Holistic Trace Analysis (HTA), side by side.

1. A multi-rank PyTorch profiler trace set (`_trace_sets.py`: Kineto's layout, verl's file names,
   known truth) of --mb MB over --ranks ranks, generated once under benchmarks/out/traces/.
2. Reading it: `polytrace ingest` of the folder into a new store (a whole process: wall, CPU, peak
   RSS) against HTA's `TraceAnalysis(trace_dir=...)` load in a child process (its load's wall time and
   the peak RSS after it). Targets: polytrace ≥ 3x faster, ≤ 1/3 of HTA's peak memory.
3. Agreement, per rank, with HTA and with the generator's truth: GPU idle time (polytrace's `gpu
   kernels` spans: window − kernel union; HTA's `get_idle_time_breakdown`, summed over its
   categories) and GPU time per stage (polytrace's ranges on the GPU stream; HTA's
   `get_gpu_user_annotation_breakdown`). Target: within 1 %.
4. Memory growth: the peak RSS of `polytrace ingest` of a --memory-mb set and of one of half its size.
   Target: ≤ 600 MB for 1 GB, growing sub-linearly (the large set's peak over the fixed cost less than
   twice the half set's).
5. `polytrace export --format chrome-trace` of a --export-steps-step run (verl's file logger with
   stage timers, so its spans are synthesized), a whole process. Target ≤ 5 s.

HTA is a benchmark extra, not a dependency: `pip install holistictraceanalysis`; without it, --skip-hta.
Usage: python benchmarks/bench_traces.py [--mb 500] [--ranks 8] [--memory-mb 1000] [--export-steps 10000]
       [--skip-hta] [--only read,memory,export]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _measure import run_child
from _trace_sets import write_trace_set

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "traces"
POLYTRACE = Path(sys.executable).with_name("polytrace")

HTA_CHILD = r"""
import json, logging, resource, sys, time
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
started = time.perf_counter()
analysis = TraceAnalysis(trace_dir=sys.argv[1])
load_s = time.perf_counter() - started
own, workers = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
load_cpu = own.ru_utime + own.ru_stime + workers.ru_utime + workers.ru_stime  # with its parsing pool's
peak_mb = own.ru_maxrss / 1024
idle = {}
for rank in sorted(analysis.t.traces):
    frame, _ = analysis.get_idle_time_breakdown(ranks=[rank], visualize=False)
    idle[int(rank)] = float(frame["idle_time"].sum())
annotations = analysis.get_gpu_user_annotation_breakdown(visualize=False, num_kernels=10**6)
stage = {f"{int(r['rank'])}|{r['name']}": float(r["sum (us)"]) for r in annotations.to_dict("records")}
print(json.dumps({"load_s": load_s, "load_cpu": load_cpu, "peak_mb": peak_mb, "idle": idle, "stage": stage}))
"""


def _tree_rss_kb(root: int) -> int:
    """The resident memory of process `root` and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def run_tree(argv: list[str]) -> tuple[float, float, float, str]:
    """(wall seconds, CPU seconds of it and its reaped descendants, peak MB of the process tree sampled
    every 20 ms, stdout) of one child: HTA parses in a pool of worker processes, whose memory and CPU
    count as much as its own."""
    import os
    import tempfile

    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(argv, stdout=out, stderr=err, text=True)
        peak = 0
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            peak = max(peak, _tree_rss_kb(process.pid))
            time.sleep(0.02)
        seconds = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        if status != 0:
            raise SystemExit(f"{argv[:3]} failed: {err.read()[-800:]}")
        return seconds, usage.ru_utime + usage.ru_stime, peak / 1024, out.read()


def trace_set(megabytes: float, ranks: int) -> tuple[Path, dict]:
    """The generated set of about `megabytes` MB (written once) and its truth."""
    folder = OUT / f"set_{int(megabytes)}mb_{ranks}r"
    truth_path = folder / "truth.json"
    if truth_path.exists():
        return folder / "traces", json.loads(truth_path.read_text())
    shutil.rmtree(folder, ignore_errors=True)
    truth = write_trace_set(folder / "traces", megabytes, ranks=ranks)
    document = {"bytes": truth.bytes, "idle": {str(r): v for r, v in truth.gpu_idle_us.items()},
                "stage": {f"{r}|{s}": v for (r, s), v in truth.gpu_stage_us.items()}}
    truth_path.write_text(json.dumps(document))
    return folder / "traces", document


def polytrace_read(folder: Path, store: Path) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MB) of `polytrace ingest` of the folder into a new store."""
    store.unlink(missing_ok=True)
    return run_child([str(POLYTRACE), "ingest", "--db", str(store), "--run", "traces", str(folder)])


def polytrace_tree_peak(folder: Path, store: Path) -> float:
    """The same ingest's peak memory sampled as HTA's is (process tree, every 20 ms)."""
    store.unlink(missing_ok=True)
    return run_tree([str(POLYTRACE), "ingest", "--db", str(store), "--run", "traces", str(folder)])[2]


def polytrace_numbers(store: Path) -> dict:
    import duckdb

    con = duckdb.connect(str(store), read_only=True)
    try:
        idle = dict(con.execute("SELECT rank, sum(t1_us - t0_us - busy_us) FROM spans WHERE name = 'gpu kernels' "
                                "GROUP BY rank").fetchall())
        stage = {f"{rank}|{name}": seconds for rank, name, seconds in con.execute(
            "SELECT rank, name, sum(t1_us - t0_us) FROM spans WHERE lane = 'stream 7' AND name <> 'gpu kernels' "
            "GROUP BY ALL").fetchall()}
    finally:
        con.close()
    return {"idle": {str(k): v for k, v in idle.items()}, "stage": stage}


def worst_gap(ours: dict, theirs: dict) -> float:
    """The largest relative difference over the keys both have (and 1.0 when a key is missing)."""
    worst = 0.0
    for key in set(ours) | set(theirs):
        if key not in ours or key not in theirs:
            return 1.0
        a, b = float(ours[key]), float(theirs[key])
        worst = max(worst, abs(a - b) / max(abs(b), 1e-9))
    return worst


def read_and_compare(args) -> None:
    folder, truth = trace_set(args.mb, args.ranks)
    print(f"trace set: {truth['bytes'] / 1e6:.0f} MB in {args.ranks} files ({folder})")
    store = OUT / "read.duckdb"
    seconds, cpu, rss = polytrace_read(folder, store)
    ours = polytrace_numbers(store)
    print(f"polytrace ingest: {seconds:.1f} s wall, {cpu:.1f} s CPU, peak {rss:.0f} MB")
    print(f"  against truth: idle per rank within {worst_gap(ours['idle'], truth['idle']):.2e}, "
          f"GPU time per stage within {worst_gap(ours['stage'], truth['stage']):.2e}")
    if args.skip_hta:
        return
    child_s, hta_cpu, hta_peak, out = run_tree([sys.executable, "-c", HTA_CHILD, str(folder)])
    hta = json.loads(out.strip().splitlines()[-1])
    tree = polytrace_tree_peak(folder, store)
    print(f"HTA TraceAnalysis load: {hta['load_s']:.1f} s wall, {hta['load_cpu']:.1f} s CPU (with its pool's); peak of its process tree {hta_peak:.0f} MB "
          f"(its main process {hta['peak_mb']:.0f} MB; child {child_s:.1f} s and {hta_cpu:.1f} s CPU with its breakdowns); "
          f"polytrace's sampled the same way {tree:.0f} MB")
    print(f"  against truth: idle per rank within {worst_gap({str(k): v for k, v in hta['idle'].items()}, truth['idle']):.2e}, "
          f"GPU time per stage within {worst_gap(hta['stage'], truth['stage']):.2e}")
    idle_gap = worst_gap(ours["idle"], {str(k): v for k, v in hta["idle"].items()})
    stage_gap = worst_gap(ours["stage"], hta["stage"])
    print("| trace set | polytrace read | HTA load | speed-up, wall and CPU (≥ 3x) | polytrace peak | HTA peak "
          "| memory ratio (≤ 1/3) | idle per rank vs HTA (≤ 1%) | GPU time per stage vs HTA (≤ 1%) |")
    print(f"| {truth['bytes'] / 1e6:.0f} MB, {args.ranks} ranks | {seconds:.1f} s ({cpu:.1f} CPU) "
          f"| {hta['load_s']:.1f} s ({hta['load_cpu']:.1f} CPU) | {hta['load_s'] / seconds:.1f}x, {hta['load_cpu'] / cpu:.1f}x "
          f"| {max(rss, tree):.0f} MB | {hta_peak:.0f} MB | {max(rss, tree) / hta_peak:.2f} "
          f"| {idle_gap:.2e} | {stage_gap:.2e} |")


def memory(args) -> None:
    fixed_folder, _ = trace_set(2, 1)
    _, _, fixed = polytrace_read(fixed_folder, OUT / "fixed.duckdb")
    rows = []
    for megabytes in (args.memory_mb / 2, args.memory_mb):
        folder, truth = trace_set(megabytes, args.ranks)
        seconds, cpu, rss = polytrace_read(folder, OUT / "memory.duckdb")
        rows.append((truth["bytes"] / 1e6, seconds, cpu, rss))
        print(f"polytrace ingest of {truth['bytes'] / 1e6:.0f} MB: {seconds:.1f} s wall, {cpu:.1f} s CPU, peak {rss:.0f} MB")
    (half_mb, _, _, half), (full_mb, _, _, full) = rows
    print(f"fixed cost (a 2 MB trace): {fixed:.0f} MB; above it {half - fixed:.0f} MB for {half_mb:.0f} MB, "
          f"{full - fixed:.0f} MB for {full_mb:.0f} MB: sub-linear {'yes' if full - fixed < 2 * (half - fixed) else 'no'}; "
          f"target ≤ 600 MB for 1 GB: {'met' if full <= 600 else 'missed'}")


def export(args) -> None:
    folder = OUT / "export_run"
    log = folder / "metrics.jsonl"
    if not log.exists():
        folder.mkdir(parents=True, exist_ok=True)
        rng = random.Random(1)
        with open(log, "w") as out:
            for step in range(1, args.export_steps + 1):
                timers = {"gen": rng.uniform(200, 400), "reward": rng.uniform(5, 20), "old_log_prob": rng.uniform(20, 40),
                          "ref": rng.uniform(20, 40), "adv": 0.5, "update_actor": rng.uniform(60, 120),
                          "update_weights": rng.uniform(5, 10)}
                data = {f"timing_s/{k}": v for k, v in timers.items()}
                data["timing_s/step"] = sum(timers.values()) + 1.0
                data["response_length/max"] = rng.randint(500, 4096)
                data["perf/total_num_tokens"] = rng.randint(10**6, 2 * 10**6)
                out.write(json.dumps({"step": step, "data": data}) + "\n")
    store = OUT / "export.duckdb"
    if not store.exists():
        run_child([str(POLYTRACE), "ingest", "--db", str(store), "--run", "long", str(log)])
    output = OUT / "long.trace.json"
    seconds, cpu, rss = run_child([str(POLYTRACE), "export", "long", "--format", "chrome-trace", "--output", str(output),
                                   "--db", str(store)])
    events = output.read_text().count('"ph": "X"') + output.read_text().count('"ph":"X"')
    print(f"export of a {args.export_steps}-step run: {seconds:.2f} s wall, {cpu:.2f} s CPU, peak {rss:.0f} MB, "
          f"{output.stat().st_size / 1e6:.0f} MB, {events} X events; target ≤ 5 s: {'met' if seconds <= 5 else 'missed'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=500)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--memory-mb", type=float, default=1000)
    parser.add_argument("--export-steps", type=int, default=10000)
    parser.add_argument("--skip-hta", action="store_true")
    parser.add_argument("--only", default="read,memory,export")
    args = parser.parse_args()
    if not args.skip_hta:
        try:
            import hta  # noqa: F401
        except ImportError:
            print("Holistic Trace Analysis is not installed (pip install holistictraceanalysis): comparing with the truth only")
            args.skip_hta = True
    OUT.mkdir(parents=True, exist_ok=True)
    for part in args.only.split(","):
        {"read": read_and_compare, "memory": memory, "export": export}[part](args)


if __name__ == "__main__":
    main()
