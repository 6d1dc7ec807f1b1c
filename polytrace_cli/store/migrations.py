"""Numbered schema files applied in order, with a ledger of what was applied.

The files are `schemas/NNN_<what>.sql` at the top of the project, shipped as the package
`polytrace_cli.schemas`; they hold tables only. A store records every applied file in
`schema_migrations`. Opening an older store applies the files it lacks (a file numbered below one
already applied included), all in one transaction, and then writes what is generated from the formats'
declarations (the `metric_aliases` rows and the `named_step_metrics` and `steps` views,
`store/catalog.py`); a store whose
version is newer than this code knows is refused, so an old polytrace never writes into a layout it
does not understand.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import resources

import duckdb

from polytrace_cli.errors import StoreError
from polytrace_cli.store.catalog import declared_catalog, has_format_keyed_aliases, install_catalog

_FILE_PATTERN = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


@functools.cache
def available_migrations() -> tuple[Migration, ...]:
    """The schema files shipped with the package, ordered by their number (read once per process)."""
    found = []
    for entry in resources.files("polytrace_cli.schemas").iterdir():
        match = _FILE_PATTERN.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions) or (versions and versions[0] != 1):
        raise RuntimeError(f"schema files are not numbered from 1 without duplicates: {versions}")
    return tuple(found)


# The highest schema file's number; numbers may have gaps (a file numbered when its change was begun
# may land after a higher one).
# The tables the step facts' `refresh` (semantics/step_facts.py) keeps from the store's other rows: a copy of
# the store needs only the rest.
DERIVED_TABLES = ("step_facts", "step_facts_files")
SCHEMA_VERSION = max((m.version for m in available_migrations()), default=0)


def has_ledger(con: duckdb.DuckDBPyConnection) -> bool:
    """True when the database has a migrations ledger, i.e. is a polytrace store."""
    # duckdb_tables() rather than information_schema.tables (a view over every kind of catalog entry):
    # asked several times at each open of the store.
    return bool(
        con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'schema_migrations'").fetchall()[0][0]
    )


def schema_version(con: duckdb.DuckDBPyConnection, ledger: bool | None = None) -> int:
    """The highest schema file applied to this store (0 for an empty database). `ledger`: whether the
    store has a ledger, when the caller has just asked (`has_ledger`)."""
    if not (has_ledger(con) if ledger is None else ledger):
        return 0
    return con.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchall()[0][0]


def applied_versions(con: duckdb.DuckDBPyConnection) -> set[int]:
    """The schema files applied to this store."""
    if not has_ledger(con):
        return set()
    return {row[0] for row in con.execute("SELECT version FROM schema_migrations").fetchall()}


def check_not_newer(con: duckdb.DuckDBPyConnection, db_label: str) -> int:
    """Refuse a store written by a newer polytrace; return its version."""
    version = schema_version(con)
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{db_label} has schema version {version}, newer than this polytrace understands "
            f"({SCHEMA_VERSION}); upgrade polytrace to use it"
        )
    return version


def migrate(con: duckdb.DuckDBPyConnection, db_label: str, up_to: int | None = None,
            new_store: bool = False, ledger: bool | None = None) -> list[int]:
    """Apply every schema file the store lacks (up to version `up_to`); return the versions applied.
    `new_store`: the caller has just created the database, which holds nothing yet (no ledger to read);
    `ledger`: whether the store has a ledger, when the caller has just asked (`has_ledger`)."""
    if new_store:
        current, new_ledger, applied = 0, True, set()
    else:
        new_ledger = not (has_ledger(con) if ledger is None else ledger)
        applied = set() if new_ledger else {row[0] for row in con.execute(
            "SELECT version FROM schema_migrations").fetchall()}
        current = max(applied, default=0)
        if current > SCHEMA_VERSION:
            raise StoreError(
                f"{db_label} has schema version {current}, newer than this polytrace understands "
                f"({SCHEMA_VERSION}); upgrade polytrace to use it"
            )
    pending = [m for m in available_migrations()
               if m.version not in applied and (up_to is None or m.version <= up_to)]
    if not pending and not new_ledger:
        if current:
            install_catalog(con)
        return []
    # One transaction for the ledger and every pending file: a store is created or upgraded
    # completely or not at all (a process killed half-way leaves no ledger without tables), and a
    # new store costs one commit (one sync to disk) instead of one per file.
    declared = declared_catalog()
    con.execute("BEGIN TRANSACTION")
    try:
        if new_ledger:
            con.execute(
                "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR NOT NULL,"
                " applied_at TIMESTAMP DEFAULT current_timestamp)"
            )
        # Whether `metric_aliases` is keyed by format changes only with a file that names the table.
        keyed = not new_store and has_format_keyed_aliases(con)
        for migration in pending:
            con.execute(migration.sql)
            if "metric_aliases" in migration.sql.lower():
                keyed = has_format_keyed_aliases(con)
            # The generated views exist from the first file that has the catalog's tables on, for a later
            # file that reads them; a file that replaces one loses the fingerprint, and the declared views
            # are written again. A store migrated only part way, to before the aliases were keyed by
            # format, gets them when it is upgraded.
            if keyed:
                install_catalog(con, in_transaction=True, declared=declared)
        # The ledger's rows in one statement (current_timestamp is the transaction's start in each).
        con.execute("INSERT INTO schema_migrations (version, name) SELECT unnest(?::INTEGER[]), unnest(?::VARCHAR[])",
                    [[m.version for m in pending], [m.name for m in pending]])
        con.execute("COMMIT")
    except Exception:
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:
            pass  # DuckDB ended the transaction itself; the error that ended it is the one to report
        raise
    return [m.version for m in pending]
