"""Ingest speed for packed-lengths traces: polytrace against a plain-Python loop and DuckDB's ceiling.

Writes a large `packed_lengths_step_N.jsonl` trace (n_sampling 8, like the real traces) under
benchmarks/out/, then measures, in this one run:
  polytrace  the whole `polytrace ingest` process into an on-disk store (wall time, peak RSS);
  baseline   plain Python: json.loads per line, rows collected, one bulk insert into DuckDB
             (run on a prefix of the file to keep its memory bounded; rates are per MB and sample);
  ceiling    DuckDB's own read_json + unnest of the same file into an on-disk table (one row per
             response), and read_json into a table of prompt groups with the lengths as a list,
             the layout polytrace stores (`sample_groups`; the `samples` view unnests it on read).
Usage: python benchmarks/ingest_packed.py [--lines N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import textwrap
from pathlib import Path

import numpy as np

from _measure import run_measured

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "ingest_packed"
N_SAMPLING = 8


def write_trace(path: Path, lines: int, seed: int = 0) -> int:
    """A trace of `lines` prompts over 2 DP ranks and 1,024 prompts per step; returns samples written."""
    rng = np.random.default_rng(seed)
    chunk = 100_000
    with open(path, "w") as handle:
        for start in range(0, lines, chunk):
            count = min(chunk, lines - start)
            prompts = rng.lognormal(5.0, 0.3, count).astype(int)
            outputs = np.minimum(rng.lognormal(6.5, 1.0, (count, N_SAMPLING)).astype(int) + 1, 20480)
            rows = []
            for i in range(count):
                index = start + i
                rows.append(
                    f'{{"step": {index // 1024}, "rank": {(index % 2) * 4}, "dp_rank": {index % 2}, "tp_rank": 0, '
                    f'"local_index": {(index % 1024) // 2}, "input": {prompts[i]}, '
                    f'"output": [{", ".join(map(str, outputs[i]))}], "n_sampling": {N_SAMPLING}, "validate": false}}\n'
                )
            handle.write("".join(rows))
    return lines * N_SAMPLING


BASELINE = textwrap.dedent(
    """
    import json, sys, duckdb, pyarrow as pa
    path, db, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
    cols = {k: [] for k in ("step", "rank", "dp_rank", "tp_rank", "prompt_idx", "sample_idx", "prompt_len", "response_len", "validate")}
    with open(path) as f:
        for n, line in enumerate(f):
            if n >= limit:
                break
            r = json.loads(line)
            for i, length in enumerate(r["output"]):
                cols["step"].append(r["step"]); cols["rank"].append(r["rank"]); cols["dp_rank"].append(r["dp_rank"])
                cols["tp_rank"].append(r["tp_rank"]); cols["prompt_idx"].append(r["local_index"]); cols["sample_idx"].append(i)
                cols["prompt_len"].append(r["input"]); cols["response_len"].append(length); cols["validate"].append(r["validate"])
    con = duckdb.connect(db)
    rows = pa.table(cols)
    con.execute("CREATE TABLE samples AS SELECT * FROM rows")
    con.close()
    """
)

READ_JSON = (
    "read_json(?, format='newline_delimited', columns={step: 'INTEGER', rank: 'INTEGER', dp_rank: 'INTEGER', "
    "tp_rank: 'INTEGER', local_index: 'INTEGER', input: 'INTEGER', output: 'INTEGER[]', n_sampling: 'INTEGER', "
    "validate: 'BOOLEAN'})"
)


def duckdb_script(select_list: str) -> str:
    """A child script: `CREATE TABLE t AS SELECT <select_list> FROM read_json(trace)` into an on-disk store."""
    return (
        "import sys, duckdb\n"
        "con = duckdb.connect(sys.argv[2])\n"
        f"con.execute({f'CREATE TABLE t AS SELECT {select_list} FROM {READ_JSON}'!r}, [sys.argv[1]])\n"
        "con.close()\n"
    )


CEILING = duckdb_script("step, rank, dp_rank, tp_rank, local_index, unnest(range(len(output))) AS sample_idx, input, "
                        "unnest(output) AS response_len, validate")
GROUPS_CEILING = duckdb_script("step, rank, dp_rank, tp_rank, local_index, input, validate, output")


def main() -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=2_000_000, help="prompts in the trace (x8 samples)")
    parser.add_argument("--baseline-share", type=float, default=0.25, help="share of the file the baseline reads")
    args = parser.parse_args()
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    trace = OUT / "packed_lengths_step_0.jsonl"
    samples = write_trace(trace, args.lines)
    os.sync()  # the trace's dirty pages go to disk now, not during the first timed method
    size_mb = trace.stat().st_size / 1e6
    polytrace = [sys.executable, "-m", "polytrace_cli.cli"]
    results = []

    seconds, rss = run_measured(polytrace + ["ingest", str(trace), "--db", str(OUT / "polytrace.duckdb")])
    results.append({"method": "polytrace ingest (whole process)", "mb": size_mb, "samples": samples, "seconds": seconds, "rss_mb": rss})

    limit = int(args.lines * args.baseline_share)
    seconds, rss = run_measured([sys.executable, "-c", BASELINE, str(trace), str(OUT / "baseline.duckdb"), str(limit)])
    share = limit / args.lines
    results.append({"method": f"plain Python loop ({share:.0%} of the file)", "mb": size_mb * share,
                    "samples": samples * share, "seconds": seconds, "rss_mb": rss})

    seconds, rss = run_measured([sys.executable, "-c", CEILING, str(trace), str(OUT / "ceiling.duckdb")])
    results.append({"method": "DuckDB read_json + unnest (ceiling)", "mb": size_mb, "samples": samples, "seconds": seconds, "rss_mb": rss})

    seconds, rss = run_measured([sys.executable, "-c", GROUPS_CEILING, str(trace), str(OUT / "groups.duckdb")])
    results.append({"method": "DuckDB read_json, group rows (same layout)", "mb": size_mb, "samples": samples,
                    "seconds": seconds, "rss_mb": rss})

    ours, baseline, ceiling, groups = results
    rate = lambda r: r["samples"] / r["seconds"]  # noqa: E731
    print(f"trace: {size_mb:,.0f} MB, {samples:,} response lengths ({args.lines:,} lines)")
    print(f"{'method':42s} {'MB/s':>8s} {'Msamples/s':>11s} {'peak RSS MB':>12s}")
    for r in results:
        print(f"{r['method']:42s} {r['mb'] / r['seconds']:8.1f} {rate(r) / 1e6:11.2f} {r['rss_mb']:12.0f}")
    print(f"polytrace vs plain Python: {rate(ours) / rate(baseline):.1f}x;  vs DuckDB read_json + unnest: "
          f"{rate(ours) / rate(ceiling):.0%};  vs DuckDB read_json into the same group layout: {rate(ours) / rate(groups):.0%}")
    print("targets: >= 100 MB/s, >= 5 M samples/s, peak RSS < 2 GB, >= 3x plain Python")
    shutil.rmtree(OUT, ignore_errors=True)
    return results


if __name__ == "__main__":
    main()
