"""Characterization analyses (METRICS.md), one module each; importing this registers them all."""
