"""SkyRL (skyrl-train): its console tracker's step dicts; its W&B, MLflow and TensorBoard keys are read by
those formats with the names in `names.py`."""
