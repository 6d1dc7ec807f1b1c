"""The time axis: spans synthesized from stage timers, the timeline analysis (golden numbers worked out
by hand below), `export --format chrome-trace` checked against the trace-event format's rules,
`explain`'s held_by, and figure F13."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

import schema_check
from conftest import PROJECT_ROOT
from polytrace_cli.analyze import timeline
from polytrace_cli.analyze.common import StepRange
from polytrace_cli.cli import app
from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.schemas import json_schema
from polytrace_cli.store import open_store

TORCH = PROJECT_ROOT / "tests" / "fixtures" / "traces" / "torch"
ALL = StepRange()
US = 1e-6


def _x(name, tid, t0, t1, step):
    return {"ph": "X", "name": name, "pid": 1, "tid": tid, "ts": t0, "dur": t1 - t0, "args": {"step": step}}


# Two actor ranks and a rollout rank, µs on one file's clock (see the numbers in the tests).
GOLDEN_EVENTS = [
    _x("gen", "actor rank_0", 0, 100, 1), _x("actor_update", "actor rank_0", 100, 160, 1),
    _x("nccl:all_reduce", "actor rank_0", 140, 160, 1),
    _x("gen", "actor rank_1", 0, 80, 1), _x("actor_update", "actor rank_1", 100, 170, 1),
    _x("nccl:all_reduce", "actor rank_1", 165, 170, 1),
    _x("gen", "rollout rank_0", 150, 250, 2),
    _x("actor_update", "actor rank_0", 260, 300, 2), _x("actor_update", "actor rank_1", 260, 310, 2),
]

# verl's file logger: three steps with stage timers; per-rank reward seconds for step 1.
TIMERS = [(1, {"gen": 10, "reward": 2, "old_log_prob": 3, "update_actor": 5, "step": 21}),
          (2, {"gen": 12, "reward": 2, "update_actor": 6, "step": 20}),
          (3, {"gen": 8, "update_actor": 4, "step": 12})]


@pytest.fixture(scope="module")
def timeline_store(tmp_path_factory):
    folder = tmp_path_factory.mktemp("timeline")
    con = open_store(folder / "t.duckdb")
    golden = folder / "golden.json"
    golden.write_text(json.dumps({"traceEvents": GOLDEN_EVENTS}))
    ingest_paths(con, [golden], run_name="golden")
    timers = folder / "timers" / "metrics.jsonl"
    timers.parent.mkdir()
    timers.write_text("".join(json.dumps({"step": step, "data": {f"timing_s/{k}": v for k, v in data.items()}}) + "\n"
                              for step, data in TIMERS))
    reward = folder / "timers" / "reward_timings_step_1.jsonl"
    reward.write_text("".join(json.dumps({"step": 1, "rank": r, "dp_rank": r, "tp_rank": 0, "batch_size": 4,
                                          "reward_time_s": s}) + "\n" for r, s in ((0, 1.5), (1, 2.5))))
    ingest_paths(con, [timers.parent], run_name="timers")
    # A verl log with lengths and timers over twelve steps, and the torch traces of its steps 1 and 2.
    mixed = folder / "mixed"
    mixed.mkdir()
    (mixed / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "data": {"timing_s/gen": 10 + (s % 3), "timing_s/update_actor": 5 + (s % 2) * 0.5,
                                        "timing_s/step": 16 + (s % 3) + (s % 2) * 0.5,
                                        "response_length/mean": 200 + 10 * (s % 4), "response_length/max": 900 + s}}) + "\n"
        for s in range(1, 13)))
    ingest_paths(con, [mixed / "metrics.jsonl", TORCH], run_name="mixed")
    ids = dict(con.execute("SELECT name, run_id FROM runs").fetchall())
    con.close()
    # Read-only, as the commands open it: the CLI tests open the same file beside it.
    con = open_store(folder / "t.duckdb", read_only=True)
    yield con, ids, folder
    con.close()


def test_golden_steps_bubbles_straggler_overlap_and_critical_path(timeline_store):
    con, ids, _ = timeline_store
    steps = {row["step"]: row for row in timeline.per_step(con, [ids["golden"]], ALL).iter_rows(named=True)}
    one, two = steps[1], steps[2]
    assert one["window_s"] == pytest.approx(170 * US)
    # gen: ranks busy 100 and 80 µs; update: 60 − 20 and 70 − 5 µs once the all-reduce waits are taken out.
    assert one["bubble_s"] == pytest.approx(45 * US)
    assert one["bubble_share"] == pytest.approx(45 / 330)
    assert (one["straggler"], one["straggler_rank"], one["straggler_stage"]) == ("actor rank 1", 1, "update_actor")
    assert one["straggler_lead"] == pytest.approx(65 / 52.5)
    # Step 2's generation (150-250 µs) runs beside step 1's update (100-170 µs): 20 µs of 70.
    assert one["overlap_s"] == pytest.approx(20 * US) and one["overlap_share"] == pytest.approx(20 / 70)
    assert one["critical_path"] == "gen (actor rank 0) → update_actor (actor rank 1)"
    assert one["critical_path_s"] == pytest.approx(170 * US) and one["critical_stage"] == "gen"
    assert two["window_s"] == pytest.approx(160 * US) and two["bubble_share"] == pytest.approx(0.1)
    assert two["straggler_lead"] == pytest.approx(50 / 45) and two["overlap_s"] == 0
    assert two["critical_path"] == "gen (rollout rank 0) → update_actor (actor rank 1)"
    assert two["critical_path_s"] == pytest.approx(150 * US)


def test_golden_busy_and_idle_per_rank_and_stage(timeline_store):
    con, ids, _ = timeline_store
    ranks = {row["worker"]: row for row in timeline.per_rank(con, [ids["golden"]], ALL).iter_rows(named=True)}
    assert ranks["actor rank 0"]["busy_s"] == pytest.approx(180 * US)
    assert ranks["actor rank 0"]["idle_s"] == pytest.approx(150 * US)
    assert ranks["actor rank 1"]["idle_share"] == pytest.approx(135 / 330)
    assert ranks["actor rank 1"]["straggler_steps"] == 2 and ranks["actor rank 0"]["straggler_steps"] == 0
    assert ranks["rollout rank 0"]["window_s"] == pytest.approx(160 * US)
    stages = timeline.per_rank_stage(con, [ids["golden"]], ALL)
    update = stages.filter((pl.col("worker") == "actor rank 1") & (pl.col("stage") == "update_actor")).row(0, named=True)
    assert update["busy_s"] == pytest.approx(115 * US) and update["steps"] == 2 and update["spans"] == 2
    summary = timeline.summary(con, [ids["golden"]], ALL).row(0, named=True)
    assert summary["basis"] == "spans" and summary["steps"] == 2 and summary["workers"] == 3
    assert summary["mean_bubble_share"] == pytest.approx((45 / 330 + 0.1) / 2)
    assert summary["mean_overlap_share"] == pytest.approx((20 / 70) / 2)
    assert summary["mean_idle_share"] == pytest.approx((150 / 330 + 135 / 330 + 60 / 160) / 3)
    assert (summary["top_straggler"], summary["top_straggler_share"], summary["critical_stage"]) == ("actor rank 1", 1.0, "gen")


def test_spans_are_synthesized_from_stage_timers_in_verl_order(timeline_store):
    con, ids, _ = timeline_store
    spans = timeline.run_spans(con, [ids["timers"]], ALL)
    assert spans.get_column("synthesized").all()
    laid = [(r["step"], r["stage"], r["rank"], r["t0_us"] / 1e6, r["t1_us"] / 1e6)
            for r in spans.sort("t0_us", "rank").iter_rows(named=True)]
    assert laid == [
        (1, "gen", None, 0, 10), (1, "reward", 0, 10, 11.5), (1, "reward", 1, 10, 12.5),
        (1, "old_log_prob", None, 12.5, 15.5), (1, "update_actor", None, 15.5, 20.5),
        # Step 2 starts at step 1's logged 21 s, step 3 at 41 s.
        (2, "gen", None, 21, 33), (2, "reward", None, 33, 35), (2, "update_actor", None, 35, 41),
        (3, "gen", None, 41, 49), (3, "update_actor", None, 49, 53)]
    step_one = timeline.per_step(con, [ids["timers"]], ALL).filter(pl.col("step") == 1).row(0, named=True)
    assert step_one["synthesized"] and step_one["straggler"] == "reward rank 1"
    assert step_one["bubble_s"] == pytest.approx(1.0) and step_one["straggler_lead"] == pytest.approx(1.25)
    assert step_one["overlap_s"] is None  # laid end to end, overlap is not measured
    summary = timeline.summary(con, [ids["timers"]], ALL).row(0, named=True)
    assert summary["basis"] == "synthesized" and summary["mean_idle_share"] is None
    assert "synthesized" in summary["note"]


def _check_trace_event_rules(document: dict) -> None:
    """The trace-event format's rules Perfetto and chrome://tracing rely on."""
    events = document["traceEvents"]
    named_pids = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    named_tids = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    by_thread: dict[tuple, list] = {}
    for event in events:
        assert isinstance(event["ph"], str) and "pid" in event
        if event["ph"] == "M":
            continue
        assert event["pid"] in named_pids, event
        assert isinstance(event["ts"], (int, float)) and event["ts"] >= 0
        if event["ph"] == "C":
            continue
        assert (event["pid"], event["tid"]) in named_tids, event
        if event["ph"] == "X":
            assert isinstance(event["dur"], (int, float)) and event["dur"] >= 0
            by_thread.setdefault((event["pid"], event["tid"]), []).append((event["ts"], event["ts"] + event["dur"]))
    for spans in by_thread.values():
        open_ends: list[float] = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1] + 1e-6, "X events of one thread must nest"
            open_ends.append(end)


