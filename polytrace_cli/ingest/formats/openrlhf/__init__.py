"""OpenRLHF: its metric names (`names.py`) and its console log."""
