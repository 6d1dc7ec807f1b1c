"""`watch` for operations: the Prometheus endpoint (the real prometheus_client) and the webhook, each
against servers on loopback, and the two together on a watched log."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.request import urlopen

import pytest

from polytrace_cli.telemetry.webhook import QUEUE_SIZE, Webhook, alert_text

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

SLOW = {"event": "alert", "kind": "slow_step", "step": 20, "seconds": 93.1, "expected_s": 61.0,
        "causes": [{"cause": "long_tail", "seconds": 27.4, "stage": "gen"}]}


class Hook:
    """A loopback webhook: answers with `codes` in turn (then 200), optionally holding each request
    until `release` is set; keeps every body it got."""

    def __init__(self, codes=(), hold=False):
        self.bodies: list[dict] = []
        self.codes = list(codes)
        self.release = threading.Event()
        if not hold:
            self.release.set()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (the standard library's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                hook.release.wait(60)
                hook.bodies.append(body)
                self.send_response(hook.codes.pop(0) if hook.codes else 200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.server.shutdown()


def test_an_alert_is_retried_after_server_errors_and_reads_as_one_line():
    hook = Hook(codes=[500, 503])
    try:
        poster = Webhook(hook.url, attempts=3, sleep=lambda seconds: None)
        poster.run = "run_42"
        poster.post(SLOW)
        poster.close()
    finally:
        hook.close()
    assert (poster.sent, poster.failures, len(hook.bodies)) == (1, 0, 3)
    body = hook.bodies[-1]
    assert {k: body[k] for k in SLOW} == SLOW and body["run"] == "run_42"
    assert body["text"] == alert_text(SLOW, "run_42") == (
        "polytrace: run run_42: step 20 took 93 s against 61 s expected (long_tail)")


def test_a_refused_alert_is_not_tried_again():
    hook = Hook(codes=[400])
    try:
        poster = Webhook(hook.url, attempts=3, sleep=lambda seconds: None)
        poster.post(SLOW)
        poster.close()
    finally:
        hook.close()
    assert (poster.sent, poster.failures, len(hook.bodies)) == (0, 1, 1)


def test_posting_never_waits_for_a_stuck_hook():
    hook = Hook(hold=True)
    try:
        poster = Webhook(hook.url, timeout=60, sleep=lambda seconds: None)
        for step in range(QUEUE_SIZE + 50):
            poster.post({**SLOW, "step": step})  # returns at once: the hook holds every request
        assert hook.bodies == []
        # The queue keeps QUEUE_SIZE alerts (one more may be in flight); the rest are dropped, counted.
        assert poster.dropped in (49, 50)
        hook.release.set()
        poster.close()
    finally:
        hook.close()
    assert poster.sent == QUEUE_SIZE + 50 - poster.dropped == len(hook.bodies)


def series_of(port: int) -> dict[tuple, float]:
    text = urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_the_endpoint_serves_the_last_step_its_stages_the_eta_and_alerts():
    from polytrace_cli.telemetry.exporter import WatchMetrics

    exporter = WatchMetrics(0)
    try:
        exporter.set_run("r", 10)
        for step, seconds in enumerate([10.0, 12.0, 11.0, 30.0], start=1):
            exporter.observe({"event": "step", "step": step, "segment": 0, "seconds": seconds, "expected_s": 11.0,
                              "model_s": 11.0, "slow": seconds > 20, "causes": [], "stages": {"gen": seconds / 2}})
        exporter.observe(SLOW)
        # Step 2 judged again once its record landed: the series still follow the latest step.
        exporter.observe({"event": "step", "step": 2, "segment": 0, "seconds": 50.0, "expected_s": 11.0,
                          "model_s": 11.0, "slow": True, "causes": [], "stages": {"gen": 25.0}, "corrected": True})
        series = series_of(exporter.port)
    finally:
        exporter.close()
    run = (("run", "r"),)
    assert series[("polytrace_last_step", run)] == 4
    assert series[("polytrace_steps_total", run)] == 4
    assert series[("polytrace_step_seconds", run)] == 30.0
    assert series[("polytrace_step_slow", run)] == 1
    assert series[("polytrace_stage_seconds", (("run", "r"), ("stage", "gen")))] == 15.0
    assert series[("polytrace_eta_seconds", run)] == 6 * 11.5  # 6 steps left × median(10, 12, 11, 30)
    assert series[("polytrace_alerts_total", (("kind", "slow_step"), ("run", "r")))] == 1
