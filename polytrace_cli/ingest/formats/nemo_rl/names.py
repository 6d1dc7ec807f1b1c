"""NeMo-RL's trace names. Imports nothing. The workload trace logs no step metrics."""

METRIC_ALIASES: dict[str, str] = {}
VALIDATION_PREFIXES: tuple[str, ...] = ()
