"""Trackio keeps the keys the trainer logged (verl's, AReaL's, TRL's, ...): their meaning comes from the
framework's own names, so the tracker declares none. This module imports nothing."""

METRIC_ALIASES: dict[str, str] = {}
VALIDATION_PREFIXES: tuple[str, ...] = ()
