"""Shared fixtures: a fresh store per test and the location of the real traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from polytrace_cli.store import open_store

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = PROJECT_ROOT.parent / "shared" / "data"
POLYTRACE_DATA = SHARED_DATA / "polytrace"


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """Path of a store that does not exist yet."""
    return tmp_path / "store.duckdb"


@pytest.fixture
def store(db_path: Path):
    """A migrated, empty store connection, closed after the test."""
    con = open_store(db_path)
    yield con
    con.close()


def need_real_data(*parts: str) -> Path:
    """The path under ../shared/data, or skip the test when that folder is absent."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"real data not present: {path}")
    return path
