"""Trackio: its local SQLite project files."""

from polytrace_cli.ingest.formats.trackio import project  # noqa: F401