def test_export_chrome_trace_follows_the_format_rules(timeline_store):
    con, _, folder = timeline_store
    db = str(folder / "t.duckdb")
    output = folder / "mixed.trace.json"
    result = CliRunner().invoke(app, ["export", "mixed", "--format", "chrome-trace", "--output", str(output), "--db", db])
    assert result.exit_code == 0, result.output
    document = json.loads(output.read_text())
    _check_trace_event_rules(document)
    events = document["traceEvents"]
    processes = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert processes == {"run mixed", "actor", "rollout"}
    threads = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert any(t.startswith("rank 0") for t in threads) and any(t.startswith("rank 1") for t in threads)
    assert sorted(e["name"] for e in events if e.get("cat") == "step") == ["step 1", "step 2"]
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert counters == {"longest response"}  # the log has no token counts and no per-rank loads
    assert not document["otherData"]["synthesized"]


def test_export_marks_synthesized_spans_and_keeps_the_steps_asked_for(timeline_store):
    con, _, folder = timeline_store
    output = folder / "timers.trace.json"
    result = CliRunner().invoke(app, ["export", "timers", "--format", "chrome-trace", "--output", str(output),
                                      "--steps", "2:3", "--db", str(folder / "t.duckdb")])
    assert result.exit_code == 0, result.output
    document = json.loads(output.read_text())
    _check_trace_event_rules(document)
    spans = [e for e in document["traceEvents"] if e["ph"] == "X" and e.get("cat") != "step"]
    assert {e["args"]["step"] for e in spans} == {2, 3}
    assert all(e["name"].endswith("(synthesized)") and e["args"]["synthesized"] for e in spans)
    assert document["otherData"]["synthesized"] is True


