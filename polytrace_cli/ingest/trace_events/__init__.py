"""Trace-event files read in bounded pieces (`pieces.py`) and turned into spans (`spans.py`), shared
by the trace formats of every framework; what range and process names mean (`stages.py`)."""
