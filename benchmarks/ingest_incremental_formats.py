"""Re-ingest of a grown verl file-logger log and a grown TRL console log: the appended read beside the
first ingest and a whole re-read, in one run.

Per format, writes a log of about --mb MB (the generators of `ingest_verl_jsonl.py` and
`ingest_trl_console.py`), ingests all but its last --grow percent into a new store, then the whole
log into a copy of that store (status appended: only the new lines are read) and into a new store
(a whole re-read). Each is timed inside this process with the libraries loaded (a first, untimed
ingest loads them), as `polytrace watch` reads each growth: wall and CPU seconds (every thread of
the process), median of --repeat runs. Checks that the appended store holds the rows of the whole
read. Usage: python benchmarks/ingest_incremental_formats.py [--mb 50] [--grow 1] [--repeat 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from pathlib import Path

from _measure import fresh_log_path, stored_counts
from ingest_trl_console import write_log as write_trl_log
from ingest_verl_jsonl import write_log as write_jsonl_log

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "ingest_incremental_formats"
# Bytes per step of the TRL generator's log, to size it in MB.
TRL_BYTES_PER_STEP = 570


def timed_ingest(log: Path, store: Path, start_from: Path | None = None) -> tuple[str, float, float]:
    """(status, wall s, CPU s) of `ingest_paths` of `log` into `store`: a new store, or a copy of
    `start_from`."""
    import polytrace_cli.ingest.formats  # noqa: F401  (the ingesters register on import)
    from polytrace_cli.ingest.driver import ingest_paths
    from polytrace_cli.store import open_store
    from polytrace_cli.ingest.registry import declared_metric_names

    store.unlink(missing_ok=True)
    if start_from is not None:
        shutil.copy(start_from, store)
    con = open_store(store, metric_names=declared_metric_names)
    started, cpu = time.perf_counter(), time.process_time()
    (report,) = ingest_paths(con, [log])
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    con.close()
    return report.status, wall, cpu


def measure(name: str, text: bytes, grow: float, repeat: int) -> None:
    """Print the first ingest, appended and whole re-read figures of `text` grown by `grow` percent."""
    log = fresh_log_path(OUT / name, "metrics.jsonl" if name == "verl-jsonl" else "train.log")
    cut = text.rfind(b"\n", 0, int(len(text) / (1 + grow / 100))) + 1
    log.write_bytes(text[:cut])
    first, grown, whole = (OUT / name / f"{kind}.duckdb" for kind in ("first", "grown", "whole"))
    timed_ingest(log, first)  # loads the libraries
    firsts = [timed_ingest(log, first) for _ in range(repeat)]
    log.write_bytes(text)
    appended = [timed_ingest(log, grown, start_from=first) for _ in range(repeat)]
    wholes = [timed_ingest(log, whole) for _ in range(repeat)]
    if {status for status, _, _ in appended} != {"appended"}:
        raise SystemExit(f"{name}: the grown log was read {appended[0][0]}, not appended")
    counts = {label: stored_counts(store) for label, store in (("appended", grown), ("whole", whole))}
    print(f"{name}: {cut / 1e6:.1f} MB grown by {(len(text) - cut) / 1e6:.2f} MB")
    medians = {}
    for label, runs in (("first ingest", firsts), ("appended", appended), ("whole re-read", wholes)):
        medians[label] = (statistics.median(w for _, w, _ in runs), statistics.median(c for _, _, c in runs))
        print(f"  {label:14} wall {medians[label][0]:6.2f} s  CPU {medians[label][1]:6.2f} s  (runs: "
              + ", ".join(f"{w:.2f}/{c:.2f}" for _, w, c in runs) + ")")
    print(f"  appended / first ingest: wall {medians['appended'][0] / medians['first ingest'][0]:.1%},"
          f" CPU {medians['appended'][1] / medians['first ingest'][1]:.1%}")
    print(f"  rows (step_metrics, lines, stored): appended {counts['appended']}, whole {counts['whole']}")
    if counts["appended"] != counts["whole"]:
        raise SystemExit(f"{name}: the appended store differs from the whole read")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=50.0, help="size of each log in MB")
    parser.add_argument("--grow", type=float, default=1.0, help="growth in percent of the first read")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each (median reported)")
    args = parser.parse_args()
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    written = OUT / "written"
    write_jsonl_log(written, args.mb)
    measure("verl-jsonl", written.read_bytes(), args.grow, args.repeat)
    write_trl_log(written, int(args.mb * 1e6 / TRL_BYTES_PER_STEP))
    measure("trl-console", written.read_bytes(), args.grow, args.repeat)
    written.unlink()


if __name__ == "__main__":
    main()
