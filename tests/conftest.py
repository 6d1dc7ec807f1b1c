"""Shared fixtures: a fresh store per test and the location of the real traces."""

from __future__ import annotations

import gc
import os
import shutil
from pathlib import Path

import duckdb
import pytest
import typer.testing as typer_testing

# pytest-xdist tells its workers COLUMNS=80; the tests read the commands' output as a pipe gives it
# (200 columns unless COLUMNS says otherwise), the same under one process or several.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)

from polytrace_cli.ingest.registry import declared_metric_names
from polytrace_cli.store import open_store
from polytrace_cli.store.catalog import hand_down
from polytrace_cli.store.sandbox import trust_own_write

# Tests open stores with `open_store` as well as `Store.open`: the store is handed the formats' metric names
# as `Store.open` hands them.
hand_down(declared_metric_names)

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = PROJECT_ROOT.parent / "shared" / "data"
POLYTRACE_DATA = SHARED_DATA / "polytrace"


def _command_built_once(build):
    """`typer.testing.CliRunner.invoke` builds the app's click command anew on every call (each command's
    parameters read again from its function's signature and type hints, about 0.05 s), where a process of
    the command line builds it once. The tests build it once per set of registered commands and groups."""
    built = {}

    def shape(app) -> tuple:
        return (id(app), tuple(id(command) for command in app.registered_commands),
                tuple((id(group), shape(group.typer_instance)) for group in app.registered_groups),
                id(app.registered_callback))

    def get_command(app):
        key = shape(app)
        if key not in built:
            built[key] = build(app)
        return built[key]

    return get_command


typer_testing._get_command = _command_built_once(typer_testing._get_command)


def pytest_collection_finish(session):
    """The modules, classes and constants imported to collect the tests live until the session ends; frozen,
    they are left out of every later full collection, which would otherwise walk them all again."""
    gc.collect()
    gc.freeze()


