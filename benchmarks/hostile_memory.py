"""Peak memory of ingesting hostile large inputs: whole JSON documents and a decompression bomb.

Inputs, generated under benchmarks/out/hostile_memory/:
  dataset  a PolyTrace dataset JSON (one document keyed by step, 64 prompt and 512 response lengths a
           step) of --json-mb MB;
  table    a wandb validation table (`val/generations_<step>_<hash>.table.json`, verl's wide layout:
           step, input_i, output_i, score_i) of --json-mb MB;
  bomb     a `.log.zst` whose --bomb-gb GB of text (zeros in lines) compress to a few hundred KB.
Each figure is the peak resident memory (ru_maxrss of the child) of the whole `polytrace ingest`
process into a new store, beside the baseline of the same run: the same command on a small file of
the same kind (its fixed cost). The bomb must end in a one-line error (its text past the cap on a
compressed input's expansion), never in memory or a full disk.
Targets: dataset and table <= 1 GB peak; the bomb refused, <= 1 GB peak.
Usage: python benchmarks/hostile_memory.py [--only dataset,table,bomb] [--json-mb 50] [--bomb-gb 4]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from _measure import compile_package

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "hostile_memory"
TARGET_MB = 1024


def write_dataset(path: Path, megabytes: float) -> None:
    rng = random.Random(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    written, step = 0, 0
    with open(path, "w") as handle:
        handle.write("{")
        while written < megabytes * 1e6:
            entry = {"input": [rng.randint(50, 900) for _ in range(64)], "output": [rng.randint(10, 8000) for _ in range(512)]}
            text = ("" if step == 0 else ", ") + json.dumps(str(step)) + ": " + json.dumps(entry)
            handle.write(text)
            written += len(text)
            step += 1
        handle.write("}")


def write_table(path: Path, megabytes: float) -> None:
    rng = random.Random(1)
    samples = 8
    columns = ["step"] + [f"{kind}_{i}" for i in range(1, samples + 1) for kind in ("input", "output", "score")]
    rows, written = [], 0
    while written < megabytes * 1e6:
        row = [len(rows) + 1]
        for _ in range(samples):
            row += [f"Question {rng.random()}: " + "x " * rng.randint(50, 300),
                    "Answer " + " ".join(str(rng.randint(0, 99)) for _ in range(rng.randint(100, 900))), rng.random()]
        written += len(json.dumps(row))
        rows.append(row)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"columns": columns, "data": rows}))


def write_bomb(path: Path, gigabytes: float) -> None:
    import zstandard

    path.parent.mkdir(parents=True, exist_ok=True)
    line = b"0" * 1023 + b"\n"
    block = line * 1024  # 1 MiB
    with open(path, "wb") as raw:
        with zstandard.ZstdCompressor(level=3).stream_writer(raw) as writer:
            for _ in range(int(gigabytes * 1024)):
                writer.write(block)


def peak(path: Path, expect_failure: bool = False) -> tuple[float, float, int, str]:
    """(wall seconds, peak RSS MB, exit code, the stderr line saying why a file cannot be read, else the
    last) of `polytrace ingest path` into a new store."""
    store = OUT / "store.duckdb"
    for stale in (store, Path(f"{store}.wal")):
        stale.unlink(missing_ok=True)
    compile_package()
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "polytrace_cli.cli", "ingest", str(path), "--db", str(store)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    stderr = process.stderr.read().decode().strip().splitlines()
    code = os.waitstatus_to_exitcode(status)
    if code and not expect_failure:
        raise SystemExit(f"ingest of {path} failed: {stderr[-3:]}")
    said = next((line for line in stderr if "cannot read" in line), stderr[-1] if stderr else "")
    return seconds, usage.ru_maxrss / 1024, code, said


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="dataset,table,bomb")
    parser.add_argument("--json-mb", type=float, default=50)
    parser.add_argument("--bomb-gb", type=float, default=4)
    args = parser.parse_args()
    wanted = args.only.split(",")
    results = {}
    failed = False
    if "dataset" in wanted:
        large, small = OUT / "dataset" / "large.json", OUT / "dataset" / "small.json"
        write_dataset(large, args.json_mb)
        write_dataset(small, 0.05)
        base, big = peak(small), peak(large)
        results["dataset"] = {"mb": args.json_mb, "peak_mb": round(big[1]), "baseline_peak_mb": round(base[1]),
                              "seconds": round(big[0], 1)}
        failed |= big[1] > TARGET_MB
    if "table" in wanted:
        large = OUT / "table" / "files" / "media" / "table" / "val" / "generations_10_0a1b2c.table.json"
        small = OUT / "table_small" / "files" / "media" / "table" / "val" / "generations_10_0a1b2c.table.json"
        write_table(large, args.json_mb)
        write_table(small, 0.05)
        base, big = peak(small), peak(large)
        results["table"] = {"mb": args.json_mb, "peak_mb": round(big[1]), "baseline_peak_mb": round(base[1]),
                            "seconds": round(big[0], 1)}
        failed |= big[1] > TARGET_MB
    if "bomb" in wanted:
        bomb, small = OUT / "bomb" / "train.log.zst", OUT / "bomb_small" / "train.log.zst"
        if not bomb.exists():
            write_bomb(bomb, args.bomb_gb)
        write_bomb(small, 1 / 1024)
        base, big = peak(small, expect_failure=True), peak(bomb, expect_failure=True)
        results["bomb"] = {"gb": args.bomb_gb, "compressed_kb": round(bomb.stat().st_size / 1024), "exit": big[2],
                           "message": big[3][:200], "peak_mb": round(big[1]), "baseline_peak_mb": round(base[1]),
                           "seconds": round(big[0], 1)}
        failed |= big[1] > TARGET_MB or big[2] == 0 or "expands past" not in big[3]
    print(json.dumps(results, indent=2))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
