"""Crash harness: ingest many seeded damaged inputs (tests/hostile_inputs.py) and count what went wrong.

    python benchmarks/crash_harness.py [--rounds N] [--seed S] [--kills K] [--rotations R] [--sandbox A]

Each round writes one variant of every case and ingests it with `polytrace ingest --json` in a
subprocess, into a fresh store. Counted: inputs tried, tracebacks (any output holding one),
lines lost (good lines of a case that did not reach the store), escapes (a file that had to be
read but was neither stored nor reported as failed with a non-zero exit, or an infinite value
stored from a number too large for a double). With --rotations, R seeded logs (the generator's verl
console and verl JSONL logs, a TRL console log, the OpenRLHF fixture) are also grown, rotated
(log -> log.1, a new log) and grown again, each state ingested into one store in this process (as
`ingest` or as `watch` reads: complete lines only), and every table compared with one ingest of the
final files (`rotation_rounds`). With --sandbox, A rounds of every sandbox attempt
(tests/hostile_inputs.py `SANDBOX_ATTEMPTS`: crafted stores with views over read_text/read_csv/glob of
files outside, macros shadowing built-ins, lakes whose manifest points outside, `query` texts that
ATTACH, COPY TO, load extensions or never end) each run as a subprocess against a copy of one synthetic
store: counted are attempts, escapes (the secret shown, a file written outside or in the working
folder, a command not stopped by its limits), tracebacks, and attempts to be refused that exited 0
(`sandbox_rounds`); also how many were refused (any attempt may be; most must be) and how many of each
kind ran.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from hostile_inputs import CASES, SANDBOX_ATTEMPTS, folder_state, judge_attempt  # noqa: E402


def stored_lines(db: Path) -> tuple[int, set[str], int]:
    """(lines stored over every file, paths of the files the store holds, infinite values stored) of
    a store. No case writes a bare Infinity: an infinite value is a number too large that got in."""
    import duckdb

    if not db.exists():
        return 0, set(), 0
    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute("SELECT path, stored FROM files").fetchall()
        infinite = con.execute("SELECT count(*) FROM step_metrics WHERE isinf(value)").fetchall()[0][0]
    finally:
        con.close()
    return sum(stored for _, stored in rows), {path for path, _ in rows}, infinite


def run_case(case_writer, folder: Path, rng: random.Random, polytrace: list[str]) -> dict:
    """Write one case into `folder`, ingest it, and judge the outcome."""
    case = case_writer(folder, rng)
    db = folder / "store.duckdb"
    done = subprocess.run([*polytrace, "ingest", *map(str, case.paths), "--db", str(db), "--json"],
                          capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    stored, paths, infinite = stored_lines(db)
    unread = [p for p in case.must_read if str(p.resolve()) not in paths]
    return {"case": case.name, "exit": done.returncode, "traceback": "Traceback" in output,
            "lost": max(case.stored - stored, 0),
            "escaped": (bool(unread) and done.returncode == 0) or infinite > 0,
            "stdout_is_json": _is_json(done.stdout)}


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def kill_rounds(kills: int, seed: int, polytrace: list[str]) -> dict:
    """Ingest a folder of several runs, kill -9 the ingest after a random delay, and look at the
    store: runs without files (a read command must show none), files whose line accounting does
    not add up (a half-stored file), a store that no longer opens, and, once the same logs are
    ingested again, a store that differs from a clean ingest's (semantics records included)."""
    import signal
    import time

    rng = random.Random(seed)
    counts = {"kills": 0, "runs_without_files": 0, "half_stored_files": 0, "unopenable_stores": 0,
              "stores_differing_after_reingest": 0}
    with tempfile.TemporaryDirectory(prefix="polytrace-kill-") as folder:
        logs = Path(folder) / "logs"
        for index in range(6):
            subprocess.run([*polytrace, "synth", "--task", "math", "--out", str(logs / f"run{index}"),
                            "--num-steps", "6", "--batch", "16", "--n", "4", "--seed", str(index)],
                           capture_output=True, check=True)
        clean = Path(folder) / "clean.duckdb"
        subprocess.run([*polytrace, "ingest", str(logs), "--db", str(clean)], capture_output=True, check=True)
        truth = store_summary(clean, polytrace)
        for kill in range(kills):
            db = Path(folder) / f"store{kill}.duckdb"
            ingest = subprocess.Popen([*polytrace, "ingest", str(logs), "--db", str(db)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(rng.uniform(0.8, 4.0))
            ingest.send_signal(signal.SIGKILL)
            ingest.wait()
            counts["kills"] += 1
            if not db.exists():
                continue
            shown = subprocess.run([*polytrace, "runs", "--db", str(db), "--json"], capture_output=True, text=True)
            if shown.returncode != 0:
                if not any(empty in shown.stderr for empty in ("no store", "empty file", "empty store")):
                    counts["unopenable_stores"] += 1
                    print(json.dumps({"kill": kill, "unopenable": shown.stderr.strip()[-300:]}), flush=True)
                continue
            counts["runs_without_files"] += sum(run["files"] == 0 for run in json.loads(shown.stdout))
            check = subprocess.run([*polytrace, "query", "--db", str(db), "--json",
                                    "select count(*) as n from files where lines <> stored + ignored + rejected"],
                                   capture_output=True, text=True)
            counts["half_stored_files"] += json.loads(check.stdout)[0]["n"] if check.returncode == 0 else 1
            # Whatever the kill left, ingesting the same logs again makes the store a clean one.
            subprocess.run([*polytrace, "ingest", str(logs), "--db", str(db)], capture_output=True)
            if store_summary(db, polytrace) != truth:
                counts["stores_differing_after_reingest"] += 1
                print(json.dumps({"kill": kill, "differs": True}), flush=True)
    return counts


def rotation_rounds(trials: int, seed: int) -> dict:
    """Grow, rotate, grow: per trial a log cut at three random lines into a, b, c, d; a, then a + b,
    ingested as `name`; then `name` renamed `name.1` and c written as `name`; then c + d. The store
    after these ingests must equal (`conftest.whole_store`: every table, ids as paths and names) one
    ingest of the folder's final files. Returns the counts and prints each differing trial."""
    import shutil

    from conftest import whole_store
    from test_incremental_ingest import LENGTHS, MODEL, SPEC, trl_text

    from polytrace_cli.ingest.driver import ingest_paths
    from polytrace_cli.ingest.registry import declared_metric_names
    from polytrace_cli.store import open_store
    from polytrace_cli.workload.steplog import console_text, jsonl_text, step_table

    steps = step_table(LENGTHS, SPEC, MODEL)
    with tempfile.TemporaryDirectory(prefix="polytrace-rotate-") as folder:
        root = Path(folder)
        texts = {"verl-console": ("train.log", console_text(steps, SPEC, MODEL).encode()),
                 "verl-jsonl": ("train.jsonl", jsonl_text(steps, SPEC, MODEL).encode()),
                 "trl-console": ("train.log", trl_text(root, "bar-and-dict")),
                 "openrlhf": ("train.log", (ROOT / "tests/fixtures/openrlhf/train_global_step.log").read_bytes())}
        rng = random.Random(seed)
        counts = {"rotations": 0, "stores_differing": 0}
        for trial in range(trials):
            kind = rng.choice(sorted(texts))
            name, text = texts[kind]
            lines = text.splitlines(keepends=True)
            cuts = sorted(rng.sample(range(1, len(lines)), 3))
            a, b, c, d = (b"".join(lines[i:j]) for i, j in zip([0, *cuts], [*cuts, len(lines)]))
            watching = rng.random() < 0.5
            case = root / f"trial-{trial}"
            logs = case / "logs"
            logs.mkdir(parents=True)
            log = logs / name
            con = open_store(case / "grown.duckdb", metric_names=declared_metric_names)
            for part, rotate in ((a, False), (a + b, False), (c, True), (c + d, False)):
                if rotate:
                    log.rename(logs / f"{name}.1")
                log.write_bytes(part)
                ingest_paths(con, [logs], run_name="r", complete_lines=watching)
            grown = whole_store(con)
            con.close()
            con = open_store(case / "once.duckdb", metric_names=declared_metric_names)
            ingest_paths(con, [logs], run_name="r", complete_lines=watching)
            once = whole_store(con)
            con.close()
            counts["rotations"] += 1
            if grown != once:
                counts["stores_differing"] += 1
                print(json.dumps({"rotation": trial, "log": kind, "cuts": cuts, "watching": watching,
                                  "tables": sorted(t for t in once if grown.get(t) != once[t])}), flush=True)
            shutil.rmtree(case, ignore_errors=True)
    return counts


def sandbox_rounds(rounds: int, seed: int, polytrace: list[str]) -> dict:
    """Every sandbox attempt, `rounds` seeded variants of each, as `polytrace ...` subprocesses run in
    a working folder of their own (watched too), each given 60 s before it counts as not stopped.
    Returns the counts and prints each attempt that escaped, printed a traceback or was accepted."""
    import shutil

    counts = {"attempts": 0, "escapes": 0, "tracebacks": 0, "accepted": 0, "refused": 0, "by_attempt": {}}
    with tempfile.TemporaryDirectory(prefix="polytrace-sandbox-") as folder:
        root = Path(folder)
        logs = root / "logs" / "alpha"
        subprocess.run([*polytrace, "synth", "--task", "math", "--out", str(logs), "--num-steps", "2",
                        "--batch", "2", "--n", "2", "--seed", "4"], capture_output=True, check=True)
        store = root / "base.duckdb"
        subprocess.run([*polytrace, "ingest", str(logs), "--db", str(store)], capture_output=True, check=True)
        for round_no in range(rounds):
            for index, writer in enumerate(SANDBOX_ATTEMPTS):
                case = root / f"attempt-{round_no}-{index}"
                working = case / "cwd"
                working.mkdir(parents=True)
                attempt = writer(case, random.Random(seed * 100_003 + round_no * 101 + index), store)
                attempt.watched.append(working)
                before = folder_state(attempt.watched)
                try:
                    done = subprocess.run([*polytrace, *attempt.args], capture_output=True, text=True,
                                          timeout=60, cwd=working)
                    code, output = done.returncode, done.stdout + done.stderr
                except subprocess.TimeoutExpired as stopped:
                    code, output = None, f"{stopped.stdout or ''}{stopped.stderr or ''}"
                outcome = judge_attempt(attempt, code, output, before)
                counts["attempts"] += 1
                counts["escapes"] += outcome["escaped"]
                counts["tracebacks"] += outcome["traceback"]
                counts["accepted"] += outcome["accepted"]
                counts["refused"] += code not in (0, None)
                counts["by_attempt"][attempt.name] = counts["by_attempt"].get(attempt.name, 0) + 1
                if outcome["escaped"] or outcome["traceback"] or outcome["accepted"]:
                    print(json.dumps({**outcome, "output": output.strip()[-300:]}), flush=True)
                shutil.rmtree(case, ignore_errors=True)
    return counts


def store_summary(db: Path, polytrace: list[str]) -> object:
    """What a store holds, to compare with a clean one: `runs --json` (every run's counts and its
    semantics record) and the rows of every table that holds a run's data, by run name."""
    runs = subprocess.run([*polytrace, "runs", "--db", str(db), "--json"], capture_output=True, text=True)
    counts = subprocess.run([*polytrace, "query", "--db", str(db), "--json",
                             "select r.name, (select count(*) from step_metrics m where m.run_id = r.run_id) as pairs,"
                             " (select count(*) from samples s where s.run_id = r.run_id) as samples,"
                             " (select count(*) from run_semantics s where s.run_id = r.run_id) as records"
                             " from runs r order by r.name"], capture_output=True, text=True)
    return runs.stdout, counts.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kills", type=int, default=0, help="also kill -9 this many ingests (see kill_rounds)")
    parser.add_argument("--rotations", type=int, default=0,
                        help="also grow, rotate and grow this many logs (see rotation_rounds)")
    parser.add_argument("--sandbox", type=int, default=0,
                        help="also replay this many rounds of every sandbox attempt (see sandbox_rounds)")
    args = parser.parse_args()
    polytrace = [sys.executable, "-m", "polytrace_cli.cli"]
    if args.sandbox:
        confined = sandbox_rounds(args.sandbox, args.seed, polytrace)
        print(json.dumps(confined), flush=True)
        if confined["escapes"] or confined["tracebacks"] or confined["accepted"]:
            sys.exit(1)
    if args.rotations:
        rotated = rotation_rounds(args.rotations, args.seed)
        print(json.dumps(rotated), flush=True)
        if rotated["stores_differing"]:
            sys.exit(1)
    if args.kills:
        killed = kill_rounds(args.kills, args.seed, polytrace)
        print(json.dumps(killed), flush=True)
        if any(killed[key] for key in ("runs_without_files", "half_stored_files", "unopenable_stores",
                                       "stores_differing_after_reingest")):
            sys.exit(1)
    totals = {"inputs": 0, "tracebacks": 0, "lines_lost": 0, "escapes": 0, "stdout_not_json": 0}
    for round_no in range(args.rounds):
        for index, writer in enumerate(CASES):
            rng = random.Random(args.seed * 100_003 + round_no * 101 + index)
            with tempfile.TemporaryDirectory(prefix="polytrace-crash-") as folder:
                outcome = run_case(writer, Path(folder), rng, polytrace)
            totals["inputs"] += 1
            totals["tracebacks"] += outcome["traceback"]
            totals["lines_lost"] += outcome["lost"]
            totals["escapes"] += outcome["escaped"]
            totals["stdout_not_json"] += not outcome["stdout_is_json"]
            if outcome["traceback"] or outcome["lost"] or outcome["escaped"] or not outcome["stdout_is_json"]:
                print(json.dumps(outcome), flush=True)
    print(json.dumps(totals))
    if totals["tracebacks"] or totals["lines_lost"] or totals["escapes"] or totals["stdout_not_json"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
