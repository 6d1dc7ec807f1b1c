"""Report speed at scale: `polytrace report` over a 1,000-step, 5-million-sample run, as a whole process.

Reuses the newest store benchmarks/analyze_scale.py built under benchmarks/out/analyze_scale/ for this size
(running that script first when there is none): run `scale` (5 M per-sample lengths on 8 DP ranks and
what else that script adds) and run `console` (the same steps as step aggregates, so the step-time
figures draw).

Runs `polytrace report --db STORE --out benchmarks/out/report_scale --name scale` in a child process and
prints its wall seconds and peak RSS (the child's ru_maxrss from wait4) against the target (< 60 s),
then the per-figure seconds from the report's own timings and the files it wrote.
Usage: python benchmarks/report_scale.py [--samples N] [--steps N] [--runs scale console]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "report_scale"
TARGET_SECONDS = 60.0


def _analyze_scale():
    """benchmarks/analyze_scale.py as a module (its store builder and output folder)."""
    spec = importlib.util.spec_from_file_location("analyze_scale", HERE / "analyze_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def scale_store(samples: int, steps: int) -> Path | None:
    """The newest store analyze_scale.py built for this size (`store*_<samples>_<steps>.duckdb`), if any."""
    found = sorted(_analyze_scale().OUT.glob(f"store*_{samples}_{steps}.duckdb"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def polytrace_executable() -> str:
    """The `polytrace` console script of the running interpreter's environment, else the one on PATH."""
    beside = Path(sys.executable).parent / "polytrace"
    found = str(beside) if beside.exists() else shutil.which("polytrace")
    if not found:
        raise SystemExit("polytrace is not installed in this environment (pip install -e .)")
    return found


def timed_child(command: list[str]) -> tuple[int, float, float, str]:
    """Run `command`; returns (exit code, wall seconds, peak RSS MB of that process, its output)."""
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    return child.returncode, seconds, usage.ru_maxrss / 1024, output


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=5_000_000)
    parser.add_argument("--steps", type=int, default=1_000)
    parser.add_argument("--runs", nargs="*", default=[], help="Runs to report on [default: all in the store].")
    args = parser.parse_args()

    store = scale_store(args.samples, args.steps)
    if store is None:  # analyze_scale.py builds it under its own name (and times the analyses)
        subprocess.run([sys.executable, str(HERE / "analyze_scale.py"), "--samples", str(args.samples),
                        "--steps", str(args.steps)], check=True)
        store = scale_store(args.samples, args.steps)
    if store is None:
        raise SystemExit("benchmarks/analyze_scale.py did not leave a store under benchmarks/out/analyze_scale/")
    print(f"store {store.relative_to(HERE.parent)}")

    OUT.mkdir(parents=True, exist_ok=True)
    command = [polytrace_executable(), "report", *args.runs, "--db", str(store), "--out", str(OUT), "--name", "scale"]
    code, seconds, rss, output = timed_child(command)
    if code != 0:
        sys.stderr.write(output)
        return 1
    folder = OUT / "scale"
    summary = json.loads((folder / "summary.json").read_text())
    drawn = [f for f in summary["figures"] if f["png"]]
    left_out = [f for f in summary["figures"] if not f["png"]]
    print(f"\n{'figure':<6} {'seconds':>8}  result")
    for figure in summary["figures"]:
        if figure.get("failed"):
            result = f"FAILED: {figure['failed']}"
        else:
            result = figure["png"] or f"omitted: {figure['omitted']}"
        print(f"{figure['id']:<6} {figure.get('seconds', float('nan')):>8.2f}  {result}")
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1e6
    print(f"\n{len(drawn)} figures drawn, {len(left_out)} left out; report folder {size:.1f} MB")
    print(f"polytrace report (whole process): {seconds:.1f} s (target < {TARGET_SECONDS:.0f} s): "
          f"{'met' if seconds < TARGET_SECONDS else 'MISSED'}")
    print(f"peak RSS {rss:,.0f} MB")
    if output.strip() != str(folder / "index.html"):
        print(f"stdout held more than the report path ({len(output):,} characters): {output[:200]!r}")
        return 1
    return 0 if seconds < TARGET_SECONDS else 1


if __name__ == "__main__":
    sys.exit(main())
