"""Re-ingest of a grown console log: reading only the appended lines, beside the first ingest and the
start-up of any command, in one run.

Writes a verl console log of --mb MB (the generator of `ingest_console.py`), then measures, each
as a whole `polytrace` process (median of --repeat runs, the kinds taking turns round by round):
  first ingest   `polytrace ingest` of the log (a copy at its first size) into a new store;
  appended       the log grown by --grow percent (more steps, numbered on), `polytrace ingest` into
                 a copy of that store: only the new lines are read (status appended);
  whole re-read  `polytrace ingest` of the grown log into a new store: what reading it again costs;
  start-up       `polytrace runs` on the store: a command that reads almost nothing; and
                 `polytrace ingest` of the grown log into the appended store again (status unchanged):
                 the ingest command's own start-up (its libraries, the sniff, the file's hash).
  in process     the appended re-ingest inside one process with its libraries loaded: into a copy of
                 the first store opened for it (as a command reads, without its start-up), and into a
                 store kept open since it read the log at its first size (as `polytrace watch` reads
                 each growth of a log), with the CPU seconds of the parts of the latter: the parse of
                 the new lines, the facts decided again over the whole file or run, closing the store.
Checks that the appended store holds the rows of the whole read. With `--against CHECKOUT` (a
source tree of another version, e.g. `git archive main | tar -x -C /tmp/main`), that version also
reads the log at its first size into a store of its own, and the appended read, the unchanged
ingest and `polytrace runs` of both versions then take turns (--rounds rounds), so that a change in
the machine's load hits both alike, as do their appended reads into a store kept open (a child
process per version and round, each reading the grown log as `watch` does, --repeat times).
Figures in benchmarks/results.md.
Usage: python benchmarks/ingest_incremental.py [--mb 50] [--grow 1] [--repeat 3] [--against DIR --rounds 12]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _measure import run_child, stored_counts
from ingest_console import write_log

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "ingest_incremental"
POLYTRACE = str(Path(sys.executable).with_name("polytrace"))


def grow(log: Path, megabytes: float, steps_before: int) -> int:
    """Append about `megabytes` MB of steps numbered after `steps_before`; returns the steps added."""
    extra = OUT / "extra.log"
    _, steps = write_log(extra, megabytes, seed=1)
    text = re.sub(r"step:(\d+) - ", lambda m: f"step:{int(m.group(1)) + steps_before} - ", extra.read_text())
    with open(log, "a") as handle:
        handle.write(text)
    extra.unlink()
    return steps


def in_turns(log: Path, firsts: dict[str, tuple[Path, dict]], rounds: int) -> dict[str, dict[str, list]]:
    """Per version (its first store, its environment): (wall, CPU) seconds of the appended read (into
    a copy of its first store), the ingest of the same file unchanged and `polytrace runs`, the
    versions taking turns for `rounds` rounds."""
    ingest = [POLYTRACE, "ingest", "--format", "verl-console", "--db"]
    runs: dict[str, dict[str, list]] = {name: {"appended": [], "unchanged": [], "runs": []} for name in firsts}
    for _ in range(rounds):
        for name, (first, env) in firsts.items():
            store = OUT / f"turns_{name}.duckdb"
            shutil.copy(first, store)
            for kind, argv in (("appended", [*ingest, str(store), str(log)]), ("unchanged", [*ingest, str(store), str(log)]),
                               ("runs", [POLYTRACE, "runs", "--db", str(store)])):
                os.sync()
                runs[name][kind].append(run_child(argv, env)[:2])
    return runs


def timed_in_turns(kinds: dict[str, tuple[list[str], object]], repeat: int) -> dict[str, list[tuple[float, float]]]:
    """Per kind (name -> argv and a `before()` or None): (wall, CPU) seconds of `repeat` runs, the kinds
    taking turns round by round (so a change in the machine's load hits them alike), each run after
    its `before()` and a sync."""
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in kinds}
    for _ in range(repeat):
        for name, (argv, before) in kinds.items():
            if before:
                before()
            os.sync()
            runs[name].append(run_child(argv)[:2])
    return runs


def appended_in_process(first: Path, store: Path, log: Path, repeat: int) -> list[tuple[float, float]]:
    """(wall, CPU) seconds of `ingest_paths` reading the grown log into a copy of the first store,
    `repeat` times, in this process (a first, untimed run loads polars, DuckDB and the ingesters; CPU
    counts every thread of the process)."""
    import polytrace_cli.ingest.formats  # noqa: F401  (the ingesters register on import)
    from polytrace_cli.ingest.runner import ingest_paths
    from polytrace_cli.store import open_store

    runs = []
    for _ in range(repeat + 1):
        shutil.copy(first, store)
        con = open_store(store)
        started, cpu = time.perf_counter(), time.process_time()
        (report,) = ingest_paths(con, [log], format_name="verl-console")
        runs.append((time.perf_counter() - started, time.process_time() - cpu))
        con.close()
        if report.status != "appended":
            raise SystemExit(f"the grown log was {report.status}, not appended")
    return runs[1:]


# The parts of an appended read timed by `appended_watching`: (label, module, function).
PARTS = (
    ("parse and store the new lines", "polytrace_cli.ingest.console.pipeline", "load_console"),
    ("  of which: GPU count over the file's steps", "polytrace_cli.ingest.run_metadata", "n_gpus_from_throughput"),
    ("  of which: step-time inclusion over the run's steps", "polytrace_cli.semantics.step_timers", "step_time_inclusion"),
    ("semantics record over the run's steps", "polytrace_cli.semantics.record", "decide_runs"),
)


def appended_watching(log: Path, first_bytes: int, repeat: int) -> tuple[list[tuple[float, float]], list]:
    """As `polytrace watch` reads a log that grew: the log's first `first_bytes` read into a new store
    kept open, then the rest of the grown log appended and read (timed), `repeat` times (after an
    untimed round). Returns the (wall, CPU) seconds of each timed read and the CPU seconds of its parts
    (`PARTS`, each function timed where it is called, and closing the store) in the last round."""
    import importlib

    import polytrace_cli.ingest.formats  # noqa: F401  (imported before the parts are patched)

    spent: dict[str, float] = {}
    for label, module_name, name in PARTS:
        function = getattr(importlib.import_module(module_name), name)

        def timed_call(*args, _function=function, _label=label, **kwargs):
            started = time.process_time()
            try:
                return _function(*args, **kwargs)
            finally:
                spent[_label] = spent.get(_label, 0.0) + time.process_time() - started

        # Patched in every module that imported the function by name.
        for holder in [m for m in list(sys.modules.values()) if getattr(m, name, None) is function]:
            setattr(holder, name, timed_call)
    text = log.read_bytes()
    watched = OUT / "watched" / "run" / "train.log"
    watched.parent.mkdir(parents=True, exist_ok=True)
    store = OUT / "watched.duckdb"
    runs = []
    for _ in range(repeat + 1):
        con = _watched_store(store, watched, text, first_bytes)
        spent.clear()
        started, cpu = time.perf_counter(), time.process_time()
        _read_growth(con, watched)
        runs.append((time.perf_counter() - started, time.process_time() - cpu))
        spent["the whole appended read"] = runs[-1][1]
        started = time.process_time()
        con.close()
        spent["closing the store (checkpoint)"] = time.process_time() - started
    parts = [(label, spent.get(label, 0.0)) for label in
             ("the whole appended read", *(label for label, _, _ in PARTS), "closing the store (checkpoint)")]
    return runs[1:], parts


def watched_reads(log: Path, first_bytes: int, repeat: int, store: Path) -> list[float]:
    """CPU seconds of `repeat` appended reads into a store kept open, as `appended_watching` reads them
    (after an untimed round), with the version of polytrace this process imports and nothing patched."""
    text = log.read_bytes()
    watched = store.parent / store.stem / "run" / "train.log"
    watched.parent.mkdir(parents=True, exist_ok=True)
    spent = []
    for _ in range(repeat + 1):
        con = _watched_store(store, watched, text, first_bytes)
        cpu = time.process_time()
        _read_growth(con, watched)
        spent.append(time.process_time() - cpu)
        con.close()
    return spent[1:]


def _watched_store(store: Path, watched: Path, text: bytes, first_bytes: int):
    """A new store at `store`, kept open, holding the log `watched` read at its first `first_bytes` of
    `text`; the rest of `text` is then appended to the log."""
    import polytrace_cli.ingest.formats  # noqa: F401  (the ingesters register on import)
    from polytrace_cli.ingest.runner import ingest_paths
    from polytrace_cli.store import open_store

    store.unlink(missing_ok=True)
    watched.write_bytes(text[:first_bytes])
    con = open_store(store)
    ingest_paths(con, [watched], format_name="verl-console", complete_lines=True, batch=False)
    with open(watched, "ab") as handle:
        handle.write(text[first_bytes:])
    return con


def _read_growth(con, watched: Path) -> None:
    """Read the log's growth as `polytrace watch` does; exits unless it was appended."""
    from polytrace_cli.ingest.runner import ingest_paths

    (report,) = ingest_paths(con, [watched], format_name="verl-console", complete_lines=True, batch=False)
    if report.status != "appended":
        raise SystemExit(f"the watched log was {report.status}, not appended")


def watched_in_turns(log: Path, first_bytes: int, envs: dict[str, dict | None], rounds: int,
                     repeat: int) -> dict[str, list[float]]:
    """Per version (its environment): the CPU seconds of the appended reads into a store kept open, a
    child process per version and round (`watched_reads`), the versions taking turns."""
    spent: dict[str, list[float]] = {name: [] for name in envs}
    for _ in range(rounds):
        for name, env in envs.items():
            argv = [sys.executable, __file__, "--watched-child", str(first_bytes), "--repeat", str(repeat),
                    "--child-store", str(OUT / f"watched_{name}.duckdb")]
            done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
            if done.returncode:
                raise SystemExit(f"{name}: {done.stderr[-500:]}")
            spent[name] += json.loads(done.stdout.splitlines()[-1])
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=50.0, help="size of the first log in MB")
    parser.add_argument("--grow", type=float, default=1.0, help="growth in percent of the first log")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each (median reported)")
    parser.add_argument("--against", type=Path, help="another version's source tree, timed in turns with this one")
    parser.add_argument("--rounds", type=int, default=12, help="rounds of the versions' turns (with --against)")
    parser.add_argument("--watched-child", type=int, help=argparse.SUPPRESS)  # first bytes: `watched_in_turns`' child
    parser.add_argument("--child-store", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.watched_child is not None:
        print(json.dumps(watched_reads(OUT / "run" / "train.log", args.watched_child, args.repeat, args.child_store)))
        return
    shutil.rmtree(OUT, ignore_errors=True)
    (OUT / "run").mkdir(parents=True)
    log = OUT / "run" / "train.log"
    _, steps = write_log(log, args.mb)
    first_mb = log.stat().st_size / 1e6
    first, grown, whole = OUT / "first.duckdb", OUT / "grown.duckdb", OUT / "whole.duckdb"

    def fresh(store: Path):
        return lambda: store.unlink(missing_ok=True)

    ingest = [POLYTRACE, "ingest", "--format", "verl-console", "--db"]
    run_child([*ingest, str(first), str(log)])
    # The first ingest is timed on a copy of the log at its first size, in turns with the rest.
    (OUT / "first_size" / "run").mkdir(parents=True)
    first_log = OUT / "first_size" / "run" / "train.log"
    shutil.copy(log, first_log)
    first_bytes = log.stat().st_size
    other_env = {**os.environ, "PYTHONPATH": str(args.against.resolve())} if args.against else None
    if args.against:
        compileall.compile_dir(args.against / "polytrace_cli", quiet=1)  # no timed run compiles sources
        other_first = OUT / "first_against.duckdb"
        run_child([*ingest, str(other_first), str(log)], other_env)
    added = grow(log, args.mb * args.grow / 100, steps)
    grown_mb = log.stat().st_size / 1e6
    first_again = OUT / "first_again.duckdb"
    turns = timed_in_turns({
        "first": ([*ingest, str(first_again), str(first_log)], fresh(first_again)),
        "appended": ([*ingest, str(grown), str(log)], lambda: shutil.copy(first, grown)),
        "whole": ([*ingest, str(whole), str(log)], fresh(whole)),
        "runs": ([POLYTRACE, "runs", "--db", str(grown)], None),
        "unchanged": ([*ingest, str(grown), str(log)], None),
    }, args.repeat)
    first_runs, appended_runs, whole_runs = turns["first"], turns["appended"], turns["whole"]
    startup_runs, unchanged_runs = turns["runs"], turns["unchanged"]

    in_process = appended_in_process(first, grown, log, args.repeat)
    watching, parts = appended_watching(log, first_bytes, args.repeat)

    counts = {name: stored_counts(store) for name, store in (("appended", grown), ("whole", whole))}
    print(f"log: {first_mb:.1f} MB, {steps:,} steps; grown by {grown_mb - first_mb:.2f} MB ({added:,} steps)"
          f" to {grown_mb:.1f} MB")
    print(f"{'':28} {'wall s':>7} {'CPU s':>7}  (medians; runs: wall/CPU)")
    measured = (("first ingest", first_runs), ("appended (re-ingest, grown)", appended_runs),
                ("whole re-read of grown log", whole_runs), ("start-up (polytrace runs)", startup_runs),
                ("ingest start-up (unchanged)", unchanged_runs))
    for name, runs in measured:
        print(f"{name:28} {statistics.median(w for w, _ in runs):7.2f} {statistics.median(c for _, c in runs):7.2f}  "
              + ", ".join(f"{w:.2f}/{c:.2f}" for w, c in runs))
    medians = {name: (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
               for name, runs in measured}
    for index, unit in ((0, "wall"), (1, "CPU")):
        work = medians["first ingest"][index] - medians["start-up (polytrace runs)"][index]
        for base in ("start-up (polytrace runs)", "ingest start-up (unchanged)"):
            beyond = medians["appended (re-ingest, grown)"][index] - medians[base][index]
            print(f"{unit}: appended beyond {base}: {beyond:.2f} s = {beyond / work:.1%} of the first ingest's"
                  f" {work:.2f} s beyond `polytrace runs`")
    work_cpu = medians["first ingest"][1] - medians["start-up (polytrace runs)"][1]
    for label, runs in (("into a copy of the first store opened for it", in_process),
                        ("into the store kept open since the first read (as `polytrace watch` reads each growth)",
                         watching)):
        cpu = statistics.median(c for _, c in runs)
        print(f"appended in one process with its libraries loaded, {label}, wall/CPU: "
              + ", ".join(f"{wall:.3f}/{c:.3f} s" for wall, c in runs)
              + f"; median CPU {cpu:.3f} s = {cpu / work_cpu:.1%} of the first ingest's CPU beyond `polytrace runs`")
    print("CPU s of one appended read into the store kept open, by part: "
          + "; ".join(f"{label.strip()} {seconds:.3f}" for label, seconds in parts))
    if args.against:
        turns = in_turns(log, {"this": (first, None), "against": (other_first, other_env)}, args.rounds)
        print(f"in turns, {args.rounds} rounds, this version against {args.against} (median and least CPU s;"
              " median wall s):")
        for name, kinds in turns.items():
            medians = {kind: statistics.median(c for _, c in got) for kind, got in kinds.items()}
            print(f"  {name:8} " + "; ".join(
                f"{kind} {medians[kind]:.3f} (least {min(c for _, c in got):.3f}; wall"
                f" {statistics.median(w for w, _ in got):.3f})" for kind, got in kinds.items())
                + f"; appended beyond unchanged {medians['appended'] - medians['unchanged']:.3f},"
                  f" beyond runs {medians['appended'] - medians['runs']:.3f}")
        watched = watched_in_turns(log, first_bytes, {"this": None, "against": other_env}, args.rounds, args.repeat)
        print(f"appended reads into a store kept open, in turns, {args.rounds} rounds of {args.repeat} reads"
              " (median and least CPU s; share of this version's first ingest's CPU beyond `polytrace runs`):")
        for name, spent in watched.items():
            print(f"  {name:8} {statistics.median(spent):.3f} (least {min(spent):.3f});"
                  f" {statistics.median(spent) / work_cpu:.1%} (least {min(spent) / work_cpu:.1%})")
    print(f"rows (step_metrics, lines, stored): appended {counts['appended']}, whole {counts['whole']}")
    if counts["appended"] != counts["whole"]:
        raise SystemExit("the appended store differs from the whole read")


if __name__ == "__main__":
    main()
