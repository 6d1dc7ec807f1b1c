"""The store's numbered SQL migrations and the JSON Schema of every --json output.

The folder sits at the top of the project and ships inside the package under this name
(pyproject.toml maps it with setuptools `package-dir`)."""

from __future__ import annotations

import json
from importlib import resources

# The version in every JSON Schema's `$id` (urn:polytrace:schema:<command>:v<N>). It changes only when a
# document loses or renames a field or changes its type; new fields keep the version.
JSON_SCHEMA_VERSION = 1


def json_schema(command: str) -> dict:
    """The JSON Schema (draft 2020-12) of `polytrace <command> --json`'s output (`summary` for a report's
    summary.json)."""
    path = resources.files(__name__) / f"{command}.schema.json"
    if not path.is_file():
        raise KeyError(f"no JSON Schema for {command!r}")
    return json.loads(path.read_text("utf-8"))


def json_schema_commands() -> list[str]:
    """The commands (and `summary`) that have a JSON Schema, in name order."""
    suffix = ".schema.json"
    return sorted(entry.name[: -len(suffix)] for entry in resources.files(__name__).iterdir()
                  if entry.name.endswith(suffix))
