"""AReaL: the trainer's stats tables on the console (its W&B, SwanLab, Trackio and TensorBoard keys are
read by those formats with the names in `names.py`), and the perf tracer's traces and rollout sessions."""
