"""Posting a watch's alerts to a webhook (`polytrace watch --webhook URL`).

Each alert is POSTed as JSON: the alert's own fields plus `text`, one line a person reads (the field a
Slack incoming webhook shows). Posting never holds the watch up: alerts go into a bounded queue that
one daemon thread empties; a full queue drops the alert (counted). A post has a timeout and is tried at
most `attempts` times, waiting `backoff`, then twice that, between tries; a failure is counted and
said once on stderr by the caller (`failures`).
"""

from __future__ import annotations

import json
import queue
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable

QUEUE_SIZE = 100


def alert_text(alert: dict, run: str) -> str:
    """One line for a person: what happened to which run, with the numbers that say how bad."""
    kind = alert.get("kind")
    where = f"run {run}" if run else "the watched run"
    if kind == "slow_step":
        causes = ", ".join(c["cause"] for c in alert.get("causes") or []) or "no cause found"
        return (f"polytrace: {where}: step {alert['step']} took {alert['seconds']:.0f} s against "
                f"{alert['expected_s']:.0f} s expected ({causes})")
    if kind == "slow_step_withdrawn":
        return f"polytrace: {where}: step {alert['step']} was not slow after all (its metrics landed late)"
    if kind == "stall":
        return (f"polytrace: {where}: no new step for {alert['seconds_since_step']:.0f} s after step "
                f"{alert['step']} (usual gap {alert['usual_gap_s']:.0f} s)")
    if kind == "crash":
        return f"polytrace: {where}: the job crashed after step {alert.get('step')}: {alert.get('reason', '')}"
    return f"polytrace: {where}: {kind}: {json.dumps({k: v for k, v in alert.items() if k not in ('event', 'kind')})}"


class Webhook:
    """A background poster of alerts to one URL."""

    def __init__(self, url: str, *, timeout: float = 5.0, attempts: int = 3, backoff: float = 0.5,
                 sleep: Callable[[float], None] = time.sleep):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--webhook needs an http:// or https:// address, not {url!r}")
        self.url, self.timeout, self.attempts, self.backoff, self._sleep = url, timeout, attempts, backoff, sleep
        self.run = ""
        self.sent = self.failures = self.dropped = 0
        self._queue: queue.Queue = queue.Queue(QUEUE_SIZE)
        self._thread = threading.Thread(target=self._drain, name="polytrace-webhook", daemon=True)
        self._thread.start()

    def post(self, alert: dict) -> None:
        """Queue one alert; never waits."""
        body = {**alert, "run": self.run, "text": alert_text(alert, self.run)}
        try:
            self._queue.put_nowait(json.dumps(body).encode())
        except queue.Full:
            self.dropped += 1

    def _send(self, payload: bytes) -> bool:
        request = urllib.request.Request(self.url, data=payload, method="POST",
                                         headers={"Content-Type": "application/json"})
        wait = self.backoff
        for attempt in range(self.attempts):
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                    if response.status < 300:
                        return True
            except urllib.error.HTTPError as error:
                if 400 <= error.code < 500 and error.code != 429:
                    return False  # the hook refuses this alert: trying again will not change that
            except (OSError, urllib.error.URLError):
                pass
            if attempt + 1 < self.attempts:
                self._sleep(wait)
                wait *= 2
        return False

    def _drain(self) -> None:
        while True:
            payload = self._queue.get()
            if payload is None:
                self._queue.task_done()
                return
            if self._send(payload):
                self.sent += 1
            else:
                self.failures += 1
            self._queue.task_done()

    def close(self, timeout: float = 10.0) -> None:
        """Let queued alerts go out for up to `timeout` seconds, then stop."""
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)
