"""ClearML: offline session folders (`~/.clearml/cache/offline/offline-<task id>/`)."""
