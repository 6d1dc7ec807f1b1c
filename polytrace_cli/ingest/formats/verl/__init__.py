"""verl: its metric names (`names.py`) and its formats (console log, file-logger JSONL, rollout dumps)."""
