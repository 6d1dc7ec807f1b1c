"""NeMo-RL: the Perfetto workload trace."""
