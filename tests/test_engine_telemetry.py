"""Engine telemetry: Prometheus scrapes and range-query exports read, joined to steps on the wall
clock, and the numbers that do not add up.

Series names are vLLM's and SGLang's own: vllm-project/vllm @ 005a810bc40faa25b8870fbc8559c3462581eee3,
`vllm/v1/metrics/loggers.py` (`vllm:num_requests_running`, `vllm:num_requests_waiting`,
`vllm:kv_cache_usage_perc`, the deprecated `vllm:gpu_cache_usage_perc`, the counter `vllm:num_preemptions`
exposed as `_total`, `vllm:time_to_first_token_seconds`); sgl-project/sglang @
00ae9c1590d2d0bb6c0bfff39e312c34ae3dd538, `python/sglang/srt/metrics/collector.py`
(`sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage`, `sglang:gen_throughput`).
Exposition text is written by the real `prometheus_client`; the runs' step records by the real MLflow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from polytrace_cli.analyze import consistency, engine
from polytrace_cli.analyze.common import ALL_STEPS
from polytrace_cli.cli import app
from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.store import open_store
from polytrace_cli.telemetry.scrape import stamped
from polytrace_cli.workload.engine_model import EngineModel, simulate

prometheus_client = pytest.importorskip("prometheus_client")

START = 1_700_000_000.0
UNTIMED = [0.0, 2.0, 5.0, 0.0]
# The tail: KV cache ample, a few long responses finish last. Full: the cache holds a fifth of the batch.
TAIL = EngineModel(requests=96, seed=1)
FULL = EngineModel(requests=160, kv_tokens=24_000, seed=2)
MLFLOW_WRITER = """
import json, sys
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
for folder, steps in json.loads(sys.argv[1]).items():
    client = MlflowClient(tracking_uri=f"file://{folder}/mlruns")
    run = client.create_run(client.create_experiment("engine"))
    metrics = []
    for s in steps:
        ts = int(round(s["logged_at"] * 1000))
        metrics += [Metric("timing_s/step", s["step_s"], ts, s["step"]), Metric("timing_s/gen", s["gen_s"], ts, s["step"])]
        # MLflow's system metrics, as its monitor logs them: a sample count for a step, on the wall clock.
        for second in range(int(s["start"]), int(s["logged_at"])):
            busy = 40.0 if second < s["start"] + s["gen_s"] else 90.0
            metrics.append(Metric("system/gpu_0_utilization_percentage", busy, second * 1000, len(metrics)))
    client.log_batch(run.info.run_id, metrics=metrics)
    client.set_terminated(run.info.run_id)
