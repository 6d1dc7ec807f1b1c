"""AReaL: the perf tracer's traces and rollout sessions."""
