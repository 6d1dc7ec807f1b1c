"""Benchmark workloads: sampling realistic PolyTrace traces from fitted distributions."""
