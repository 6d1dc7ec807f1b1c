"""Engine telemetry and operations: recording engines' Prometheus scrapes beside a run, serving a
watched run's numbers as Prometheus metrics, and posting its alerts to a webhook."""
