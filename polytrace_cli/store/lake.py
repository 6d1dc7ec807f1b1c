"""The store as a Parquet lake: one folder per table, one hive partition per run, and a manifest.

Layout (DuckDB, Spark and Trino read it with hive partitioning):

    OUT/manifest.json
    OUT/<table>/run=<name>/data.parquet   tables tied to a run (a `run_id` column, or a `file_id`
                                          whose file belongs to the run), and `runs` itself
    OUT/<table>/data.parquet              tables of the whole store (metric aliases, schema ledger)

The partition value is the run name, percent-encoded outside `[A-Za-z0-9._-]`. A partition holds no
file when the run has no rows in that table.

The manifest records the schema version, each table's columns and types, the store's view
names (with their SQL, for other readers; `open_lake` never runs it), every written file with its sha256 and row count, and per run a fingerprint: a
sha256 over the run's row, its id and, per file it was read from, the file id, path, sha256,
parser version and line accounting. Re-writing a lake rewrites only the runs whose fingerprint
changed; a run no longer in the store is kept unless pruning is asked for.

Reading (`open_lake`): an in-memory DuckDB with one view per table over its Parquet files, cast
back to the store's column types, and this polytrace's own views (by the names the manifest lists)
on top, so that every query written for a store runs unchanged. The manifest is checked as data
first; the connection is confined to the lake's listed files.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote

import duckdb

from polytrace_cli.errors import StoreError
from polytrace_cli.store.catalog import install_catalog_views
from polytrace_cli.store.migrations import DERIVED_TABLES, SCHEMA_VERSION, schema_version

MANIFEST = "manifest.json"
LAKE_FORMAT = "polytrace-lake/1"
DATA_FILE = "data.parquet"
# What queries over a lake may hold in memory (they spill nothing to disk).
LAKE_MEMORY_LIMIT = "4GB"


def is_lake(path: str | os.PathLike) -> bool:
    """True for a folder holding a lake manifest."""
    return (Path(path) / MANIFEST).is_file()


def partition_name(run: str) -> str:
    """The hive partition folder of a run: `run=<name>`, percent-encoded outside [A-Za-z0-9._-]."""
    return "run=" + quote(run, safe="._-")


@dataclass(frozen=True)
class TableShape:
    """A base table of the store, its columns and how its rows reach a run."""

    name: str
    columns: list[tuple[str, str]]
    link: str  # 'runs', 'run_id', 'file_id' or 'global'

    @property
    def partitioned(self) -> bool:
        return self.link != "global"


@dataclass
class LakeResult:
    """What a lake write did."""

    out: str
    written: list[str] = field(default_factory=list)     # runs (re)written
    unchanged: list[str] = field(default_factory=list)   # runs whose fingerprint matched
    removed: list[str] = field(default_factory=list)     # runs pruned from the lake
    stale: list[str] = field(default_factory=list)       # runs in the lake but not the store, kept
    files: int = 0
    rows: int = 0
    seconds: float = 0.0


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def store_tables(con: duckdb.DuckDBPyConnection) -> list[TableShape]:
    """Every base table of the store with its columns and its link to a run, except the step facts
    the store keeps from its other rows (`step_facts.DERIVED_TABLES`): a lake is read through the
    `steps` view, as a read-only store is."""
    rows = con.execute(
        """
        SELECT c.table_name, list(c.column_name ORDER BY c.column_index), list(c.data_type ORDER BY c.column_index)
        FROM duckdb_columns() c JOIN duckdb_tables() t USING (database_name, schema_name, table_name)
        WHERE c.database_name = current_database() AND c.schema_name = current_schema()
        GROUP BY c.table_name ORDER BY c.table_name
        """
    ).fetchall()
    shapes = []
    for name, names, types in rows:
        if name in DERIVED_TABLES:
            continue
        if name == "runs":
            link = "runs"
        elif "run_id" in names:
            link = "run_id"
        elif "file_id" in names:
            link = "file_id"
        else:
            link = "global"
        shapes.append(TableShape(name, list(zip(names, types)), link))
    return shapes


def store_views(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """The store's own views (name -> CREATE VIEW statement), in creation order."""
    rows = con.execute(
        """
        SELECT view_name, sql FROM duckdb_views()
        WHERE NOT internal AND database_name = current_database() AND schema_name = current_schema()
        ORDER BY view_oid
        """
    ).fetchall()
    return dict(rows)


