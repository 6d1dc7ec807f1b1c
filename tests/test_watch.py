"""`polytrace watch` following logs written line by line by the project's step-log generator."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

import schema_check
from conftest import need_real_data, store_snapshot
from polytrace_cli.cli import app
from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.schemas import json_schema
from polytrace_cli.store import open_store
from polytrace_cli.watch import WatchSettings, watch_log
from polytrace_cli.watch.follow import crash_in
from polytrace_cli.watch.judge import StepJudge
from polytrace_cli.workload.distributions import LengthModel, Marginal
from polytrace_cli.workload.steplog import Injection, StepTimeModel, console_text, crash_lines, jsonl_text, step_table
from polytrace_cli.workload.synth import WorkloadSpec
from test_incremental_ingest import one_shot, store_rows

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json_schema("watch")
LENGTHS = LengthModel(prompt=Marginal("lognorm", {"s": 0.2, "scale": 100.0}),
                      response=Marginal("lognorm", {"s": 0.5, "scale": 800.0}))
SPEC = WorkloadSpec(task="math", steps=36, batch=16, n=4, dp_ranks=4, max_response_len=4500, drift=0.005, seed=11)
# Injected after the model has its first 8 training steps (steps 3..10; steps 1-2 warm up).
INJECTED = {20: "long_tail", 29: "unexplained"}
MODEL = StepTimeModel(injections=tuple(Injection(step, cause) for step, cause in INJECTED.items()))
LINE_DELAY = 0.005
POLL = "0.1"


class Watcher:
    """`polytrace watch --json` in a subprocess; every event line with the time it arrived."""

    def __init__(self, log: Path, db: Path, *extra: str):
        env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "polytrace_cli.cli", "watch", str(log), "--db", str(db), "--json", "--poll", POLL,
             *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.events: list[tuple[float, dict]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.events.append((time.monotonic(), json.loads(line)))

    def finish(self, timeout: float = 30) -> tuple[int, str]:
        try:
            code = self.process.wait(timeout=timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
        self._reader.join(5)
        return code, self.process.stderr.read()

    def of(self, event: str, kind: str | None = None) -> list[dict]:
        return [e for _, e in self.events if e["event"] == event and (kind is None or e.get("kind") == kind)]


def write_lines(log: Path, lines: list[str], written: dict[int, float] | None = None) -> None:
    """Append `lines` one by one, noting when each step line was about to be written."""
    with open(log, "a", encoding="utf-8") as handle:
        for line in lines:
            if written is not None and line.startswith("(TaskRunner pid=27182) step:"):
                written.setdefault(int(line.split("step:")[1].split(" ")[0]), time.monotonic())
            handle.write(line)
            handle.flush()
            time.sleep(LINE_DELAY)


# Generated once per worker in well under a second: the tests need not queue on one worker.
CHEAP_SHARED_FIXTURES = {"lines"}


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return console_text(step_table(LENGTHS, SPEC, MODEL), SPEC, MODEL).splitlines(keepends=True)


def wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def started(db: Path) -> None:
    """Wait until the watcher has opened its store (it then looks at the log every poll)."""
    wait_for(db.exists)
    time.sleep(0.5)


def test_watch_follows_a_log_line_by_line(tmp_path, lines):
    log = tmp_path / "job" / "train.log"
    log.parent.mkdir()
    log.write_text("")
    watcher = Watcher(log, tmp_path / "watched.duckdb", "--idle-exit", "1", "--run", "r")
    started(tmp_path / "watched.duckdb")
    written: dict[int, float] = {}
    write_lines(log, lines[:30])
    wait_for(lambda: watcher.of("step"))
    log.write_text("")  # the job's log is cut: read again whole from its new first line
    time.sleep(0.5)
    rewritten_at = time.monotonic()
    write_lines(log, lines, written)
    code, stderr = watcher.finish()
    assert code == 0, stderr
    for _, event in watcher.events:
        schema_check.validate(event, SCHEMA)
    steps = watcher.of("step")
    assert sorted(e["step"] for e in steps) == list(range(1, SPEC.steps + 1))  # step 0 only validates
    # Each step is told once the line that ends it is written, never before (how soon is timed by
    # benchmarks/watch_latency.py, not here: a busy machine must not fail a test).
    arrived = {e["step"]: at for at, e in watcher.events if e["event"] == "step" and at > rewritten_at}
    assert arrived and all(arrived[step] >= written[step] for step in arrived)
    assert len(watcher.of("truncated")) == 1
    by_step = {e["step"]: e for e in steps}
    assert by_step[5]["expected_s"] is None and "no model yet" in by_step[5]["note"]
    for step, cause in INJECTED.items():
        assert by_step[step]["slow"], by_step[step]
        assert by_step[step]["causes"][0]["cause"] == cause
        assert by_step[step]["seconds"] > by_step[step]["expected_s"]
    slow_alerts = {e["step"]: e for e in watcher.of("alert", "slow_step")}
    assert set(INJECTED) <= set(slow_alerts)
    assert sum(e["slow"] for e in steps if e["step"] not in INJECTED) <= 2  # a natural long tail may stand out
    watched = open_store(tmp_path / "watched.duckdb")
    rows = store_rows(watched)
    watched.close()
    assert rows == one_shot(tmp_path / "once.duckdb", log, "".join(lines).encode())


def test_watch_alerts_a_stall_then_exits_on_a_crash(tmp_path, lines):
    log = tmp_path / "job" / "train.log"
    log.parent.mkdir()
    log.write_text("")
    alerts = tmp_path / "alerts.jsonl"
    # The watch ends on the crash; the idle exit is only a backstop, far beyond any stall a busy machine
    # can stretch (the usual gap between steps is measured on arrival, so it grows with the load).
    watcher = Watcher(log, tmp_path / "w.duckdb", "--idle-exit", "600", "--stall-factor", "2",
                      "--on-alert", f"cat >> {alerts}")
    started(tmp_path / "w.duckdb")
    # Steps 1-10 at once, then one at a time, each written once the one before was told: the watcher
    # measures the usual gap between steps on their arrival, so it sees many gaps however slow a busy
    # machine makes it (steps that all arrive at once leave it only the logged step time, minutes here).
    written = 0
    for step in range(10, 25):
        end = next(i for i, line in enumerate(lines) if line.startswith(f"(TaskRunner pid=27182) step:{step} ")) + 2
        write_lines(log, lines[written:end])
        written = end
        wait_for(lambda: any(e["step"] == step for e in watcher.of("step")), timeout=120)
    # No new line: the silence outlasts the usual gap. The crash is written only after the stall was seen.
    wait_for(lambda: watcher.of("alert", "stall"), timeout=120)
    write_lines(log, [line + "\n" for line in crash_lines("oom")])
    code, stderr = watcher.finish()
    assert code == 3
    assert "the job crashed: oom: torch.OutOfMemoryError: CUDA out of memory" in stderr
    (stall,) = watcher.of("alert", "stall")
    assert stall["step"] == 24 and stall["seconds_since_step"] > 2 * stall["usual_gap_s"]
    (crash,) = watcher.of("alert", "crash")
    assert crash["cause"] == "oom" and crash["step"] == 24
    for _, event in watcher.events:
        schema_check.validate(event, SCHEMA)
    # --on-alert got each alert's JSON on stdin.
    assert [json.loads(line) for line in alerts.read_text().splitlines()] == watcher.of("alert")
    assert watcher.of("alert")[-2:] == [stall, crash]


def test_crash_signs_name_the_cause_and_the_exception():
    assert crash_in("".join(line + "\n" for line in crash_lines("nccl_timeout")))[0] == "nccl_timeout"
    cause, reason = crash_in("x\nTraceback (most recent call last):\n  File \"a.py\", line 1\nValueError: bad\n")
    assert (cause, reason) == ("traceback", "ValueError: bad")
    assert crash_in("step:3 - timing_s/gen:10.0\n") is None


def test_watch_a_missing_path_is_one_error_line(tmp_path):
    result = CliRunner().invoke(app, ["watch", str(tmp_path / "nothing.log"), "--db", str(tmp_path / "s.duckdb"),
                                      "--json"])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert f"{tmp_path / 'nothing.log'}: no such file or directory" in result.output


def _all_rows(con) -> dict[str, list[tuple]]:
    return store_snapshot(con, "path, sha256, bytes, format, lines, stored, ignored, rejected, rows")


def test_watching_a_real_trace_folder_as_its_step_files_land(tmp_path):
    """PolyTrace step files copied into a run folder one by one, watched in this process."""
    source = need_real_data("polytrace", "verl", "profile", "packed_length_log")
    stamp = next(source.iterdir())
    target = tmp_path / "verl" / "profile" / "packed_length_log" / stamp.name
    target.mkdir(parents=True)  # the run folder exists, empty, when watching starts
    files = sorted(stamp.iterdir(), key=lambda p: (p.name.split("_step_")[-1], p.name))

    def copy_one_by_one():
        for file in files:
            shutil.copyfile(file, target / file.name)
            time.sleep(0.15)

    writer = threading.Thread(target=copy_one_by_one)
    events: list[dict] = []
    con = open_store(tmp_path / "watched.duckdb")
    writer.start()
    result = watch_log(con, tmp_path / "verl", events.append, WatchSettings(poll=0.05, idle_exit=1.0))
    writer.join()
    watched = _all_rows(con)
    con.close()
    assert result.exit_code == 0 and result.run == "verl"
    steps = [e["step"] for e in events if e["event"] == "step"]
    step_files = [f for f in files if f.name.startswith("packed_lengths_step_")]
    assert sorted(steps) == sorted(int(f.stem.rsplit("_", 1)[1]) for f in step_files)
    for event in events:
        schema_check.validate(event, SCHEMA)
    once = open_store(tmp_path / "once.duckdb")
    ingest_paths(once, [tmp_path / "verl"])
    assert _all_rows(once) == watched
    once.close()


def test_a_traceback_the_job_survives_alerts_without_ending_the_watch(tmp_path, lines):
    log = tmp_path / "job" / "train.log"
    log.parent.mkdir()
    log.write_text("")
    step_lines = [i for i, line in enumerate(lines) if line.startswith("(TaskRunner pid=27182) step:")]
    cut = step_lines[12]
    traceback = ["Traceback (most recent call last):\n", '  File "reward.py", line 3, in score\n',
                 "ValueError: could not parse the answer\n"]

    def job():
        write_lines(log, lines[:cut])
        time.sleep(0.3)
        write_lines(log, traceback)
        time.sleep(0.2)
        write_lines(log, lines[cut:step_lines[15]])

    writer = threading.Thread(target=job)
    events: list[dict] = []
    con = open_store(tmp_path / "w.duckdb")
    writer.start()
    result = watch_log(con, log, events.append, WatchSettings(poll=0.05, idle_exit=1.5))
    writer.join()
    con.close()
    crashes = [e for e in events if e.get("kind") == "crash"]
    assert result.exit_code == 0 and crashes == [
        {"event": "alert", "kind": "crash", "cause": "traceback", "reason": "ValueError: could not parse the answer",
         "file": str(log.resolve()), "step": 12}]
    assert [e["step"] for e in events if e["event"] == "step"] == list(range(1, 16))


def test_the_generator_ends_a_log_with_a_crash_after_the_given_step():
    frame = step_table(LENGTHS, SPEC, MODEL)
    text = console_text(frame, SPEC, MODEL, crash_after=5, crash="nccl_timeout")
    steps = [line for line in text.splitlines() if line.startswith("(TaskRunner pid=27182) step:")]
    assert steps[-1].startswith("(TaskRunner pid=27182) step:5 ")
    assert text.endswith("\n".join(crash_lines("nccl_timeout")) + "\n")
    cause, reason = crash_in(text)
    assert cause == "nccl_timeout" and "Watchdog caught collective operation timeout" in reason
    assert console_text(frame, SPEC, MODEL) == console_text(frame, SPEC, MODEL, crash_after=None)


def test_a_log_rewritten_at_the_same_size_is_read_again_whole(tmp_path, lines):
    """A job restarted into its log, whose new text is exactly as long as the old: the watch sees the
    new modification time, the ingest finds the text replaced, a `truncated` event says so, and the
    store ends as one ingest of the final file."""
    log = tmp_path / "job" / "train.log"
    log.parent.mkdir()
    first = "".join(lines[:60])
    step = next(line for line in lines[:60] if line.startswith("(TaskRunner pid=27182) step:10 "))
    digit = next(i for i, c in enumerate(step) if c.isdigit() and i > step.index("timing_s/gen:"))
    changed = step[:digit] + str((int(step[digit]) + 1) % 10) + step[digit + 1:]
    second = first.replace(step, changed)
    assert len(second) == len(first) and second != first

    events: list[dict] = []

    def job():
        log.write_text(first)
        wait_for(lambda: any(e["event"] == "step" for e in events))  # the first text is read
        time.sleep(0.1)
        with open(log, "r+", encoding="utf-8") as handle:  # the same bytes' count, written over
            handle.write(second)

    log.write_text("")
    con = open_store(tmp_path / "w.duckdb")
    writer = threading.Thread(target=job)
    writer.start()
    result = watch_log(con, log, events.append, WatchSettings(poll=0.05, idle_exit=3.0, run="r"))
    writer.join()
    watched = store_rows(con)
    con.close()
    assert result.exit_code == 0
    truncated = [e for e in events if e["event"] == "truncated"]
    size = len(first.encode())
    assert truncated == [{"event": "truncated", "file": str(log), "bytes": size, "previous_bytes": size}]
    for event in events:
        schema_check.validate(event, SCHEMA)
    assert watched == one_shot(tmp_path / "once.duckdb", log, second.encode())


def test_watch_follows_a_verl_jsonl_log_line_by_line(tmp_path):
    """verl's file logger written a line at a time: one step event per step, the injected slow steps
    alerted, the store as one ingest of the final file."""
    text = jsonl_text(step_table(LENGTHS, SPEC, MODEL), SPEC, MODEL)
    log = tmp_path / "job" / "metrics.jsonl"
    log.parent.mkdir()
    log.write_text("")
    watcher = Watcher(log, tmp_path / "watched.duckdb", "--idle-exit", "1", "--run", "r")
    started(tmp_path / "watched.duckdb")
    write_lines(log, text.splitlines(keepends=True))
    code, stderr = watcher.finish()
    assert code == 0, stderr
    for _, event in watcher.events:
        schema_check.validate(event, SCHEMA)
    assert [e["step"] for e in watcher.of("step")] == list(range(1, SPEC.steps + 1))
    assert {e["step"] for e in watcher.of("alert", "slow_step")} >= set(INJECTED)
    watched = open_store(tmp_path / "watched.duckdb")
    rows = store_rows(watched)
    statuses = watched.execute("SELECT format, lines FROM files").fetchall()
    watched.close()
    assert statuses == [("verl-jsonl", text.count("\n"))]
    assert rows == one_shot(tmp_path / "once.duckdb", log, text.encode())


def judged_run(tmp_path: Path, model: StepTimeModel) -> tuple[dict[int, dict], dict[int, dict]]:
    """SPEC's run drawn with `model`, ingested whole and judged step by step as the watch judges it:
    ({step: its record}, {step: its truth row})."""
    frame = step_table(LENGTHS, SPEC, model)
    log = tmp_path / "job" / "train.log"
    log.parent.mkdir()
    log.write_text(console_text(frame, SPEC, model))
    con = open_store(tmp_path / "s.duckdb")
    ingest_paths(con, [log], run_name="r")
    records = StepJudge(con, con.execute("SELECT run_id FROM runs").fetchall()[0][0]).new_steps()
    con.close()
    return {r["step"]: r for r in records}, {row["step"]: row for row in frame.iter_rows(named=True)}


def test_a_step_is_judged_alike_whether_the_run_lands_at_once_or_a_piece_at_a_time(tmp_path, lines):
    """Walk-forward: a step's record (expected seconds, slow, causes) depends on the steps before it
    only, so the log read whole and judged once gives what the log read in seven growths gives, each
    judged as it lands (steps landing in one growth see none of each other's later steps)."""
    (tmp_path / "whole").mkdir()
    at_once, _ = judged_run(tmp_path / "whole", MODEL)
    log = tmp_path / "pieces" / "job" / "train.log"
    log.parent.mkdir(parents=True)
    log.write_text("")
    con = open_store(tmp_path / "pieces" / "s.duckdb")
    judge, records = None, []
    cuts = [len(lines) * k // 7 for k in range(1, 8)]
    for start, end in zip([0, *cuts], cuts):
        with open(log, "a", encoding="utf-8") as handle:
            handle.write("".join(lines[start:end]))
        ingest_paths(con, [log], run_name="r", complete_lines=True, batch=False)
        if judge is None and con.execute("SELECT count(*) FROM runs").fetchall()[0][0]:
            judge = StepJudge(con, con.execute("SELECT run_id FROM runs").fetchall()[0][0])
        records.extend(judge.new_steps() if judge else [])
    con.close()
    piecewise = {r["step"]: r for r in records}
    assert sorted(piecewise) == sorted(at_once) == list(range(1, SPEC.steps + 1))
    for step, record in at_once.items():
        other = piecewise[step]
        assert (other["slow"], [c["cause"] for c in other["causes"]]) == \
            (record["slow"], [c["cause"] for c in record["causes"]]), step
        assert (other["expected_s"] is None) == (record["expected_s"] is None), step
        if record["expected_s"] is not None:
            assert other["expected_s"] == pytest.approx(record["expected_s"], rel=1e-9), step
    assert sum(r["expected_s"] is not None for r in at_once.values()) >= SPEC.steps - 10


# A run whose training stages are token-bound: their seconds per token of the busiest rank are 5 times
# the generator's default (update_actor ≈ 10 s + 2.25e-4 s × ~18k tokens).
TOKEN_BOUND = tuple((name, a, 5 * b) for name, a, b in StepTimeModel().token_stages)
IMBALANCED_STEP = 24


def test_the_judge_flags_an_injected_dp_imbalance_when_it_costs_the_step_time(tmp_path):
    """The busiest DP rank holding 1.6 × the mean rank's tokens on step 24 of a token-bound run: the step
    is slow, and its cause is dp_imbalance in a token stage, of the size the generator's truth gives."""
    injected = {**INJECTED, IMBALANCED_STEP: "dp_imbalance"}
    model = StepTimeModel(token_stages=TOKEN_BOUND,
                          injections=tuple(Injection(step, cause) for step, cause in injected.items()))
    judged, truth = judged_run(tmp_path, model)
    for step, cause in injected.items():
        record = judged[step]
        assert record["slow"] and record["causes"][0]["cause"] == cause, (step, record)
    (cause,) = judged[IMBALANCED_STEP]["causes"]
    assert cause["stage"] == truth[IMBALANCED_STEP]["cause_dp_imbalance_stage"] == "update_actor"
    assert cause["seconds"] == pytest.approx(truth[IMBALANCED_STEP]["cause_dp_imbalance_s"], rel=0.25)
    assert sum(r["slow"] for step, r in judged.items() if step not in injected) <= 2


def test_an_injected_dp_imbalance_under_the_slow_rule_is_not_flagged(tmp_path):
    """With the generator's default costs the same imbalance adds under 1 s to a step of about 100 s,
    below the 5 % of the expected step that any slow step exceeds: the judge rightly passes it."""
    model = StepTimeModel(injections=(Injection(IMBALANCED_STEP, "dp_imbalance"),))
    judged, truth = judged_run(tmp_path, model)
    record = judged[IMBALANCED_STEP]
    assert truth[IMBALANCED_STEP]["cause_dp_imbalance_s"] < 0.05 * record["expected_s"] / 4
    assert not record["slow"]


def test_watch_gives_each_validation_once_with_its_values(tmp_path):
    """A run validating before training (step 0: a validation, not a step), every 10 steps and at its last
    step, half its log there when watching starts: one validation event each, right after its step's
    event, holding the values the log printed."""
    spec = replace(SPEC, steps=24)
    model = StepTimeModel(validate_every=10)
    text = console_text(step_table(LENGTHS, spec, model), spec, model)
    log = tmp_path / "job" / "train.log"
    log.parent.mkdir()
    lines = text.splitlines(keepends=True)
    log.write_text("".join(lines[:len(lines) // 2]))
    events: list[dict] = []

    def job():
        wait_for(lambda: any(e["event"] == "step" for e in events))
        with open(log, "a", encoding="utf-8") as handle:
            handle.write("".join(lines[len(lines) // 2:]))

    writer = threading.Thread(target=job)
    writer.start()
    con = open_store(tmp_path / "w.duckdb")
    watch_log(con, log, events.append, WatchSettings(poll=0.05, idle_exit=0.5, run="r"))
    writer.join()
    printed = dict(con.execute("SELECT step, value FROM step_metrics WHERE key = 'val-core/math/reward/mean@1'"
                               ).fetchall())
    con.close()
    for event in events:
        schema_check.validate(event, SCHEMA)
    validations = [e for e in events if e["event"] == "validation"]
    assert [e["step"] for e in validations] == [0, 10, 20, 24]
    assert all(key.startswith("val-") for e in validations for key in e["metrics"])
    assert {e["step"]: e["metrics"]["val-core/math/reward/mean@1"] for e in validations} == printed
    order = [(e["event"], e["step"]) for e in events if e["event"] in ("step", "validation")]
    for step in (10, 20, 24):
        assert order.index(("validation", step)) == order.index(("step", step)) + 1
    assert order[0] == ("validation", 0) and ("step", 0) not in order  # a validation alone is no step


def test_the_live_view_says_what_each_bar_colour_is():
    from rich.console import Console

    from polytrace_cli.watch.view import STAGE_STYLES, WatchView, stage_legend

    view = WatchView("train.log")
    for step in (1, 2):
        view.add({"event": "step", "step": step, "seconds": 10.0, "expected_s": 9.0, "slow": False, "causes": [],
                  "stages": {"gen": 6.0, "update_actor": 3.0, "testing": 0.0}})
    console = Console(width=120, record=True, color_system="truecolor")
    console.print(view)
    assert console.export_text().rstrip().splitlines()[-1] == "stages: █ gen  █ update_actor"
    legend = stage_legend(view.steps)
    # Each swatch has its stage's bar colour; a stage with no seconds in the shown steps is not listed.
    swatches = [str(span.style) for span in legend.spans if legend.plain[span.start:span.end] == "█"]
    assert swatches == [STAGE_STYLES["gen"], STAGE_STYLES["update_actor"]]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_watched_log_reaches_prometheus_and_the_webhook(tmp_path, lines):
    from test_watch_ops import Hook, series_of

    hook = Hook()
    port = _free_port()
    log = tmp_path / "job" / "train.log"
    log.parent.mkdir()
    log.write_text("")
    watcher = Watcher(log, tmp_path / "w.duckdb", "--idle-exit", "600", "--run", "ops",
                      "--metrics-port", str(port), "--webhook", hook.url)
    try:
        started(tmp_path / "w.duckdb")
        write_lines(log, lines)
        wait_for(lambda: len(watcher.of("step")) == SPEC.steps, timeout=240)
        wait_for(lambda: {b["step"] for b in hook.bodies if b["kind"] == "slow_step"} >= set(INJECTED), timeout=60)
        series = series_of(port)
    finally:
        watcher.process.terminate()
        watcher.finish()
        hook.close()
    run = (("run", "ops"),)
    last = watcher.of("step")[-1]
    assert series[("polytrace_last_step", run)] == last["step"]
    assert series[("polytrace_step_seconds", run)] == pytest.approx(last["seconds"])
    assert series[("polytrace_alerts_total", (("kind", "slow_step"), ("run", "ops")))] == len(
        watcher.of("alert", "slow_step"))
    posted = [b for b in hook.bodies if b["kind"] == "slow_step"]
    assert [b["step"] for b in posted] == [a["step"] for a in watcher.of("alert", "slow_step")]
    assert all(b["run"] == "ops" and b["text"].startswith("polytrace: run ops: step ") for b in posted)
def test_other_commands_open_the_store_between_the_polls_of_a_watch(tmp_path, lines):
    """`watch` holds the store's write lock only while a poll writes: `runs --wait 30` gets through
    while it runs, and sees what it stored."""
    from typer.testing import CliRunner

    from polytrace_cli.cli import app

    log = tmp_path / "job" / "train.log"
    log.parent.mkdir()
    log.write_text("".join(lines[:40]))
    db = tmp_path / "w.duckdb"
    watcher = Watcher(log, db, "--idle-exit", "60", "--poll", "0.2", "--run", "r")
    try:
        wait_for(db.exists, timeout=60)
        listed: list = []
        deadline = time.monotonic() + 90
        while not listed and time.monotonic() < deadline:
            result = CliRunner().invoke(app, ["runs", "--db", str(db), "--wait", "30", "--json"])
            assert result.exit_code == 0, result.output  # never "locked by another process"
            listed = [run["run"] for run in json.loads(result.stdout)]
        assert listed == ["r"] and watcher.process.poll() is None  # answered while the watch runs
        write_lines(log, lines[40:60])
        result = CliRunner().invoke(app, ["query", "select count(*) as n from runs", "--db", str(db), "--wait", "30",
                                          "--json"])
        assert result.exit_code == 0 and json.loads(result.stdout) == [{"n": 1}], result.output
    finally:
        watcher.process.kill()
        watcher.finish()


def _buffered_log(lines: list[str], bar_steps: int, late_step: int) -> tuple[str, list[str]]:
    """The log's head, then pieces as a job whose stdout is buffered writes them: the bars of the
    first `bar_steps` steps alone (verl draws its `Training Progress` bar on stderr, unbuffered), then
    those steps' metric lines, then the rest in pieces of 10 lines. Step `late_step`'s bar and every
    later one are drawn 200 s later than the job's (a bar drawn after a wait the step's own timers
    leave out), so judged from the bar alone that step is slow."""
    import re

    def later(line: str) -> str:
        def shifted(match):
            parts = [int(p) for p in match.group(1).split(":")]
            seconds = sum(p * 60 ** i for i, p in enumerate(reversed(parts))) + 200
            return f"[{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}<"
        return re.sub(r"\[([\d:]+)<", shifted, line)

    first = next(i for i, line in enumerate(lines) if " step:" in line)
    bars = [i for i, line in enumerate(lines) if line.startswith("Training Progress")]
    cut = bars[bar_steps - 1] + 1
    body = [later(line) if line.startswith("Training Progress") and int(line.split("|")[2].split("/")[0]) >= late_step
            else line for line in lines[first:]]
    early = body[:cut - first]
    pieces = ["".join(line for line in early if line.startswith("Training Progress")),
              "".join(line for line in early if not line.startswith("Training Progress"))]
    pieces += ["".join(body[i:i + 10]) for i in range(cut - first, len(body), 10)]
    return "".join(lines[:first]), pieces


def test_steps_first_judged_from_progress_bars_are_corrected_when_their_records_land(tmp_path):
    """verl's bar lands before the metric lines stdout buffers: the first 12 of 16 steps are judged from
    the bar (tqdm estimates: whole seconds, no stages), step 11 slow by a bar drawn 200 s late. Once
    their records land, each comes again `corrected`, judged as one read of the whole final log judges
    it (its logged seconds and stages, expected seconds, slow flag, causes); step 11's slow alert is
    withdrawn. The log is written a piece per poll by the watch's own sleep: no timing."""
    spec, model = replace(SPEC, steps=16), StepTimeModel(injections=(Injection(14, "long_tail"),))
    frame = step_table(LENGTHS, spec, model)
    head, pieces = _buffered_log(console_text(frame, spec, model).splitlines(keepends=True), bar_steps=12,
                                 late_step=11)
    log = tmp_path / "job" / "train.log"
    log.parent.mkdir()
    log.write_text(head)
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds
        if pieces:
            with open(log, "a", encoding="utf-8") as handle:
                handle.write(pieces.pop(0))

    events = []
    con = open_store(tmp_path / "s.duckdb")
    result = watch_log(con, log, events.append, WatchSettings(poll=1.0, idle_exit=2.0, run="r"),
                       clock=lambda: now[0], sleep=sleep)
    con.close()
    once = open_store(tmp_path / "once.duckdb")
    ingest_paths(once, [log], run_name="r")
    at_once = {r["step"]: r for r in StepJudge(once, once.execute("SELECT run_id FROM runs").fetchall()[0][0]).new_steps()}
    once.close()
    validator = jsonschema.Draft202012Validator(SCHEMA)
    for event in events:
        validator.validate(event)
    first = {e["step"]: e for e in events if e["event"] == "step" and not e.get("corrected")}
    corrected = {e["step"]: e for e in events if e["event"] == "step" and e.get("corrected")}
    assert sorted(first) == sorted(at_once) == list(range(1, 17)) and result.steps == 16
    assert sorted(corrected) == list(range(1, 13))
    assert all(first[step]["stages"] == {} for step in range(1, 13))  # from the bar: no stage
    truth = dict(zip(frame["step"].to_list(), frame["step_s"].to_list()))
    assert first[11]["slow"] and first[11]["seconds"] == pytest.approx(truth[11] + 200, abs=1)
    alerts = [(e["kind"], e["step"]) for e in events if e["event"] == "alert"]
    assert alerts.index(("slow_step", 11)) < alerts.index(("slow_step_withdrawn", 11))
    final = {**first, **corrected}
    for step, record in at_once.items():
        mine = final[step]
        assert mine["seconds"] == pytest.approx(truth[step], rel=1e-9) == record["seconds"], step
        assert mine["stages"] == pytest.approx(record["stages"], rel=1e-12) and mine["stages"], step
        assert (mine["slow"], [c["cause"] for c in mine["causes"]]) == \
            (record["slow"], [c["cause"] for c in record["causes"]]), step
        assert (mine["expected_s"] is None) == (record["expected_s"] is None), step
        if record["expected_s"] is not None:
            assert mine["expected_s"] == pytest.approx(record["expected_s"], rel=1e-9), step
    assert sum(record["expected_s"] is not None for record in at_once.values()) >= 6 and at_once[14]["slow"]
    slow_alerts = {e["step"] for e in events if e["event"] == "alert" and e["kind"] == "slow_step"}
    withdrawn = {e["step"] for e in events if e["event"] == "alert" and e["kind"] == "slow_step_withdrawn"}
    assert slow_alerts - withdrawn == {step for step, record in at_once.items() if record["slow"]}
