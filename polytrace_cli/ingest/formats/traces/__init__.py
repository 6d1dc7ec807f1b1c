"""Trace files: Chrome trace-event JSON and JSON lines, PyTorch profiler (Kineto) traces, Nsight Systems SQLite exports."""
