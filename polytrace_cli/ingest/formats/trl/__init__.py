"""Hugging Face TRL: its metric names (`names.py`), its logged dict (`logged.py`), its console log and trainer_state.json."""
