"""What `watch --metrics-port` and `--webhook` cost the watching process, at a 1 s poll.

For `--seconds` seconds, once a second, this process hands a watch step event to the Prometheus
endpoint (`telemetry.exporter.WatchMetrics`, the real prometheus_client) and every fifth second an alert
to the webhook (`telemetry.webhook.Webhook`), while a child process scrapes the endpoint every second
(a scrape interval 15 times tighter than Prometheus' default) and another child answers the webhook.
The process's CPU time (every thread: the endpoint's server thread and the webhook's poster included,
`resource.getrusage`) is measured beside the same loop without either (the baseline), in turns.
Target: the difference below 1% of one core.
Usage: python benchmarks/watch_ops_overhead.py [--seconds N]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from polytrace_cli.telemetry.exporter import WatchMetrics  # noqa: E402
from polytrace_cli.telemetry.webhook import Webhook  # noqa: E402

SCRAPER = """
import sys, time, urllib.request
url, seconds = sys.argv[1], float(sys.argv[2])
end = time.time() + seconds
while time.time() < end:
    urllib.request.urlopen(url, timeout=5).read()
    time.sleep(1.0)
"""
HOOK = """
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
server = HTTPServer(("127.0.0.1", 0), Handler)
print(server.server_port, flush=True)
server.serve_forever()
"""


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def loop(seconds: int, exporter: WatchMetrics | None, hook: Webhook | None) -> float:
    """CPU seconds this process spent over `seconds` one-second polls."""
    started = cpu()
    for step in range(1, seconds + 1):
        event = {"event": "step", "step": step, "segment": 0, "seconds": 60.0 + step % 7, "expected_s": 61.0,
                 "model_s": 61.0, "slow": step % 5 == 0, "causes": [],
                 "stages": {"gen": 30.0, "update_actor": 20.0, "old_log_prob": 5.0}}
        if exporter is not None:
            exporter.observe(event)
        if step % 5 == 0:
            alert = {"event": "alert", "kind": "slow_step", "step": step, "seconds": 90.0, "expected_s": 61.0,
                     "causes": [{"cause": "long_tail", "seconds": 20.0, "stage": "gen"}]}
            if exporter is not None:
                exporter.observe(alert)
            if hook is not None:
                hook.post(alert)
        time.sleep(1.0)
    return cpu() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=30)
    args = parser.parse_args()
    server = subprocess.Popen([sys.executable, "-c", HOOK], stdout=subprocess.PIPE, text=True)
    try:
        hook_url = f"http://127.0.0.1:{server.stdout.readline().strip()}/hook"
        baseline = loop(args.seconds, None, None)
        exporter = WatchMetrics(0)
        exporter.set_run("bench", 100_000)
        hook = Webhook(hook_url)
        scraper = subprocess.Popen([sys.executable, "-c", SCRAPER, f"http://127.0.0.1:{exporter.port}/metrics",
                                    str(args.seconds)])
        with_ops = loop(args.seconds, exporter, hook)
        hook.close()
        exporter.close()
        scraper.wait(timeout=60)
    finally:
        server.kill()
    extra = (with_ops - baseline) / args.seconds
    print(f"{args.seconds} one-second polls: baseline {baseline:.3f} s of CPU, with the endpoint scraped every second "
          f"and an alert posted every 5 s {with_ops:.3f} s; {hook.sent} alerts posted, {hook.failures} failed")
    print(f"cost: {100 * extra:.3f}% of one core (target below 1%)")
    return 0 if extra < 0.01 and hook.failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
