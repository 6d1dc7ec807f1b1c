"""Characterization analyses (docs/metrics.md), one module each, listed in order in `registry.ANALYSES`."""
