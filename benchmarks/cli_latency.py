"""Latency a person feels at the command line: whole `polytrace` processes, median of several runs.

Builds (once; reused when present) three stores under benchmarks/out/cli_latency/:
  demo.duckdb    the demo's three runs (math, code, search presets, demo seed), with the library;
  lengths.duckdb one math run of 214 steps × 384 responses (82,176 responses, packed trace), likewise;
  make_demo/demo.duckdb  the store `make demo` builds (`polytrace demo`): those three runs and the
                 300-step verl console run math-verl with stage times, which the report explains,
                 prices with whatif and backtests.

Then times each command as a child process (wall and CPU seconds, medians of --repeat runs; the
largest peak RSS) and prints it beside its target:
  runs, --help and an error exit      2× the time Python takes to open the store
                                      (`python -c "import duckdb; duckdb.connect(path)"`)
  analyze --only lengths (82k)        1 s and 400 MB
  analyze, fit, report (demo)         3 s each
  report (make demo store)            3 s
The stores are built in a child process so that this process stays small: on Linux a child's peak
RSS starts at its parent's size at fork. `--before CHECKOUT` times an earlier checkout in turns with
this one, so both columns see the same machine load.
Usage: python benchmarks/cli_latency.py [--repeat N] [--rebuild] [--before CHECKOUT]
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "out" / "cli_latency"
DEMO_SEED = 7
LENGTH_STEPS = 214
MAKE_DEMO_DB = OUT / "make_demo" / "demo.duckdb"



def build_stores() -> None:
    """The demo store, the 82k-response store and the `make demo` store (each skipped when it exists)."""
    sys.path.insert(0, str(ROOT))
    from polytrace_cli.ingest.driver import ingest_paths
    from polytrace_cli.store import open_store
    from polytrace_cli.ingest.registry import declared_metric_names
    from polytrace_cli.workload.presets import PRESETS, preset
    from polytrace_cli.workload.synth import synthesize, with_overrides

    OUT.mkdir(parents=True, exist_ok=True)
    demo_db = OUT / "demo.duckdb"
    if not demo_db.exists():
        con = open_store(demo_db, metric_names=declared_metric_names)
        for task in PRESETS:
            model, spec = preset(task)
            synthesize(model, with_overrides(spec, seed=DEMO_SEED), OUT / "demo_logs" / task)
            ingest_paths(con, [OUT / "demo_logs" / task], task=task)
        con.close()
    lengths_db = OUT / "lengths.duckdb"
    if not lengths_db.exists():
        model, spec = preset("math")
        synthesize(model, with_overrides(spec, steps=LENGTH_STEPS, seed=1), OUT / "lengths_logs" / "math82k")
        con = open_store(lengths_db, metric_names=declared_metric_names)
        ingest_paths(con, [OUT / "lengths_logs" / "math82k"], task="math")
        con.close()
    if not MAKE_DEMO_DB.exists():
        # The demo command itself, so the store is the one `make demo` builds (it also writes a report).
        subprocess.run([sys.executable, "-m", "polytrace_cli.cli", "demo", "--out", str(MAKE_DEMO_DB.parent),
                        "--reports", str(MAKE_DEMO_DB.parent / "reports")],
                       check=True, stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})


def run_once(argv: list[str], cwd: Path, root: Path) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds (user + system) and peak RSS (MB) of one child process; its exit
    status is not checked (error exits are timed on purpose)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd, env=env)
    _, _, usage = os.wait4(process.pid, 0)
    return time.perf_counter() - started, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def measure(variants: dict[str, tuple[list[str], Path]], repeat: int,
            cwd: Path) -> dict[str, tuple[float, float, float]]:
    """Per variant (argv, checkout): median wall seconds, median CPU seconds and largest peak RSS over
    `repeat` runs. The variants take turns, so a change in the machine's load hits them alike. On a
    shared machine the CPU seconds are the steadier figure: a quiet machine's wall time is close to them."""
    runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in variants}
    for _ in range(repeat):
        for name, (argv, root) in variants.items():
            runs[name].append(run_once(argv, cwd, root))
    return {name: (statistics.median(r[0] for r in got), statistics.median(r[1] for r in got), max(r[2] for r in got))
            for name, got in runs.items()}


