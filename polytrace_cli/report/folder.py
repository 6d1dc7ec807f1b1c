"""The report's folder name, checked before any work: a plain folder name under the output folder.

Its own small module so that the forking report (`store_report`, which must not load polars or
matplotlib before it forks) and the writer (`writer`) check it the same way without importing each other.
"""

from __future__ import annotations

from polytrace_cli.errors import PolytraceError


def check_report_name(name: str | None) -> None:
    """Refuse a report folder name that is not a plain folder name (empty, a path, `.` or `..`)."""
    if name is not None and (not name.strip() or "/" in name or name in {".", ".."}):
        raise PolytraceError(f"--name must be a plain folder name, not {name!r}")
