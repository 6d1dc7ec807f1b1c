"""The wheel ships every package and the top-level `schemas/` folder (SQL migrations and JSON Schemas)."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_folder_is_listed():
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    on_disk = {
        ".".join(path.relative_to(ROOT).parts)
        for path in (ROOT / "polytrace_cli").rglob("*")
        if path.is_dir() and path.name != "__pycache__" and any(path.glob("*.py"))
    }
    on_disk.add("polytrace_cli")
    assert on_disk - listed == set(), "add these packages to [tool.setuptools] packages in pyproject.toml"


def test_schemas_folder_is_the_mapped_package():
    setuptools = _pyproject()["tool"]["setuptools"]
    assert setuptools["package-dir"]["polytrace_cli.schemas"] == "schemas"
    shipped = {entry.name for entry in resources.files("polytrace_cli.schemas").iterdir()}
    on_disk = {path.name for path in (ROOT / "schemas").iterdir() if path.suffix in (".sql", ".json")}
    assert on_disk and on_disk <= shipped


def test_no_migration_left_in_the_old_folder():
    # SQL migrations live in the top-level schemas/ folder only; a file here would never be applied.
    assert not list((ROOT / "polytrace_cli" / "schemas").glob("*.sql"))
