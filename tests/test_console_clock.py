"""A console log's printed times as its steps' wall clock: engine scrapes joined to a console-only run,
untimed gaps measured on it, and the order of the clocks (a tracker's, then spans, then the console's).

The printed times are those of the tools that write them: `kubectl logs --timestamps` (RFC 3339 with
nanoseconds and `Z`), and slime's logging (THUDM/slime @ 624b824a898ab0ec1fcb4d373004c7f3852bf515,
`slime/observability/logging_utils.py`: `[%(asctime)s] %(filename)s:%(lineno)d - %(message)s` with
`datefmt="%Y-%m-%d %H:%M:%S"`, local time without a zone). verl's step line is its own
(`step:N - key:value - ...`, `verl/utils/tracking.py` console logger); NeMo-RL's block is
`nemo_rl/algorithms/grpo.py`'s (see tests/test_ingest_nemo_rl.py).
"""

from __future__ import annotations

import math
from datetime import datetime, timezone

import pytest

from polytrace_cli.analyze import consistency, engine
from polytrace_cli.analyze.common import ALL_STEPS
from polytrace_cli.ingest import console_lines as cl
from polytrace_cli.ingest.console.clock import UTC_ASSUMED, ZONED
from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.workload.engine_model import EngineModel, simulate

START = 1_700_000_000.0
UNTIMED = [0.0, 3.0, 6.0, 0.0]
TAIL = EngineModel(requests=96, seed=1)


def kubectl_stamp(seconds: float) -> str:
    """`kubectl logs --timestamps`' prefix: RFC 3339 in UTC with nanoseconds."""
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


def slime_stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("[%Y-%m-%d %H:%M:%S]")


def run_id(con, name):
    return con.execute("SELECT run_id FROM runs WHERE name = ?", [name]).fetchall()[0][0]


def test_printed_times_are_read_in_their_zone():
    import polars as pl

    stamps = ["2025-03-01 12:00:01,123 ", "[2025-03-01 12:00:01] ", "2025-03-01T12:00:01.5+05:30 ",
              "2025-03-01T12:00:01.123456789Z ", "2025-03-01T12:00:01-0100 "]
    frame = pl.DataFrame({"s": stamps}).select(t=cl.stamp_seconds(pl.col("s")), z=cl.stamp_has_zone(pl.col("s")))
    noon = datetime(2025, 3, 1, 12, 0, 1, tzinfo=timezone.utc).timestamp()
    assert frame["t"].to_list() == pytest.approx([noon + 0.123, noon, noon - 5.5 * 3600 + 0.5, noon + 0.123456789,
                                                  noon + 3600], abs=1e-6)
    assert frame["z"].to_list() == [False, False, True, True, True]
    assert cl.strip_stamp("2025-03-01 12:00:01,123 INFO step:3 - a:1") == "step:3 - a:1"
    assert cl.strip_stamp("[2025-10-30 10:00:00] train.py:401 - perf 3: {") == "perf 3: {"
    assert cl.strip_stamp("step:3 - a:1") == "step:3 - a:1"


@pytest.fixture
def console_run(store, tmp_path):
    """A verl console log read through `kubectl logs --timestamps` (every line stamped, some noise among
    them), beside a scrape file of its engine: (store, the generated run)."""
    run = simulate(TAIL, 4, START, untimed_s=UNTIMED)
    folder = tmp_path / "job"
    folder.mkdir()
    lines = [f"{kubectl_stamp(START - 5)} INFO 03-01 starting the trainer", "an unstamped line from a child process"]
    for step in run.steps:
        lines.append(f"{kubectl_stamp(step['start'] + 1)} (TaskRunner pid=7) Training Progress:  {step['step']}/4")
        lines.append(f"{kubectl_stamp(step['logged_at'])} (TaskRunner pid=7) step:{step['step']} - "
                     f"timing_s/gen:{step['gen_s']:.4f} - timing_s/step:{step['step_s']:.4f} - actor/pg_loss:0.1")
    (folder / "train.log").write_text("\n".join(lines) + "\n")
    (folder / "engine.prom").write_text(run.scrapes)
    reports = ingest_paths(store, [folder], run_name="job")
    assert {report.format for report in reports} == {"verl-console", "prometheus-scrape"}
    return store, run


