"""Trace readers: PyTorch profiler (Kineto) traces, Nsight Systems SQLite exports, AReaL's perf and
session tracers, NeMo-RL's workload trace, Chrome trace-event JSON and JSON lines.

Fixtures (tests/fixtures/traces/):
- torch/: written by the real PyTorch profiler (torch 2.13.0, CPU) with `write_torch_traces.py`: two
  gloo ranks, two steps in verl's discrete mode, verl's file-name grammar (verl `docs/perf/
  torch_profiling.md`; the older `prof_rank-<r>.json.gz` of `verl/utils/profiler/torch_profile.py` @
  b178a3cd56f58b2d502255daba591e92833930a7) and its `record_function` names (`verl/workers/
  fsdp_workers.py` @ b178a3cd: `actor_compute_log_prob`, `ref_compute_log_prob`, `actor_update`), and a
  rollout replica's trace under `agent_loop_rollout_replica_0/`;
- areal/, nemo_rl/, nsys/: written by `write_layout_fixtures.py` from AReaL's `areal/utils/perf_tracer.py`
  (inclusionAI/AReaL @ 4aef98d8d818af55b43621aaadba047ae10f4e77), NeMo-RL's `nemo_rl/utils/trace.py`
  (NVIDIA-NeMo/RL @ 438f2850b3c5e410added59d54608688ac40d3d6) and the Nsight Systems SQLite export schema.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest

from conftest import PROJECT_ROOT
from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.ingest.trace_events.pieces import TracePieces, split_piece
from polytrace_cli.store import open_store

TRACES = PROJECT_ROOT / "tests" / "fixtures" / "traces"
TORCH = TRACES / "torch"


def _rows(con, sql, params=None):
    return con.execute(sql, params or []).fetchall()


@pytest.fixture(scope="module")
def traces_store(tmp_path_factory):
    """One store holding every fixture layout, each its own run."""
    path = tmp_path_factory.mktemp("traces") / "traces.duckdb"
    con = open_store(path)
    reports = {}
    for run, folder in (("torch", TORCH), ("areal", TRACES / "areal"), ("nemo", TRACES / "nemo_rl"),
                        ("nsys", TRACES / "nsys")):
        reports[run] = ingest_paths(con, [folder], run_name=run)
    yield con, reports
    con.close()


# --- the piece reader -------------------------------------------------------------------------------

@pytest.mark.parametrize("block", [509, 1 << 20])
def test_pieces_give_back_every_event_and_the_outer_document(block):
    path = next(TORCH.glob("actor_train_step1_rank1*.json.gz"))
    truth = json.loads(gzip.decompress(path.read_bytes()))
    pieces = TracePieces(path, block_bytes=block)
    events = [event for piece in pieces for event in json.loads(piece)]
    assert events == truth["traceEvents"]
    assert pieces.outer == {k: v for k, v in truth.items() if k != "traceEvents"}
    assert pieces.problem is None


def test_pieces_are_cut_outside_strings_and_escapes(tmp_path):
    # Braces, brackets, commas and escaped quotes inside strings must not cut an event.
    tricky = {"name": 'a{"[,]}\\"\\\\', "ph": "X", "ts": 1, "dur": 2, "args": {"x": [1, {"y": "]},"}]}}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"deviceProperties": [{"id": 0}], "traceEvents": [tricky] * 40, "traceName": "x"}))
    for block in (5, 17, 64):
        pieces = TracePieces(path, block_bytes=block)
        events = [event for piece in pieces for event in json.loads(piece)]
        assert events == [tricky] * 40
        assert pieces.outer == {"deviceProperties": [{"id": 0}], "traceName": "x"}
    piece = b'[{"a": "x,y"}, {"b": [1, 2]} ,\n{"c": "}"}]'
    assert [json.loads(p) for p in split_piece(piece)] == [{"a": "x,y"}, {"b": [1, 2]}, {"c": "}"}]


def test_a_file_cut_inside_the_event_array_keeps_the_events_before_the_cut(tmp_path, store):
    events = [{"ph": "X", "name": "actor_update", "ts": 10 * i, "dur": 5, "pid": 1, "tid": 1} for i in range(5)]
    text = json.dumps({"traceEvents": events})
    path = tmp_path / "cut.json"
    path.write_text(text[: text.rindex("{") + 12])  # the fifth event is cut off
    [report] = ingest_paths(store, [path], run_name="cut")
    assert report.status == "ingested" and report.stored == 4 and report.rejected == 1
    assert _rows(store, "SELECT count(*) FROM spans")[0][0] == 4
    assert "cut short" in " ".join(report.notes)


# --- PyTorch profiler traces written by torch 2.13.0 ------------------------------------------------

def test_verl_file_names_give_role_rank_parallel_ranks_and_step(traces_store):
    con, reports = traces_store
    assert {r.format for r in reports["torch"]} == {"pytorch-profiler"}
    rows = _rows(con, """SELECT DISTINCT f.path, s.role, s.rank, s.dp_rank, s.tp_rank, s.pp_rank, s.cp_rank, s.step,
                                s.replica, s.clock
                         FROM spans s JOIN files f USING (file_id) JOIN runs r ON r.run_id = s.run_id
                         WHERE r.name = 'torch' AND s.name <> 'gpu kernels' ORDER BY 1""")
    facts = {Path(path).name.split("_pid")[0] if "_pid" in path else Path(path).parent.name: rest for path, *rest in rows}
    assert facts["actor_train_step1_rank0-of-2_tp0-pp0-dp0-cp0"] == ["actor", 0, 0, 0, 0, 0, 1, None, "wall"]
    assert facts["actor_train_step2_rank1-of-2_tp0-pp0-dp1-cp0"] == ["actor", 1, 1, 0, 0, 0, 2, None, "wall"]
    # The replica's trace: role rollout, ranked by its replica, its tensor rank from the engine's `rank0`.
    assert facts["agent_loop_rollout_replica_0"] == ["rollout", 0, None, 0, None, None, None, 0, "wall"]


def test_torch_ranges_are_stored_with_their_stages_and_operators_are_counted(traces_store):
    con, reports = traces_store
    path = next(TORCH.glob("actor_train_step2_rank0*.json.gz"))
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    annotations = [e for e in events if e.get("cat") == "user_annotation"]
    operators = sum(1 for e in events if e.get("cat") == "cpu_op")
    own = sum(1 for e in events if e.get("cat") == "Trace")
    report = next(r for r in reports["torch"] if Path(r.path).name == path.name)
    assert report.stored == len(annotations) and report.rejected == 0
    assert report.lines == len(events)
    file_id = _rows(con, "SELECT file_id FROM files WHERE path LIKE ?", [f"%{path.name}"])[0][0]
    ignored = dict(_rows(con, "SELECT rule, lines FROM ignored_lines WHERE file_id = ?", [file_id]))
    assert ignored["CPU operator inside a range"] == operators
    assert ignored["the profiler's own span (its window or overhead)"] == own == 1
    stored = dict(_rows(con, "SELECT name, stage FROM spans WHERE file_id = ?", [file_id]))
    assert stored["actor_compute_log_prob"] == "old_log_prob" and stored["ref_compute_log_prob"] == "ref"
    assert stored["actor_update"] == stored["train_batch"] == stored["mini_batch1"] == "update_actor"
    assert stored["gloo:all_reduce"] is None
    # Wall clock: baseTimeNanoseconds / 1000 + ts, exactly.
    update = next(e for e in annotations if e["name"] == "actor_update")
    base = json.loads(gzip.decompress(path.read_bytes()))["baseTimeNanoseconds"]
    t0, t1 = _rows(con, "SELECT t0_us, t1_us FROM spans WHERE file_id = ? AND name = 'actor_update'", [file_id])[0]
    # µs since the epoch in a double keep a quarter of a µs.
    assert t0 == pytest.approx(base / 1000 + update["ts"], abs=0.5)
    assert t1 - t0 == pytest.approx(update["dur"], abs=0.5)


def test_ranks_profiled_together_line_up_on_wall_clock(traces_store):
    con, _ = traces_store
    (gap,) = _rows(con, """SELECT abs(max(t0_us) FILTER (WHERE rank = 0) - max(t0_us) FILTER (WHERE rank = 1))
                           FROM spans s JOIN runs r ON r.run_id = s.run_id
                           WHERE r.name = 'torch' AND s.name = 'actor_update' AND s.step = 2""")[0]
    assert gap < 50_000  # both ranks enter step 2's update within 50 ms of each other


def test_the_replica_folder_does_not_name_a_run(tmp_path, store):
    folder = tmp_path / "my_run" / "agent_loop_rollout_replica_0"
    folder.mkdir(parents=True)
    source = next((TORCH / "agent_loop_rollout_replica_0").glob("*.json.gz"))
    (folder / source.name).write_bytes(source.read_bytes())
    ingest_paths(store, [tmp_path / "my_run"])
    assert _rows(store, "SELECT name FROM runs") == [("my_run",)]


def test_kernels_are_summed_into_the_ranges_that_launched_them(tmp_path, store):
    def x(name, cat, pid, tid, ts, dur, **args):
        return {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}
    events = [
        {"ph": "M", "name": "process_name", "pid": 100, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "pid": 100, "tid": 100, "args": {"name": "thread 100 (python)"}},
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 7, "args": {"name": "stream 7"}},
        x("actor_update", "user_annotation", 100, 100, 1000, 5000),
        x("mini_batch0", "user_annotation", 100, 100, 1100, 2000),
        x("cudaLaunchKernel", "cuda_runtime", 100, 100, 1200, 10, correlation=1),
        x("cudaLaunchKernel", "cuda_runtime", 100, 100, 3500, 10, correlation=2),
        x("cudaLaunchKernel", "cuda_runtime", 100, 100, 7000, 10, correlation=3),
        x("gemm", "kernel", 0, 7, 1300, 400, correlation=1),
        x("gemm", "kernel", 0, 7, 3600, 1000, correlation=2),
        x("gemm", "kernel", 0, 7, 7100, 100, correlation=3),
        x("actor_update", "gpu_user_annotation", 0, 7, 1300, 3300),
        x("aten::mm", "cpu_op", 100, 100, 1150, 60),
        {"ph": "X", "name": "bad", "cat": "user_annotation", "pid": 100, "tid": 100, "ts": "abc", "dur": 1},
        {"ph": "B", "name": "sync", "pid": 100, "tid": 100, "ts": 6000},
    ]
    document = {"schemaVersion": 1, "deviceProperties": [{"id": 0}], "distributedInfo": {"rank": 1, "world_size": 2},
                "traceEvents": events, "baseTimeNanoseconds": 1_700_000_000_000_000_000}
    path = tmp_path / "host.pt.trace.json"
    path.write_text(json.dumps(document, indent=1))
    [report] = ingest_paths(store, [path], run_name="gpu")
    assert report.format == "pytorch-profiler"
    assert (report.lines, report.stored, report.ignored, report.rejected) == (16, 3, 11, 2)
    spans = {(name, lane): (rank, role, t0, t1, busy) for name, lane, rank, role, t0, t1, busy in _rows(
        store, "SELECT name, lane, rank, role, t0_us, t1_us, busy_us FROM spans")}
    base = 1_700_000_000_000_000.0
    # Launched from the range's thread while it was open: 400 + 1000 µs; the mini-batch only the first.
    assert spans[("actor_update", "thread 100 (python)")] == (1, "actor", base + 1000, base + 6000, 1400.0)
    assert spans[("mini_batch0", "thread 100 (python)")][4] == 400.0
    # The range on the GPU stream: its kernels' overlap with it.
    assert spans[("actor_update", "stream 7")][4] == 1400.0
    # The GPU: first kernel to last, busy the union of its kernels.
    assert spans[("gpu kernels", "gpu 0")][2:] == (base + 1300, base + 7200, 1500.0)
    reasons = sorted(r for (r,) in _rows(store, "SELECT reason FROM ingest_errors"))
    assert reasons == ['"ts" is not a number', "a begin event that is never ended"]


# --- Nsight Systems ----------------------------------------------------------------------------------

def test_nsys_ranges_kernels_and_the_session_clock(traces_store):
    con, reports = traces_store
    new = next(r for r in reports["nsys"] if r.path.endswith("worker_process_4242.sqlite"))
    assert (new.format, new.lines, new.stored, new.ignored, new.rejected) == ("nsys-sqlite", 7, 2, 5, 0)
    base = 1_790_000_000_000_000.0  # utcEpochNs / 1000
    rows = {name: row for name, *row in _rows(con, """SELECT s.name, s.role, s.lane, s.stage, s.t0_us, s.t1_us, s.busy_us,
                                                              s.clock FROM spans s JOIN files f USING (file_id)
                                                       WHERE f.path LIKE '%worker_process_4242.sqlite'""")}
    assert rows["actor_compute_log_prob"] == ["actor", "MainThread", "old_log_prob", base + 1000, base + 3000, 1000.0, "wall"]
    assert rows["actor_update"][3:] == [base + 4000, base + 10000, 3000.0, "wall"]
    assert rows["gpu kernels"][3:] == [base + 1600, base + 8500, 3000.0, "wall"]  # 0.4 + 0.6 + 2.0 ms of union


def test_an_older_nsys_layout_reads_text_and_rejects_a_backwards_range(traces_store):
    con, reports = traces_store
    old = next(r for r in reports["nsys"] if r.path.endswith("old_export.sqlite"))
    assert (old.lines, old.stored, old.rejected) == (2, 1, 1)
    assert _rows(con, """SELECT s.name, s.stage, s.clock, s.t1_us - s.t0_us FROM spans s JOIN files f USING (file_id)
                         WHERE f.path LIKE '%old_export.sqlite'""") == [("ref_compute_log_prob", "ref", "file", 7.0)]


# --- AReaL -------------------------------------------------------------------------------------------

def test_areal_traces_keep_each_process_clock_and_the_global_step(traces_store):
    con, reports = traces_store
    by_name = {Path(r.path).name: r for r in reports["areal"]}
    assert by_name["traces-r1.jsonl"].format == "areal-traces"
    # 8 events, a blank line and a line cut short: 4 spans, 2 instants and 2 names ignored, 1 blank, 1 rejected.
    r1 = by_name["traces-r1.jsonl"]
    assert (r1.lines, r1.stored, r1.ignored, r1.rejected) == (10, 4, 5, 1)
    rows = _rows(con, """SELECT s.rank, s.role, s.name, s.stage, s.step, s.t0_us, s.t1_us - s.t0_us, s.clock
                         FROM spans s JOIN files f USING (file_id) WHERE f.path LIKE '%traces-r1.jsonl' ORDER BY s.t0_us""")
    assert rows[0] == (1, "actor", "train.rollout", "gen", 1, 1000.0, 50000.0, "file")
    assert rows[1][2:5] == ("fsdp_engine.train_batch", "update_actor", 1)
    assert [r[4] for r in rows] == [1, 1, 2, 2]
    # On clocks of their own, the ranks still compare by duration: rank 1's rollout is 10 ms longer.
    from polytrace_cli.analyze.common import StepRange
    from polytrace_cli.analyze.timeline import per_step

    run_id = _rows(con, "SELECT run_id FROM runs WHERE name = 'areal'")[0][0]
    steps = per_step(con, [run_id], StepRange()).filter(pl.col("step").is_not_null())
    assert steps.select("step", "straggler", "straggler_stage", "bubble_s").rows() == [
        (1, "actor rank 1", "gen", pytest.approx(0.01)), (2, "actor rank 1", "gen", pytest.approx(0.01))]


def test_areal_sessions_become_a_span_and_its_phases(traces_store):
    con, reports = traces_store
    report = next(r for r in reports["areal"] if r.path.endswith("sessions-r0.jsonl"))
    assert (report.lines, report.stored, report.rejected) == (4, 3, 1)  # no submit_ts: rejected
    sessions = _rows(con, """SELECT s.lane, s.status, s.detail, s.t0_us, s.t1_us FROM spans s JOIN files f USING (file_id)
                             WHERE f.path LIKE '%sessions-r0.jsonl' AND s.name = 'session' ORDER BY s.lane""")
    assert sessions == [("session 93", "accepted", None, 1_790_000_000e6, 1_790_000_003e6),
                        ("session 94", "rejected", "stale_weight", 1_790_000_000.5e6, 1_790_000_004.5e6),
                        ("session 95", "pending", None, 1_790_000_001e6, 1_790_000_001e6)]
    phases = _rows(con, """SELECT s.stage, count(*), sum(s.t1_us - s.t0_us) FROM spans s JOIN files f USING (file_id)
                           WHERE f.path LIKE '%sessions-r0.jsonl' AND s.lane = 'session 93' AND s.name <> 'session'
                           GROUP BY 1 ORDER BY 1""")
    assert phases == [("gen", 2, 2.0e6), ("reward", 1, 0.25e6), ("tool", 1, 0.5e6)]


# --- NeMo-RL ----------------------------------------------------------------------------------------

def test_nemo_rl_spans_take_the_step_of_the_step_span_holding_them(traces_store):
    con, reports = traces_store
    [report] = reports["nemo"]
    assert report.format == "nemo-rl-trace"
    rows = _rows(con, """SELECT s.name, s.step, s.role, s.lane, s.t1_us - s.t0_us FROM spans s JOIN runs r USING (run_id)
                         WHERE r.name = 'nemo' ORDER BY s.t0_us, s.name""")
    assert [r[:2] for r in rows if r[0] == "step"] == [("step", 1), ("step", 2)]
    generation = [r for r in rows if r[0] == "generation"]
    assert [(r[1], r[4]) for r in generation] == [(1, 600_000.0), (2, 900_000.0)]
    samples = [r for r in rows if r[0] == "sample_rollout"]
    assert [r[1] for r in samples] == [1, 1, 2, 2]
    assert {r[2] for r in samples} == {"rollout"} and samples[0][3] == "vllm_generation/p0_g0"
    assert {r[2] for r in rows if r[0] in ("step", "generation", "training")} == {"driver"}


# --- generic trace events ---------------------------------------------------------------------------

def test_json_lines_events_reject_bad_lines_alone(tmp_path, store):
    lines = [json.dumps({"ph": "X", "name": "generate", "ts": 0, "dur": 10, "pid": 1, "tid": "rank_0", "args": {"step": 3}}),
             "",
             '{"ph": "X", "name": "broken", "ts": ',
             json.dumps({"ph": "X", "name": "train", "ts": 20, "dur": -1, "pid": 1, "tid": "rank_0"}),
             json.dumps([1, 2]),
             json.dumps({"ph": "E", "ts": 40, "pid": 1, "tid": "rank_1"}),
             json.dumps({"ph": "X", "name": "train", "ts": 30, "dur": 5, "pid": 1, "tid": "rank_1", "args": {"step": 3}})]
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(lines) + "\n")
    [report] = ingest_paths(store, [path], run_name="lines")
    assert report.format == "chrome-trace-jsonl"
    assert (report.lines, report.stored, report.ignored, report.rejected) == (7, 2, 1, 4)
    assert sorted(_rows(store, "SELECT line_no FROM ingest_errors")) == [(3,), (4,), (5,), (6,)]
    assert _rows(store, "SELECT name, stage, step, rank FROM spans ORDER BY t0_us") == [
        ("generate", "gen", 3, 0), ("train", "update_actor", 3, 1)]


def test_begin_and_end_events_pair_by_nesting_per_thread(tmp_path, store):
    events = [{"ph": "B", "name": "step", "ts": 0, "pid": 1, "tid": 1, "args": {"step": 7}},
              {"ph": "B", "name": "generation", "ts": 1, "pid": 1, "tid": 1},
              {"ph": "B", "name": "training", "ts": 2, "pid": 1, "tid": 2},  # another thread
              {"ph": "E", "ts": 5, "pid": 1, "tid": 1},
              {"ph": "E", "ts": 8, "pid": 1, "tid": 2},
              {"ph": "E", "ts": 9, "pid": 1, "tid": 1}]
    path = tmp_path / "pairs.json"
    path.write_text(json.dumps(events))
    [report] = ingest_paths(store, [path], run_name="pairs")
    assert report.format == "chrome-trace" and report.stored == 6 and report.rejected == 0
    assert _rows(store, "SELECT name, t0_us, t1_us, step FROM spans ORDER BY t0_us") == [
        ("step", 0.0, 9.0, 7), ("generation", 1.0, 5.0, 7), ("training", 2.0, 8.0, 7)]


def test_ingest_on_the_command_line_reads_a_replica_trace(tmp_path):
    from typer.testing import CliRunner

    from polytrace_cli.cli import app

    replica = TORCH / "agent_loop_rollout_replica_0"
    result = CliRunner().invoke(app, ["ingest", str(replica), "--db", str(tmp_path / "s.duckdb"), "--run", "t", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    files = document["files"] if isinstance(document, dict) else document
    assert [f["format"] for f in files] == ["pytorch-profiler"] and files[0]["rejected"] == 0


@pytest.mark.parametrize("folder, name, facts", [
    ("profile", "actor_train_step3_rank2-of-8_tp1-pp0-dp1-cp0_pid99_20260930151150960.json",
     {"role": "actor", "rank": 2, "step": 3, "tp_rank": 1, "pp_rank": 0, "dp_rank": 1, "cp_rank": 0}),
    ("profile", "ref_compute_log_prob_step1_rank0_pid1_123.json", {"role": "ref", "rank": 0, "step": 1}),
    ("actor_update", "prof_rank-3.json", {"role": "actor", "rank": 3, "step": None}),
    ("profile", "rollout-replica4-globalrank8_rank0.pt.trace.json",
     {"role": "rollout", "replica": 4, "rank": 8, "tp_rank": 0}),
    ("agent_loop_rollout_replica_2", "inst9-rank-1.1700.pt.trace.json", {"role": "rollout", "replica": 2, "tp_rank": 1}),
    ("agent_loop_rollout_replica_0", "42-TP-1.trace.json", {"role": "rollout", "replica": 0, "tp_rank": 1}),
])
def test_verl_trace_file_name_grammar(folder, name, facts):
    from polytrace_cli.ingest.formats.traces.kineto import file_facts

    source = file_facts(Path(folder) / name)
    assert {key: getattr(source, key) for key in facts} == facts
