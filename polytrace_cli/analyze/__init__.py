"""Characterization analyses (METRICS.md), one module each; `registry.all_analyses()` imports them."""
