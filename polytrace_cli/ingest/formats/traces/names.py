"""The trace formats' metric names. Imports nothing. Trace files log no step metrics; what their
range names mean is in `polytrace_cli/ingest/trace_events/stages.py`."""

METRIC_ALIASES: dict[str, str] = {}
VALIDATION_PREFIXES: tuple[str, ...] = ()