"""


def exposition_page(registry) -> str:
    return prometheus_client.generate_latest(registry).decode()


@pytest.fixture(scope="module")
def engine_runs(tmp_path_factory):
    """Two generated runs, each an MLflow store of its steps (written by MLflow) and a scrape file of its
    engine (the model's own): (store connection, {name: EngineRun})."""
    folder = tmp_path_factory.mktemp("engine")
    runs = {"tail": simulate(TAIL, 4, START, untimed_s=UNTIMED), "full": simulate(FULL, 2, START)}
    for name, run in runs.items():
        (folder / name).mkdir()
        (folder / name / "engine.prom").write_text(run.scrapes)
    env = {**os.environ, "MLFLOW_ALLOW_FILE_STORE": "true", "MLFLOW_ENABLE_TELEMETRY": "false", "DO_NOT_TRACK": "1",
           "HOME": str(folder)}
    subprocess.run([sys.executable, "-c", MLFLOW_WRITER, json.dumps({str(folder / n): r.steps for n, r in runs.items()})],
                   env=env, check=True, timeout=300, capture_output=True)
    con = open_store(folder / "store.duckdb")
    for name in runs:
        ingest_paths(con, [folder / name], run_name=name)
    yield con, runs
    con.close()


def run_ids(con, *names):
    return [con.execute("SELECT run_id FROM runs WHERE name = ?", [name]).fetchall()[0][0] for name in names]


def test_a_scrape_written_by_prometheus_client_is_read_whole(store, tmp_path):
    registry = prometheus_client.CollectorRegistry()
    labels = ["model_name", "engine"]
    running = prometheus_client.Gauge("vllm:num_requests_running", "running", labels, registry=registry)
    kv = prometheus_client.Gauge("vllm:gpu_cache_usage_perc", "kv (before vLLM 0.9)", labels, registry=registry)
    preempted = prometheus_client.Counter("vllm:num_preemptions", "preemptions", labels, registry=registry)
    ttft = prometheus_client.Histogram("vllm:time_to_first_token_seconds", "ttft", labels, registry=registry)
    sglang = prometheus_client.Gauge("sglang:num_queue_reqs", "queued", ["tp_rank"], registry=registry)
    pages = []
    for index in range(3):
        running.labels("policy", "0").set(8 - index)
        kv.labels("policy", "0").set(0.25 * index)
        preempted.labels("policy", "0").inc(index)
        ttft.labels("policy", "0").observe(0.5)
        sglang.labels("0").set(index)
        pages.append(stamped(exposition_page(registry), "http://node:8000/metrics", 1_700_000_000_000 + 2000 * index)[0])
    log = tmp_path / "engine.prom"
    # A sample before any scrape marker has no time; later ones without their own take their scrape's.
    log.write_text("vllm:num_requests_waiting 3\n" + "".join(pages) + "not a sample at all\n"
                   "vllm:num_requests_running{engine=\"0\"} 1e999 1700000009000\n"
                   "vllm:num_requests_running{engine=\"0\"} many 1700000009000\n")
    [report] = ingest_paths(store, [log], run_name="engine")
    assert report.format == "prometheus-scrape"
    assert report.lines == report.rows + report.ignored + report.rejected
    errors = store.execute("SELECT line_no, code FROM ingest_errors ORDER BY line_no").fetchall()
    total = len(log.read_text().splitlines())
    assert errors == [(1, "missing-field"), (total - 2, "unparsable-line"), (total - 1, "out-of-range"),
                      (total, "type-error")]
    rows = store.execute("""SELECT metric, instance, ts, value FROM engine_metrics
                            WHERE metric IN ('requests_running', 'kv_cache_usage', 'preemptions_total', 'requests_waiting')
                            ORDER BY metric, ts""").fetchall()
    assert [r for r in rows if r[0] == "requests_running"] == [
        ("requests_running", "http://node:8000/metrics#0", 1_700_000_000.0 + 2 * i, 8.0 - i) for i in range(3)]
    assert [r[3] for r in rows if r[0] == "kv_cache_usage"] == [0.0, 0.25, 0.5]
    assert [r[3] for r in rows if r[0] == "preemptions_total"] == [0.0, 1.0, 3.0]
    assert [r[3] for r in rows if r[0] == "requests_waiting"] == [0.0, 1.0, 2.0]  # SGLang's queue, one name
    histogram = dict(store.execute("SELECT metric, max(value) FROM engine_metrics WHERE metric LIKE 'time_to_first%'"
                                   " GROUP BY ALL").fetchall())
    assert histogram == {"time_to_first_token_s_count": 3.0, "time_to_first_token_s_sum": 1.5}
    ignored = dict(store.execute("SELECT rule, lines FROM ignored_lines").fetchall())
    assert ignored["scrape-marker"] == 3 and ignored["histogram-bucket"] > 0


def test_a_range_query_export_is_read_per_sample(store, tmp_path):
    document = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"__name__": "sglang:num_running_reqs", "instance": "r0:30000"},
         "values": [[1700000000, "12"], [1700000002.5, "4"], [1700000005, "NaN"]]},
        {"metric": {"__name__": "vllm:num_preemptions_total", "instance": "r1:8000", "engine": "1"},
         "values": [[1700000000, "0"], [1700000002, "+Inf"], [1700000004, "x"]]},
        {"metric": {"instance": "r0:30000"}, "values": [[1700000000, "1"]]},
    ]}}
    export = tmp_path / "range.json"
    export.write_text(json.dumps(document))
    [report] = ingest_paths(store, [export], run_name="exported")
    assert report.format == "prometheus-range"
    assert (report.lines, report.rows, report.ignored, report.rejected) == (7, 3, 1, 3)
    rows = store.execute("SELECT instance, metric, ts, value FROM engine_metrics ORDER BY instance, ts").fetchall()
    assert rows == [("r0:30000", "requests_running", 1700000000.0, 12.0),
                    ("r0:30000", "requests_running", 1700000002.5, 4.0),
                    ("r1:8000#1", "preemptions_total", 1700000000.0, 0.0)]
    codes = sorted(code for (code,) in store.execute("SELECT code FROM ingest_errors").fetchall())
    assert codes == ["missing-field", "out-of-range", "type-error"]


