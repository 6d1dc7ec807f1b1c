"""ROLL (alibaba/ROLL): the RLVR pipeline's console dicts; its W&B, TensorBoard and SwanLab keys are read by
those formats with the names in `names.py`."""
