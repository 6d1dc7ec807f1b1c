"""Benchmark workloads: synthesis from fitted distributions, fits of recorded runs, fidelity, export and replay checks."""
