"""The DuckDB store: connection, schema migrations and the tables ingesters write."""

from polytrace_cli.store.connection import DEFAULT_DB, open_store, resolve_db_path
from polytrace_cli.store.sql import fetch_first
from polytrace_cli.store.migrations import SCHEMA_VERSION, schema_version

__all__ = ["DEFAULT_DB", "fetch_first", "SCHEMA_VERSION", "open_store", "resolve_db_path", "schema_version"]