def run_fingerprints(con: duckdb.DuckDBPyConnection) -> dict[str, tuple[int, str]]:
    """run name -> (run_id, fingerprint) for every run of the store (see the module docstring)."""
    rows = con.execute(
        """
        WITH f AS (
            SELECT run_id, list([file_id::VARCHAR, path, sha256, parser_version, lines::VARCHAR,
                                 stored::VARCHAR, ignored::VARCHAR, rejected::VARCHAR, rows::VARCHAR]
                                ORDER BY file_id) AS files
            FROM files GROUP BY run_id
        )
        SELECT r.run_id, r.name,
               to_json([r.run_id::VARCHAR, r.name, r.framework, r.task, r.model, r.source_dir,
                        r.meta::VARCHAR])::VARCHAR,
               coalesce(to_json(f.files)::VARCHAR, '[]')
        FROM runs r LEFT JOIN f USING (run_id)
        ORDER BY r.run_id
        """
    ).fetchall()
    version = schema_version(con)
    out = {}
    for run_id, name, run_row, files in rows:
        digest = hashlib.sha256(f"{version}\n{run_row}\n{files}".encode()).hexdigest()
        out[name] = (run_id, digest)
    return out


def read_manifest(out: Path) -> dict | None:
    """The lake's manifest, or None when the folder holds none; an unreadable one is an error."""
    path = out / MANIFEST
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError) as error:
        raise StoreError(f"{path} is not a readable lake manifest: {str(error)[:200]}") from None
    except RecursionError:
        raise StoreError(f"{path} is not a readable lake manifest: it is nested too deep to read") from None
    if not isinstance(manifest, dict) or manifest.get("format") != LAKE_FORMAT:
        raise StoreError(f"{path} is not a polytrace lake manifest (format {LAKE_FORMAT})")
    return manifest


def _can_write_in(folder: Path) -> None:
    # os.access says yes to root on read-only mounts; writing a file is the reliable check.
    probe = folder / f".polytrace-write-test-{os.getpid()}"
    probe.touch()
    probe.unlink()


def _write_manifest(out: Path, manifest: dict) -> None:
    temporary = out / (MANIFEST + ".tmp")
    temporary.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", "utf-8")
    os.replace(temporary, out / MANIFEST)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _run_rows_sql(table: TableShape, run_id: int) -> str:
    columns = ", ".join(_quote_ident(name) for name, _ in table.columns)
    source = _quote_ident(table.name)
    if table.link in ("runs", "run_id"):
        return f"SELECT {columns} FROM {source} WHERE run_id = {int(run_id)}"
    return f"SELECT {columns} FROM {source} WHERE file_id IN (SELECT file_id FROM files WHERE run_id = {int(run_id)})"


def _row_counts(con: duckdb.DuckDBPyConnection, table: TableShape) -> dict[int, int]:
    """run_id -> rows of a partitioned table, in one query."""
    source = _quote_ident(table.name)
    if table.link in ("runs", "run_id"):
        sql = f"SELECT run_id, count(*) FROM {source} GROUP BY run_id"
    else:
        sql = f"SELECT f.run_id, count(*) FROM {source} t JOIN files f ON f.file_id = t.file_id GROUP BY f.run_id"
    return dict(con.execute(sql).fetchall())


