"""Trackio: its local SQLite project files."""
