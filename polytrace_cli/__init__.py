"""polytrace: characterize RLVR training runs from the logs RL frameworks write."""

__version__ = "0.1.0"
