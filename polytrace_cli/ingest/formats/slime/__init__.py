"""slime and miles (its fork, same logging): the console's per-rollout dicts; their W&B and TensorBoard
keys are read by those formats with the names in `names.py`."""
