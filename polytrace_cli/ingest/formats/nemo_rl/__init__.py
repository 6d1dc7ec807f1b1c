"""NeMo-RL: the GRPO loop's console summaries (its TensorBoard, W&B and MLflow keys are read by those
formats with the names in `names.py`), and the Perfetto workload trace."""