def fit_file_flag(cli: list[str], root: Path, cwd: Path) -> str:
    """--output, or --out in versions whose fit took the parameters file as --out."""
    help_text = subprocess.run([*cli, "fit", "--help"], capture_output=True, text=True, cwd=cwd,
                               env={**os.environ, "PYTHONPATH": str(root), "COLUMNS": "200"}).stdout
    return "--output" if "--output" in help_text else "--out"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--before", type=Path, help="an earlier checkout, timed in turns with this one")
    parser.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build_only:
        build_stores()
        return
    if args.rebuild and OUT.exists():
        shutil.rmtree(OUT)
    subprocess.run([sys.executable, __file__, "--build-only"], check=True)
    roots = {"after": ROOT}
    if args.before:
        roots = {"before": args.before.resolve(), "after": ROOT}
    for root in roots.values():
        compileall.compile_dir(root / "polytrace_cli", quiet=1)
    python = sys.executable
    cli = [python, "-m", "polytrace_cli.cli"]
    demo, lengths = str(OUT / "demo.duckdb"), str(OUT / "lengths.duckdb")
    work = OUT / "cwd"
    work.mkdir(exist_ok=True)

    opened = measure({"open": ([python, "-c", f"import duckdb; duckdb.connect({demo!r}, read_only=True)"], ROOT)},
                     args.repeat, work)["open"]
    quick = 2 * opened[0]
    flags = {name: fit_file_flag(cli, root, work) for name, root in roots.items()}
    cases = [
        ("runs", lambda _: [*cli, "runs", "--db", demo], quick, None),
        ("--help", lambda _: [*cli, "--help"], quick, None),
        ("error exit (unknown run)", lambda _: [*cli, "analyze", "nosuchrun", "--db", demo], quick, None),
        ("analyze --only lengths (82k)", lambda _: [*cli, "analyze", "--only", "lengths", "--db", lengths], 1.0, 400.0),
        ("analyze (demo)", lambda _: [*cli, "analyze", "--db", demo], 3.0, None),
        ("fit math (demo)", lambda name: [*cli, "fit", "math", "--db", demo, flags[name], str(work / "math.params.json")],
         3.0, None),
        ("report (demo)", lambda _: [*cli, "report", "--db", demo, "--out", str(work / "reports")], 3.0, None),
        ("report (make demo store)", lambda _: [*cli, "report", "--db", str(MAKE_DEMO_DB), "--out",
                                                str(work / "reports")], 3.0, None),
    ]
    load = os.getloadavg()[0]
    print(f"load average {load:.1f}; python opens the store in {opened[0]:.3f} s (CPU {opened[1]:.3f} s, "
          f"{opened[2]:.0f} MB): target for quick commands {quick:.3f} s")
    header = "".join(f" {name + ' s':>9} {name + ' cpu':>10} {name + ' MB':>9}" for name in roots)
    print(f"{'command':30}{header} {'target s':>9} {'target MB':>9}")
    for label, make_argv, target_s, target_mb in cases:
        results = measure({name: (make_argv(name), root) for name, root in roots.items()}, args.repeat, work)
        seconds, _, peak = results["after"]
        ok = seconds <= target_s and (target_mb is None or peak <= target_mb)
        cells = "".join(f" {results[name][0]:9.3f} {results[name][1]:10.3f} {results[name][2]:9.0f}" for name in roots)
        print(f"{label:30}{cells} {target_s:9.3f} {target_mb or '':>9} {'ok' if ok else 'OVER'}", flush=True)


if __name__ == "__main__":
    main()
