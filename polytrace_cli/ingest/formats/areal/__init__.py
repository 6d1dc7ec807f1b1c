"""AReaL: the perf tracer's traces and rollout sessions."""

from polytrace_cli.ingest.formats.areal import traces  # noqa: F401