def test_a_console_only_run_is_joined_to_its_scrapes_on_its_printed_times(console_run):
    con, run = console_run
    rid = run_id(con, "job")
    [log] = con.execute("SELECT lines, ignored, rejected FROM files WHERE format = 'verl-console'").fetchall()
    assert log == (10, 6, 0)  # 4 step lines stored; the stamped progress and start-up lines stay noise
    clock = con.execute("SELECT step, logged_at, source FROM step_clock ORDER BY step").fetchall()
    assert [(s, src) for s, _, src in clock] == [(k, "console") for k in (1, 2, 3, 4)]
    assert [t for _, t, _ in clock] == pytest.approx([s["logged_at"] for s in run.steps], abs=1e-5)
    windows = engine.step_windows(con, [rid], ALL_STEPS)
    assert windows["window_start"].to_list() == pytest.approx([s["start"] for s in run.steps], abs=1e-3)
    assert windows["rollout_end"].to_list() == pytest.approx([s["start"] + s["gen_s"] for s in run.steps], abs=1e-3)
    detail = engine.per_step(con, [rid], ALL_STEPS).sort("step")
    assert detail["step"].to_list() == [1, 2, 3, 4]
    for measured, truth in zip(detail.iter_rows(named=True), run.truth):
        assert abs(measured["low_share"] - truth["low_share"]) <= 0.05, (measured, truth)
        assert abs(measured["tail_share"] - truth["tail_share"]) <= 0.05, (measured, truth)
    assert set(detail["engine_state"].to_list()) == {"tail"}
    [summary] = engine.summary(con, [rid], ALL_STEPS).iter_rows(named=True)
    # Every scrape lies in a step's window but those taken in the untimed gaps (9 s at one a second).
    assert summary["samples_outside_steps"] == int(sum(UNTIMED) / TAIL.scrape_every)
    assert "console" in summary["basis"]
    meta = con.execute("SELECT json_extract_string(meta, '$.console_clock') FROM runs WHERE run_id = ?",
                       [rid]).fetchall()[0][0]
    assert meta == ZONED


def test_untimed_gaps_are_measured_on_the_console_clock(console_run):
    con, _ = console_run
    detail = consistency.per_step(con, [run_id(con, "job")], ALL_STEPS).sort("step")
    assert detail["gap_s"][0] is None
    assert detail["untimed_s"].to_list()[1:] == pytest.approx(UNTIMED[:-1], abs=1e-3)


def test_slime_times_without_a_zone_are_read_as_utc(store, tmp_path):
    # slime prints the rollout side's perf line when the rollout ends and the training side's when the
    # step ends; a step's clock is the latest, to the second slime prints.
    log = tmp_path / "slime.log"
    lines, ends = [], []
    for k in (1, 2, 3):
        start = START + 100.0 * (k - 1) + 0.25
        lines.append(f"{slime_stamp(start + 40)} rollout.py:88 - perf {k}: {{'perf/rollout_time': 40.0}}")
        lines.append(f"{slime_stamp(start + 60.6)} train_metric_utils.py:401 - perf {k}: "
                     f"{{'perf/train_wait_time': 40.0, 'perf/train_time': 20.6, 'perf/step_time': 60.6}}")
        ends.append(math.floor(start + 60.6))
    log.write_text("\n".join(lines) + "\n")
    [report] = ingest_paths(store, [log], run_name="slime")
    assert report.format == "slime-console"
    assert store.execute("SELECT step, logged_at FROM step_clock ORDER BY step").fetchall() == list(zip((1, 2, 3), ends))
    meta = store.execute("SELECT json_extract_string(meta, '$.console_clock') FROM runs").fetchall()[0][0]
    assert meta == UTC_ASSUMED


