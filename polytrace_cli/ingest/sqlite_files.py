"""Opening a SQLite file that polytrace reads (an MLflow store, a Trackio project, an Nsight Systems
export): read-only, by its path alone."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path


def open_read_only(path: Path) -> sqlite3.Connection:
    """A read-only sqlite3 connection to the file `path`. The path goes into the `file:` URI
    percent-encoded (a `#`, `?` or `%` in a folder name is part of the name, never of the URI), so
    SQLite opens that file or fails, and never creates one."""
    return sqlite3.connect(f"{Path(os.path.abspath(path)).as_uri()}?mode=ro", uri=True)
