"""A watched run's numbers served as Prometheus metrics (`polytrace watch --metrics-port`).

Series, each labelled with the run's name (`run`):

    polytrace_last_step                 the last step told
    polytrace_steps_total               steps told since the watch began (counter)
    polytrace_step_seconds              the last step's wall time as logged
    polytrace_step_expected_seconds     the model's typical step when that step came (NaN before a model)
    polytrace_step_slow                 1 when the last step was judged slow, else 0
    polytrace_stage_seconds{stage}      the last step's seconds per stage
    polytrace_eta_seconds               remaining steps × the median of the last ETA_WINDOW steps' seconds
                                        (NaN without the run's configured step count)
    polytrace_alerts_total{kind}        alerts by kind (counter): slow_step, stall, crash, ingest

Served by the real `prometheus_client` (the `ops` extra) on its own registry, from a daemon thread the
client starts; bound to 127.0.0.1 unless another address is given.
"""

from __future__ import annotations

import statistics
from collections import deque

ETA_WINDOW = 10
EXTRA_HINT = "--metrics-port needs prometheus_client: pip install 'polytrace[ops]'"


class WatchMetrics:
    """The watch's Prometheus series; `observe` takes each watch event."""

    def __init__(self, port: int, host: str = "127.0.0.1"):
        try:
            from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
        except ImportError:
            raise RuntimeError(EXTRA_HINT) from None
        self.registry = CollectorRegistry()
        labels = ["run"]
        self._last_step = Gauge("polytrace_last_step", "The last step told.", labels, registry=self.registry)
        self._steps = Counter("polytrace_steps", "Steps told since the watch began.", labels, registry=self.registry)
        self._seconds = Gauge("polytrace_step_seconds", "The last step's wall time as logged.", labels,
                              registry=self.registry)
        self._expected = Gauge("polytrace_step_expected_seconds", "The model's typical step at the last step.",
                               labels, registry=self.registry)
        self._slow = Gauge("polytrace_step_slow", "1 when the last step was judged slow.", labels,
                           registry=self.registry)
        self._stage = Gauge("polytrace_stage_seconds", "The last step's seconds per stage.", [*labels, "stage"],
                            registry=self.registry)
        self._eta = Gauge("polytrace_eta_seconds", "Remaining steps times the recent median step.", labels,
                          registry=self.registry)
        self._alerts = Counter("polytrace_alerts", "Alerts by kind.", [*labels, "kind"], registry=self.registry)
        self.run = ""
        self.total_steps: int | None = None
        self._recent: deque[float] = deque(maxlen=ETA_WINDOW)
        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        self.port = self._server.server_port

    def set_run(self, name: str, total_steps: int | None) -> None:
        """The run being watched and its configured step count (None when the log does not say)."""
        self.run, self.total_steps = name, total_steps

    def observe(self, event: dict) -> None:
        """Update the series from one watch event."""
        run = self.run
        if event.get("event") == "step" and event.get("corrected"):
            return  # an earlier step judged again: the series follow the latest step
        if event.get("event") == "step":
            nan = float("nan")
            seconds = event.get("seconds")
            self._last_step.labels(run).set(event["step"])
            self._steps.labels(run).inc()
            self._seconds.labels(run).set(nan if seconds is None else seconds)
            expected = event.get("expected_s")
            self._expected.labels(run).set(nan if expected is None else expected)
            self._slow.labels(run).set(1 if event.get("slow") else 0)
            for stage, value in (event.get("stages") or {}).items():
                self._stage.labels(run, stage).set(value)
            if seconds is not None:
                self._recent.append(seconds)
            if self.total_steps is not None and self._recent:
                remaining = max(0, self.total_steps - event["step"])
                self._eta.labels(run).set(remaining * statistics.median(self._recent))
            else:
                self._eta.labels(run).set(nan)
        elif event.get("event") == "alert":
            self._alerts.labels(run, event.get("kind", "unknown")).inc()

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()