def test_nemo_rl_blocks_with_kubectl_times_are_read_and_clocked(store, tmp_path):
    log = tmp_path / "nemo.log"
    lines = []
    for k in (1, 2):
        end = START + 50.0 * k
        lines += [f"{kubectl_stamp(end - 45)} ========================= Step {k}/2 =========================",
                  f"{kubectl_stamp(end - 0.2)} 📊 Training Results:",
                  f"{kubectl_stamp(end - 0.2)}   • Loss: 0.0123",
                  f"{kubectl_stamp(end - 0.1)} ⏱️  Timing:",
                  f"{kubectl_stamp(end - 0.1)}   • Total step time: 45.00s",
                  f"{kubectl_stamp(end)}   • generation: 20.00s (44.4%)"]
    log.write_text("\n".join(lines) + "\n")
    [report] = ingest_paths(store, [log], run_name="nemo")
    assert report.format == "nemo-rl-console" and report.rejected == 0
    assert store.execute("SELECT step, step_s, gen_s FROM steps ORDER BY step").fetchall() == [(1, 45.0, 20.0),
                                                                                           (2, 45.0, 20.0)]
    clock = store.execute("SELECT step, logged_at FROM step_clock ORDER BY step").fetchall()
    assert [s for s, _ in clock] == [1, 2]
    assert [t for _, t in clock] == pytest.approx([START + 50.0, START + 100.0], abs=1e-5)


def test_a_tracker_clock_then_spans_come_before_the_console_clock(console_run):
    con, run = console_run
    rid = run_id(con, "job")
    file_id = con.execute("SELECT min(file_id) FROM files").fetchall()[0][0]
    # Spans of step 2 (wall clock) win over its console clock; the other steps keep theirs.
    t0 = run.steps[1]["start"] + 0.5
    con.execute("INSERT INTO spans (run_id, file_id, step, rank, role, name, stage, t0_us, t1_us, clock, synthesized)"
                " VALUES (?, ?, 2, 0, 'actor', 'gen', 'gen', ?, ?, 'wall', false)", [rid, file_id, t0 * 1e6, (t0 + 5) * 1e6])
    windows = {row["step"]: row for row in engine.step_windows(con, [rid], ALL_STEPS).iter_rows(named=True)}
    assert windows[2]["window_start"] == pytest.approx(t0) and windows[2]["window_end"] == pytest.approx(t0 + 5)
    assert windows[1]["window_end"] == pytest.approx(run.steps[0]["logged_at"], abs=1e-5)
    # A tracker's clock of one step: the run's steps are read on the tracker's clock alone.
    con.execute("INSERT INTO step_clock VALUES (?, ?, 0, 3, ?, 'tracker')", [rid, file_id, run.steps[2]["logged_at"] + 7])
    windows = {row["step"]: row for row in engine.step_windows(con, [rid], ALL_STEPS).iter_rows(named=True)}
    assert sorted(windows) == [2, 3] and windows[3]["window_end"] == pytest.approx(run.steps[2]["logged_at"] + 7)
    gaps = consistency.per_step(con, [rid], ALL_STEPS)
    assert gaps["gap_s"].null_count() == gaps.height  # one tracked step: no gap between two


def test_times_of_buffered_output_give_no_clock(store, tmp_path):
    # stdout to a pipe is block-buffered: a stamping tool dates each chunk's lines alike, long after the steps.
    log = tmp_path / "train.log"
    delivered = [START + 100.0, START + 100.0, START + 100.001, START + 250.0]
    log.write_text("".join(f"{kubectl_stamp(at)} step:{k} - timing_s/step:60.0 - timing_s/gen:20.0\n"
                           for k, at in enumerate(delivered, start=1)))
    [report] = ingest_paths(store, [log], run_name="buffered")
    assert report.format == "verl-console" and report.rejected == 0
    assert store.execute("SELECT count(*) FROM steps").fetchone() == (4,)
    assert store.execute("SELECT count(*) FROM step_clock").fetchone() == (0,)
    assert any("buffered output" in note for note in report.notes)
