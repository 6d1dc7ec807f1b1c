"""Trace files: Chrome trace-event JSON and JSON lines, PyTorch profiler (Kineto) traces, Nsight Systems SQLite exports."""

from polytrace_cli.ingest.formats.traces import kineto  # noqa: F401
from polytrace_cli.ingest.formats.traces import nsys  # noqa: F401
from polytrace_cli.ingest.formats.traces import chrome_json  # noqa: F401
