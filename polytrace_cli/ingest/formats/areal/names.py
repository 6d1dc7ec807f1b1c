"""AReaL's trace names. Imports nothing. The perf tracer's files log no step metrics."""

METRIC_ALIASES: dict[str, str] = {}
VALIDATION_PREFIXES: tuple[str, ...] = ()

# A session phase (`areal/utils/perf_tracer.py`, `SessionRecord.default_phase_configs`) and its stage.
PHASE_STAGES = {"generate": "gen", "reward": "reward", "toolcall": "tool"}
