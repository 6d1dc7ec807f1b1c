"""ClearML: offline session folders (`~/.clearml/cache/offline/offline-<task id>/`)."""

from polytrace_cli.ingest.formats.clearml import session  # noqa: F401
