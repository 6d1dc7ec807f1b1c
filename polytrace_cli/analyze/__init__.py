"""Characterization analyses (METRICS.md), one module each; importing this registers them all."""
from polytrace_cli.analyze import imbalance  # noqa: F401