def test_every_step_is_joined_and_the_tail_told_from_a_full_engine(engine_runs):
    con, runs = engine_runs
    tail_id, full_id = run_ids(con, "tail", "full")
    detail = engine.per_step(con, [tail_id, full_id], ALL_STEPS)
    for name, run in runs.items():
        own = detail.filter(detail["run"] == name).sort("step")
        assert own["step"].to_list() == [s["step"] for s in run.steps]
        for measured, truth in zip(own.iter_rows(named=True), run.truth):
            assert abs(measured["low_share"] - truth["low_share"]) <= 0.05, (name, measured, truth)
            assert abs(measured["tail_share"] - truth["tail_share"]) <= 0.05, (name, measured, truth)
            assert measured["covered_share"] > 0.95
        states = set(own["engine_state"].to_list())
        assert states == ({"tail"} if name == "tail" else {"full"})
    full_rows = detail.filter(detail["run"] == "full")
    assert full_rows["preemptions"].to_list() == [t["preemptions"] for t in runs["full"].truth]
    assert (full_rows["kv_usage_max"] >= 0.95).all()
    summary = engine.summary(con, [tail_id, full_id], ALL_STEPS)
    by_run = {row["run"]: row for row in summary.iter_rows(named=True)}
    # Every scrape lies in a step's window but those taken in the untimed gaps between steps (7 s at 1 s).
    assert by_run["tail"]["samples_outside_steps"] == int(sum(UNTIMED) / TAIL.scrape_every)
    assert by_run["full"]["samples_outside_steps"] == 0
    assert by_run["tail"]["tail_steps"] == 4 and by_run["full"]["full_steps"] == 2


def test_gpu_utilization_from_mlflow_system_metrics_is_read_per_step_window(engine_runs):
    con, runs = engine_runs
    stored = con.execute("SELECT count(*) FROM step_metrics WHERE key LIKE 'system/%'").fetchall()[0][0]
    assert stored == 0  # a system metric's step is a sample count, not a training step
    detail = engine.per_step(con, run_ids(con, "full"), ALL_STEPS).sort("step")
    for measured, step in zip(detail["gpu_utilization_mean"].to_list(), runs["full"].steps):
        truth = (0.4 * step["gen_s"] + 0.9 * (step["step_s"] - step["gen_s"])) / step["step_s"]
        assert abs(measured - truth) <= 0.02, (measured, truth)


def test_untimed_time_between_steps_is_found(engine_runs):
    con, runs = engine_runs
    detail = consistency.per_step(con, run_ids(con, "tail"), ALL_STEPS).sort("step")
    assert detail["gap_s"][0] is None  # the first step has no step before it
    for measured, injected in zip(detail["untimed_s"].to_list()[1:], UNTIMED[:-1]):
        assert abs(measured - injected) <= 1.0
    # A step is untimed when the injected gap passes max(1 s, 5% of its step).
    expected = [gap > max(consistency.UNTIMED_MIN_S, consistency.UNTIMED_SHARE * step["step_s"])
                for gap, step in zip(UNTIMED[:-1], runs["tail"].steps[1:])]
    assert detail["untimed"].to_list()[1:] == expected and any(expected) and not all(expected)
    [row] = consistency.summary(con, run_ids(con, "tail"), ALL_STEPS).iter_rows(named=True)
    assert abs(row["untimed_s"] - sum(UNTIMED[:-1])) <= 1.0 and row["steps_with_gap"] == 3