# Session fixtures cheap enough to build on every worker. A test module names its own cheap module fixtures
# (a generated text, a table) in a module-level CHEAP_SHARED_FIXTURES: its tests are then spread over the
# workers, each building them once, rather than queued on one.
CHEAP_SHARED_FIXTURES = {"empty_store_file"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under `--dist loadgroup`, the tests that share a module- or session-scoped fixture run on one
    worker, which builds it once (spread over the workers, each would build it again): such tests are
    grouped by their module, or by the session fixture's name."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        groups = set()
        cheap = CHEAP_SHARED_FIXTURES | getattr(getattr(item, "module", None), "CHEAP_SHARED_FIXTURES", set())
        for name in info.names_closure:
            definitions = info.name2fixturedefs.get(name)
            if not definitions or name in cheap or not definitions[-1].baseid:
                continue  # pytest's own fixtures (tmp_path_factory, ...) have no base id
            scope = definitions[-1].scope
            if scope == "session":
                groups.add(name)
            elif scope in ("module", "package"):
                groups.add(item.nodeid.split("::")[0])
        for group in sorted(groups):
            item.add_marker(pytest.mark.xdist_group(group))


def pytest_configure(config):
    """xdist keeps a group together by adding its name to each test's id, which pytest 9 keeps where
    pytest-xdist 3.8 cannot change it: the groups are left apart without a word, and every module fixture is
    built again on each worker. Such a pair is refused."""
    import xdist

    if config.getoption("dist", "no") == "loadgroup" and pytest.version_tuple[0] >= 9 \
            and tuple(int(part) for part in xdist.__version__.split(".")[:2]) <= (3, 8):
        raise pytest.UsageError(f"pytest {pytest.__version__} with pytest-xdist {xdist.__version__} does not keep "
                                "--dist loadgroup groups together: install pytest<9 (see pyproject.toml)")


@pytest.fixture(scope="session")
def empty_store_file(tmp_path_factory) -> Path:
    """A migrated, empty store created once per session; tests get copies of it (see `fresh_store`)."""
    path = tmp_path_factory.mktemp("template") / "empty.duckdb"
    open_store(path).close()
    return path


def copy_store(source: Path, target: Path) -> Path:
    """A copy of the closed store file `source` at `target` (a store a test may change without touching
    the original); DuckDB keeps a closed store in its one file."""
    shutil.copyfile(source, target)
    return target


@pytest.fixture
def fresh_store(empty_store_file):
    """fresh_store(path): a migrated, empty store file at `path`, copied from the session's template
    (creating and migrating a store anew costs twice as long as opening a copy). The copy of the store
    this process created is taken as its own (`sandbox.trust_own_write`), as the template would be."""

    def fresh(path) -> Path:
        copy = copy_store(empty_store_file, Path(path))
        trust_own_write(copy)
        return copy

    return fresh


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """Path of a store that does not exist yet."""
    return tmp_path / "store.duckdb"


@pytest.fixture
def store(db_path: Path, fresh_store):
    """A migrated, empty store connection, closed after the test without a checkpoint (nothing reads the
    file afterwards, and writing its log into it is half the cost of closing)."""
    con = open_store(fresh_store(db_path))
    yield con
    try:
        con.execute("PRAGMA disable_checkpoint_on_shutdown")
    except duckdb.Error:
        pass  # the test closed the connection itself
    con.close()


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    """`polytrace demo --out F/logs --reports F/reports` run once for the session with POLYTRACE_DB set to
    F/user.duckdb (which the demo must leave alone: it writes its own store, F/logs/demo.duckdb):
    (the command's result, the folder F)."""
    from typer.testing import CliRunner

    from polytrace_cli.cli import app

    folder = tmp_path_factory.mktemp("demo")
    result = CliRunner().invoke(app, ["demo", "--out", str(folder / "logs"), "--reports", str(folder / "reports")],
                                env={"POLYTRACE_DB": str(folder / "user.duckdb")})
    return result, folder


def store_snapshot(con, file_columns: str) -> dict[str, list[tuple]]:
    """Every file-owned table's rows (file ids left out), sorted, with `file_columns` of the files and
    the runs' names, frameworks and meta: what two stores that read the same logs must share."""
    from polytrace_cli.ingest.base import file_owned_tables

    tables = {table: con.execute(f"SELECT * EXCLUDE (file_id) FROM {table} ORDER BY ALL").fetchall()
              for table in file_owned_tables(con)}
    tables["files"] = con.execute(f"SELECT {file_columns} FROM files ORDER BY path").fetchall()
    tables["runs"] = con.execute("SELECT name, framework, meta FROM runs ORDER BY name").fetchall()
    return tables


# Columns that differ between two stores holding the same content: clocks and durations of the reads.
UNCOMPARED_COLUMNS = frozenset({"seconds", "ingested_at", "created_at", "decided_at", "applied_at"})


def whole_store(con) -> dict[str, list[tuple]]:
    """Every table of the store (temporary ones left out), each row with its `file_id` and `run_id` given
    as the file's path and the run's name, the reads' clocks left out (`UNCOMPARED_COLUMNS`), a NaN as
    the text 'NaN', sorted: what two stores holding the same content share, however they were built."""
    import math

    paths = dict(con.execute("SELECT file_id, path FROM files").fetchall())
    names = dict(con.execute("SELECT run_id, name FROM runs").fetchall())
    tables = {}
    for (table,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = current_database()"
                                " ORDER BY table_name").fetchall():
        columns = [name for (name,) in con.execute(
            "SELECT column_name FROM duckdb_columns() WHERE table_name = ? AND database_name = current_database()"
            " ORDER BY column_index", [table]).fetchall()]
        rows = []
        for row in con.execute(f'SELECT * FROM "{table}"').fetchall():
            values = []
            for column, value in zip(columns, row):
                if column in UNCOMPARED_COLUMNS:
                    continue
                if column == "file_id":
                    value = ("file", paths.get(value, value))
                elif column == "run_id":
                    value = ("run", names.get(value, value))
                elif isinstance(value, float) and math.isnan(value):
                    value = "NaN"
                values.append(repr(value))
            rows.append(tuple(values))
        tables[table] = sorted(rows)
    return tables


def need_real_data(*parts: str) -> Path:
    """The path under ../shared/data, or skip the test when that folder is absent."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"real data not present: {path}")
    return path