def _copy(con: duckdb.DuckDBPyConnection, sql: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    con.execute(f"COPY ({sql}) TO {_sql_text(str(target))} (FORMAT parquet, COMPRESSION zstd)")


def write_lake(con: duckdb.DuckDBPyConnection, out: str | os.PathLike, runs: list[str] | None = None, *,
               prune: bool = False) -> LakeResult:
    """Write (or bring up to date) the Parquet lake at `out` from the store `con`.

    Only the named runs (every run when None) are considered; a run is rewritten when its
    fingerprint differs from the manifest's. Runs in the lake but no longer in the store are
    removed when `prune`, else kept and listed as stale.
    """
    import time

    from polytrace_cli.store.queries import run_ids as resolve_run_ids

    started = time.perf_counter()
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise StoreError(f"{out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not is_lake(out):
        raise StoreError(f"{out} is a folder that holds no lake manifest; choose an empty or new folder")
    old = read_manifest(out) if out.exists() else None
    if old and old.get("schema_version", 0) > SCHEMA_VERSION:
        raise StoreError(f"{out} was written by a newer polytrace (schema {old['schema_version']})")
    try:
        out.mkdir(parents=True, exist_ok=True)
        _can_write_in(out)
    except OSError as error:
        raise StoreError(f"cannot create lake {out}: {error.strerror or error}") from None

    tables = store_tables(con)
    fingerprints = run_fingerprints(con)
    wanted = set(resolve_run_ids(con, runs)) if runs else None
    old_runs: dict = dict(old["runs"]) if old else {}
    old_files: list[dict] = list(old["files"]) if old else []
    same_tables = bool(old) and old.get("tables") == {t.name: _table_entry(t) for t in tables}

    result = LakeResult(out=str(out))
    to_write = []
    for name, (run_id, fingerprint) in fingerprints.items():
        if wanted is not None and run_id not in wanted:
            continue
        previous = old_runs.get(name)
        if same_tables and previous and previous.get("fingerprint") == fingerprint:
            result.unchanged.append(name)
        else:
            to_write.append(name)
    gone = sorted(set(old_runs) - set(fingerprints))
    if prune:
        result.removed = gone
    else:
        result.stale = gone

    # Mark what is about to change before touching it: a write that stops half-way leaves these
    # runs without a fingerprint, so the next write redoes them.
    runs_entry = {name: entry for name, entry in old_runs.items() if name not in result.removed}
    for name in to_write:
        runs_entry[name] = {"run_id": fingerprints[name][0], "fingerprint": None,
                            "partition": partition_name(name)}
    touched = set(to_write) | set(result.removed)
    touched_partitions = {partition_name(name) for name in touched}
    kept_files = [entry for entry in old_files
                  if entry.get("partition") not in touched_partitions and entry.get("partition") is not None]
    _write_manifest(out, _manifest(con, tables, runs_entry, kept_files))

    for name in touched:
        for table in (old or {}).get("tables", {}):
            shutil.rmtree(out / table / partition_name(name), ignore_errors=True)

    counts = {table.name: _row_counts(con, table) for table in tables if table.partitioned}
    new_files = []
    for name in to_write:
        run_id = fingerprints[name][0]
        partition = partition_name(name)
        for table in tables:
            if not table.partitioned:
                continue
            folder = out / table.name / partition
            shutil.rmtree(folder, ignore_errors=True)
            rows = counts[table.name].get(run_id, 0)
            if not rows:
                continue
            target = folder / DATA_FILE
            _copy(con, _run_rows_sql(table, run_id), target)
            new_files.append({"path": target.relative_to(out).as_posix(), "table": table.name,
                              "partition": partition, "rows": rows, "bytes": target.stat().st_size,
                              "sha256": _sha256(target)})
        runs_entry[name]["fingerprint"] = fingerprints[name][1]
        result.written.append(name)

    global_files = []
    for table in tables:
        if table.partitioned:
            continue
        target = out / table.name / DATA_FILE
        _copy(con, f"SELECT * FROM {_quote_ident(table.name)}", target)
        rows = con.execute(f"SELECT count(*) FROM {_quote_ident(table.name)}").fetchall()[0][0]
        global_files.append({"path": target.relative_to(out).as_posix(), "table": table.name, "partition": None,
                             "rows": rows, "bytes": target.stat().st_size, "sha256": _sha256(target)})
    known_tables = {t.name for t in tables}
    for folder in out.iterdir():
        # A table no longer written (gone from the store, or step facts an older lake held) leaves no folder.
        if folder.is_dir() and folder.name not in known_tables:
            shutil.rmtree(folder)
    files = sorted([*kept_files, *new_files, *global_files], key=lambda entry: entry["path"])
    _write_manifest(out, _manifest(con, tables, runs_entry, files))
    result.files = len(new_files) + len(global_files)
    result.rows = sum(entry["rows"] for entry in new_files)
    result.seconds = time.perf_counter() - started
    return result


def _table_entry(table: TableShape) -> dict:
    return {"columns": [list(column) for column in table.columns], "partitioned": table.partitioned}


def _manifest(con: duckdb.DuckDBPyConnection, tables: list[TableShape], runs: dict, files: list[dict]) -> dict:
    return {
        "format": LAKE_FORMAT,
        "schema_version": schema_version(con),
        "written_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "tables": {t.name: _table_entry(t) for t in tables},
        "views": store_views(con),
        "runs": dict(sorted(runs.items())),
        "files": files,
    }


# A manifest is data, never code: names are plain identifiers, types come from this list, paths stay
# inside the lake, and views are built by name from this polytrace's own definitions.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_COLUMN_TYPE = re.compile(
    r"(BIGINT|INTEGER|SMALLINT|TINYINT|HUGEINT|UBIGINT|UINTEGER|USMALLINT|UTINYINT|DOUBLE|FLOAT|BOOLEAN|VARCHAR"
    r"|JSON|BLOB|UUID|DATE|TIME|INTERVAL|TIMESTAMP|TIMESTAMP WITH TIME ZONE|DECIMAL\(\d{1,2},\d{1,2}\))(\[\])*")
_FILE_PATH = re.compile(r"[A-Za-z0-9_]+(/run=[A-Za-z0-9._%-]+)?/" + re.escape(DATA_FILE))


def manifest_problem(manifest: object) -> str | None:
    """What makes a parsed manifest unusable as a lake description, or None when it is sound.

    The shape checked: `tables` maps identifiers to {"columns": [[identifier, type], ...],
    "partitioned": bool} with types among `_COLUMN_TYPE`; `views` maps identifiers to anything
    (their SQL is never read); `runs` maps names to {"fingerprint": str or null, ...}; `files` is a
    list of {"table": a listed table, "path": "<table>[/run=<name>]/data.parquet", ...}.
    """
    if not isinstance(manifest, dict):
        return "it is not a JSON object"
    version = manifest.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or not 0 <= version < 2**31:
        return "schema_version is not a whole number from 0 to 2^31 - 1"
    tables = manifest.get("tables")
    if not isinstance(tables, dict) or not tables:
        return "tables is not a non-empty object"
    for name, entry in tables.items():
        if not _IDENTIFIER.fullmatch(name):
            return f"table name {name[:40]!r} is not a plain identifier"
        columns = entry.get("columns") if isinstance(entry, dict) else None
        if not isinstance(columns, list) or not columns:
            return f"table {name} has no column list"
        for column in columns:
            if not (isinstance(column, list) and len(column) == 2 and all(isinstance(c, str) for c in column)):
                return f"table {name} has a column that is not [name, type]"
            if not _IDENTIFIER.fullmatch(column[0]):
                return f"table {name}: column name {column[0][:40]!r} is not a plain identifier"
            if not _COLUMN_TYPE.fullmatch(column[1]):
                return f"table {name}: column {column[0]} has type {column[1][:40]!r}, not a known column type"
    views = manifest.get("views", {})
    if not isinstance(views, dict) or not all(_IDENTIFIER.fullmatch(name) for name in views):
        return "views is not an object keyed by plain identifiers"
    runs = manifest.get("runs")
    if not isinstance(runs, dict) or not all(
            isinstance(entry, dict) and isinstance(entry.get("fingerprint"), (str, type(None)))
            for entry in runs.values()):
        return "runs is not an object of run entries with a fingerprint"
    files = manifest.get("files")
    if not isinstance(files, list):
        return "files is not a list"
    listed: set[str] = set()
    for entry in files:
        if not isinstance(entry, dict) or entry.get("table") not in tables or not isinstance(entry.get("path"), str):
            return "a file entry does not name a listed table and a path"
        path = entry["path"]
        if not _FILE_PATH.fullmatch(path) or path.split("/")[0] != entry["table"] or ".." in path.split("/"):
            return f"file path {path[:80]!r} is not <table>[/run=<name>]/{DATA_FILE} inside the lake"
        if path in listed:
            return f"file path {path[:80]!r} is listed more than once"
        listed.add(path)
    return None


@functools.cache
def polytrace_views() -> dict[str, str]:
    """This polytrace's own views (name -> CREATE VIEW statement), read from an empty store built by
    its migrations."""
    from polytrace_cli.store.sql import connect_duckdb
    from polytrace_cli.store.migrations import migrate

    con = connect_duckdb()
    try:
        migrate(con, "the view definitions")
        return store_views(con)
    finally:
        con.close()


def open_lake(path: str | os.PathLike) -> duckdb.DuckDBPyConnection:
    """A read-only view of a lake: an in-memory DuckDB whose tables and views have the store's names
    and column types, read from the lake's Parquet files.

    The manifest is checked as data (`manifest_problem`); views are this polytrace's own, by the
    names the manifest lists. The connection is confined (`confine`) with only the lake's listed
    Parquet files readable.
    """
    from polytrace_cli.store.sql import confine, connect_duckdb

    root = Path(path)
    manifest = read_manifest(root)
    if manifest is None:
        raise StoreError(f"no lake manifest in {root}")
    problem = manifest_problem(manifest)
    if problem:
        raise StoreError(f"{root / MANIFEST} is not a valid lake manifest: {problem}")
    if manifest["schema_version"] > SCHEMA_VERSION:
        raise StoreError(f"{root} has schema version {manifest['schema_version']}, newer than this polytrace "
                         f"understands ({SCHEMA_VERSION}); upgrade polytrace to use it")
    incomplete = sorted(name for name, entry in manifest["runs"].items() if entry.get("fingerprint") is None)
    if incomplete:
        raise StoreError(f"lake {root} is incomplete (a write stopped during runs {', '.join(incomplete[:5])}); "
                         "run `polytrace lake` again")
    known_views = polytrace_views()
    unknown = sorted(set(manifest.get("views", {})) - set(known_views))
    if unknown:
        raise StoreError(f"lake {root} lists views this polytrace does not define ({', '.join(unknown[:5])}); "
                         "write the lake again with this polytrace")
    resolved_root = root.resolve()
    files_by_table: dict[str, list[str]] = {}
    for entry in manifest["files"]:
        file = (resolved_root / entry["path"]).resolve()
        if not file.is_relative_to(resolved_root):
            raise StoreError(f"lake {root} lists {entry['path']}, which leads outside the lake")
        if not file.is_file():
            raise StoreError(f"lake {root} lacks {root / entry['path']} listed in its manifest")
        files_by_table.setdefault(entry["table"], []).append(str(file))
    con = connect_duckdb()
    # Only the lake's own Parquet files can be read, and the configuration is then locked. An
    # in-memory DuckDB spills into ./.tmp of the working folder, which it may then read: it spills
    # nowhere, under a memory limit.
    con.execute("SET allowed_paths = ?", [[p for paths in files_by_table.values() for p in paths]])
    confine(con, memory_limit=LAKE_MEMORY_LIMIT)
    try:
        for name, entry in manifest["tables"].items():
            casts = ", ".join(f"CAST({_quote_ident(column)} AS {kind}) AS {_quote_ident(column)}"
                              for column, kind in entry["columns"])
            paths = files_by_table.get(name)
            if paths:
                listed = "[" + ", ".join(_sql_text(p) for p in paths) + "]"
                source = f"read_parquet({listed}, union_by_name = true)"
                con.execute(f"CREATE VIEW {_quote_ident(name)} AS SELECT {casts} FROM {source}")
            else:
                nulls = ", ".join(f"CAST(NULL AS {kind}) AS {_quote_ident(column)}" for column, kind in entry["columns"])
                con.execute(f"CREATE VIEW {_quote_ident(name)} AS SELECT {nulls} WHERE false")
        for name in manifest.get("views", {}):
            con.execute(known_views[name])
        # The aliases and the steps view come from this code's formats, not from the code that wrote the lake.
        install_catalog_views(con)
    except duckdb.Error as error:
        con.close()
        first = str(error).strip().splitlines()[0]
        raise StoreError(f"cannot read lake {root}: {first}") from None
    return con