@pytest.mark.parametrize("arguments, message", [
    (["--format", "chrome-trace"], "needs --output"),
    (["--format", "chrome-trace", "--format", "packed", "--output", "x.json"], "apart from"),
    (["--out", "folder", "--steps", "1:2"], "go with --format chrome-trace"),
])
def test_export_options_that_do_not_go_together_are_one_line_errors(timeline_store, arguments, message):
    _, _, folder = timeline_store
    result = CliRunner().invoke(app, ["export", "timers", *arguments, "--db", str(folder / "t.duckdb")])
    assert result.exit_code != 0 and message in result.output and "Traceback" not in result.output


def test_explain_names_the_rank_and_stage_that_held_a_step(timeline_store):
    con, ids, folder = timeline_store
    from polytrace_cli.diagnose.explain import explain_run

    explanation = explain_run(con, "mixed", step=2)
    document = explanation.to_dict()
    schema_check.validate(document, json_schema("explain"))
    [step] = document["steps"]
    held = step["held_by"]
    # Rank 1 does twice rank 0's work in every mini-batch; rank 0 waits for it in the all-reduce.
    assert (held["worker"], held["rank"], held["stage"]) == ("actor rank 1", 1, "update_actor")
    assert held["lead"] > 1.5
    assert any("held_by" in note for note in document["notes"])


def test_figure_f13_draws_lanes_and_leaves_out_runs_without_spans(timeline_store):
    from polytrace_cli.report.figures import f13_step_lanes
    from polytrace_cli.report.figures.base import Omitted

    con, ids, _ = timeline_store
    frames = f13_step_lanes.frames(con, [ids["golden"]], ALL)
    lanes = frames["lanes"]
    assert set(lanes.get_column("which")) == {"slowest", "typical"}
    assert lanes.filter(pl.col("which") == "slowest").get_column("step").unique().to_list() == [1]
    assert not isinstance(f13_step_lanes.render(frames), Omitted)
    empty = f13_step_lanes.frames(con, [], ALL)
    assert isinstance(f13_step_lanes.render(empty), Omitted)
