"""ClearML keeps the keys the trainer logged, split into a title and a series (verl: `timing_s` and `gen`
for `timing_s/gen`): joined again, their meaning comes from the framework's own names, so the tracker
declares none. This module imports nothing."""

METRIC_ALIASES: dict[str, str] = {}
VALIDATION_PREFIXES: tuple[str, ...] = ()