def test_stages_beyond_their_step_and_an_impossible_mfu_are_flagged(store, tmp_path):
    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    # 8 GPUs configured; step 1's throughput implies 8 (100,000 tokens / (833.3 × 15 s)), step 2's 4.
    log.write_text("{'trainer': {'nnodes': 1, 'n_gpus_per_node': 8}}\n"
                   "step:1 - timing_s/gen:10.0 - timing_s/update_actor:5.0 - timing_s/step:15.2 - perf/mfu/actor:0.41"
                   " - perf/total_num_tokens:100000 - perf/throughput:833.33 - perf/time_per_step:15.0\n"
                   "step:2 - timing_s/gen:10.0 - timing_s/update_actor:5.0 - timing_s/step:12.0 - perf/mfu/actor:1.37"
                   " - perf/total_num_tokens:100000 - perf/throughput:2083.33 - perf/time_per_step:12.0\n")
    ingest_paths(store, [log])
    [run_id] = run_ids(store, "run")
    detail = consistency.per_step(store, [run_id], ALL_STEPS).sort("step")
    assert detail["stage_excess_s"].to_list() == [None, pytest.approx(3.0)]
    assert detail["mfu_impossible"].to_list() == [False, True]
    assert detail["untimed_s"].to_list() == [None, None]  # a console log has no wall clock
    assert [round(v, 2) for v in detail["implied_gpus"].to_list()] == [8.0, 4.0]
    assert detail["throughput_mismatch"].to_list() == [False, True]
    [row] = consistency.summary(store, [run_id], ALL_STEPS).iter_rows(named=True)
    assert (row["stage_excess_steps"], row["mfu_impossible_steps"], row["mfu_max"]) == (1, 1, 1.37)
    assert (row["throughput_mismatch_steps"], row["inconsistent_steps"]) == (1, 1)
    assert row["untimed_share"] is None and "cannot be told" in row["basis"]


def test_the_scrape_command_records_a_bounded_number_of_rounds(tmp_path):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    import threading

    registry = prometheus_client.CollectorRegistry()
    gauge = prometheus_client.Gauge("vllm:num_requests_running", "running", registry=registry)
    gauge.set(5)
    page = exposition_page(registry).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the standard library's name)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        output = tmp_path / "scrapes.prom"
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        dead = "http://127.0.0.1:9/metrics"
        result = CliRunner().invoke(app, ["scrape", url, dead, "--every", "10ms", "--rounds", "3", "--output", str(output),
                                          "--timeout", "2"])
    finally:
        server.shutdown()
    assert result.exit_code == 0, result.output
    text = output.read_text()
    assert text.count("# polytrace-scrape url=") == 3 and text.count("# polytrace-scrape-failed url=") == 3
    assert "3 page(s)" in result.output and "3 fetch(es) failed" in result.output
    con = open_store(tmp_path / "s.duckdb")
    [report] = ingest_paths(con, [output], run_name="scraped")
    assert (report.rows, report.rejected) == (3, 0)
    assert con.execute("SELECT count(DISTINCT ts), min(value), max(value) FROM engine_metrics").fetchall() == [(3, 5.0, 5.0)]
    con.close()


def test_the_scrape_command_refuses_an_unbounded_or_bad_recording(tmp_path):
    runner = CliRunner()
    bad = runner.invoke(app, ["scrape", "node:8000", "--output", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "http://" in bad.output
    odd = runner.invoke(app, ["scrape", "http://127.0.0.1:9/m", "--every", "soon", "--output", str(tmp_path / "x")])
    assert odd.exit_code == 2 and "--every" in odd.output


def test_wandb_system_records_give_gpu_utilization_on_their_clock():
    wandb_proto = pytest.importorskip("wandb.proto.wandb_internal_pb2")
    from polytrace_cli.ingest.formats.wandb.offline import WandbOfflineIngester

    stats = wandb_proto.StatsRecord()
    stats.timestamp.seconds, stats.timestamp.nanos = 1_700_000_010, 500_000_000
    for key, value in (("gpu.0.gpu", "87.5"), ("gpu.1.gpu", "12"), ("gpu.0.memoryAllocated", "40.1"), ("cpu", "33")):
        item = stats.item.add()
        item.key, item.value_json = key, value
    system: list[tuple] = []
    assert WandbOfflineIngester._stats(7, stats, system)
    assert system == [(7, 1_700_000_010.5, "gpu 0", "gpu.0.gpu", 0.875), (7, 1_700_000_010.5, "gpu 1", "gpu.1.gpu", 0.12)]
    empty = wandb_proto.StatsRecord()
    empty.item.add().key = "cpu"
    assert not WandbOfflineIngester._stats(8, empty, system)


def test_findings_name_the_tail_and_the_full_engine_with_their_seconds(engine_runs):
    from polytrace_cli.diagnose.telemetry import engine_findings, ranked_with

    con, runs = engine_runs
    tail_id, full_id = run_ids(con, "tail", "full")
    detail = engine.per_step(con, [tail_id], ALL_STEPS)
    [tail] = engine_findings(con, tail_id, 1000.0)
    expected = float((detail["tail_share"] * detail["rollout_s"] * detail["covered_share"]).sum())
    assert tail["cause"] == "engine_tail" and tail["seconds"] == pytest.approx(expected)
    assert tail["share"] == pytest.approx(expected / 1000.0) and tail["steps"] == [1, 2, 3, 4]
    assert tail["text"].startswith("the tail: in 4 of 4 steps") and "KV cache never filled" in tail["text"]
    [full] = engine_findings(con, full_id, None)
    assert full["cause"] == "engine_full" and full["share"] is None
    assert f"{sum(t['preemptions'] for t in runs['full'].truth):,.0f} preemptions" in full["text"]
    ranked = ranked_with([{"cause": "a", "seconds": 5.0}, {"cause": "b", "seconds": None}], [tail])
    assert [f["cause"] for f in ranked] == (["engine_tail", "a", "b"] if tail["seconds"] > 5 else ["a", "engine_tail", "b"])


def test_a_run_without_a_tracker_clock_is_joined_on_its_wall_clock_spans(store, tmp_path):
    # A console log gives no wall clock; a profiler's wall-clock spans of each step do. Step k's generation
    # runs [T + 30(k−1), +10 s], its update the next 10 s; the engine runs 20 requests for 6 s, then 1.
    folder = tmp_path / "r"
    folder.mkdir()
    (folder / "train.log").write_text("".join(f"step:{k} - timing_s/gen:10.0 - timing_s/update_actor:10.0"
                                              f" - timing_s/step:20.0\n" for k in (1, 2, 3)))
    lines = []
    for k in (1, 2, 3):
        start = START + 30 * (k - 1)
        for second in range(30):
            running = (20 if second < 6 else 1) if second < 10 else 0
            ts = int((start + second + 0.5) * 1000)
            lines += [f"# polytrace-scrape url=http://r0:8000/metrics ts_ms={ts}",
                      f'vllm:num_requests_running{{engine="0"}} {running} {ts}']
    (folder / "engine.prom").write_text("\n".join(lines) + "\n")
    ingest_paths(store, [folder], run_name="r")
    [run_id] = run_ids(store, "r")
    file_id = store.execute("SELECT min(file_id) FROM files WHERE run_id = ?", [run_id]).fetchall()[0][0]
    for k in (1, 2, 3):
        t0 = (START + 30 * (k - 1)) * 1e6
        for stage, begin, end in (("gen", 0, 10), ("update_actor", 10, 20)):
            store.execute("INSERT INTO spans (run_id, file_id, step, rank, role, name, stage, t0_us, t1_us, clock,"
                          " synthesized) VALUES (?, ?, ?, 0, 'actor', ?, ?, ?, ?, 'wall', false)",
                          [run_id, file_id, k, stage, stage, t0 + begin * 1e6, t0 + end * 1e6])
    windows = engine.step_windows(store, [run_id], ALL_STEPS)
    assert windows.select("step", "window_start", "window_end", "rollout_end").rows() == [
        (k, START + 30 * (k - 1), START + 30 * (k - 1) + 20, START + 30 * (k - 1) + 10) for k in (1, 2, 3)]
    detail = engine.per_step(store, [run_id], ALL_STEPS)
    assert detail["low_share"].to_list() == pytest.approx([0.4] * 3, abs=0.051)  # 4 of 10 s at ≤ 2 of 20
    assert detail["engine_state"].to_list() == ["tail"] * 3
