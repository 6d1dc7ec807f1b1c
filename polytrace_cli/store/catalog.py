"""What the store generates from the formats' declarations: the `metric_aliases` rows, the
`named_step_metrics` view and the `steps` view.

Framework knowledge (which logged key is a stage time, which keys only validation logs) is declared
in Python by each format (`Ingester.metric_aliases`, `Ingester.validation_prefixes`). From those the
store gets its `metric_aliases` rows and its views; the `steps` view carries a fingerprint of what it
was generated from as its comment. Opening a store compares that fingerprint with the declarations
in the code and, when they differ (an alias was edited, a format was added, an older store), writes
them again in one transaction, so a store never answers from an older set of aliases.

Names are keyed by format: a `metric_aliases` row is (format, key, canonical), one per key each format
names, so two formats may give one key two meanings (a trainer's `completion_length` its mean, another's
its maximum). Under the format `*` (SHARED) are the keys every format that names them names alike. A
pair's canonical name (`named_step_metrics`) is that of its file's format for the key, else the shared
one: a tracker's file (wandb, TensorBoard, MLflow: formats that name no key, holding whatever the trainer
logged) reads every key the frameworks agree on, and a key they disagree on means nothing there.

The `steps` view: one row per (run, segment, step) of a step-aggregate log, with one column per name
in `STEP_COLUMNS`, each the largest value of the step's metrics whose key maps to that name;
`is_validation_only` when every metric of the step has a validation prefix; `has_testing` and
`has_checkpoint` when the step logged a `testing_s` or `save_checkpoint_s` metric; its flags. It is one
aggregate per column (not a PIVOT), so a query of some runs or columns of it reads only those. Code that
reads some runs' steps asks `steps_of_runs_sql` for the same rows with only the columns it needs.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable

import duckdb

from polytrace_cli.errors import StoreError

# The `steps` view's canonical columns, in order. Analyses read the stage columns (the names ending in
# `_s`) from the view, not from a list of their own. A new column is its name here plus a format's
# alias for each key feeding it.
STEP_COLUMNS = (
    "gen_s", "reward_s", "old_log_prob_s", "ref_s", "values_s", "adv_s", "update_actor_s",
    "update_critic_s", "update_weights_s", "testing_s", "save_checkpoint_s", "step_s",
    "response_length_mean", "response_length_max", "response_length_min",
    "prompt_length_mean", "prompt_length_max", "prompt_length_min",
    "clip_ratio", "total_tokens", "throughput",
    "trainer_wait_s", "rollout_s", "trainer_idle_ratio", "rollout_idle_ratio", "staleness_mean", "staleness_max",
    "partial_ratio", "dropped_samples", "stale_samples",
)
_COMMENT_PREFIX = "polytrace catalog "
# The `metric_aliases.format` of the names every format agrees on (no format is named so).
SHARED = "*"
# The views the catalog writes, in the order they are written (`steps` reads `named_step_metrics`).
CATALOG_VIEWS = ("named_step_metrics", "steps")


def _text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def validation_key_sql(validation_prefixes: tuple[str, ...]) -> str:
    """A SQL condition on `key`: true when the key starts with a validation prefix."""
    return " OR ".join(f"starts_with(key, {_text(prefix)})" for prefix in validation_prefixes) or "false"


def shared_names(by_format: dict[str, dict[str, str]]) -> dict[str, str]:
    """key -> canonical for each key that every format naming it maps to one same canonical, in key order:
    {k: c | every format f with k in by_format[f] has by_format[f][k] = c}."""
    meanings: dict[str, set[str]] = {}
    for aliases in by_format.values():
        for key, canonical in aliases.items():
            meanings.setdefault(key, set()).add(canonical)
    return {key: next(iter(found)) for key, found in sorted(meanings.items()) if len(found) == 1}


def alias_rows(by_format: dict[str, dict[str, str]]) -> list[tuple[str, str, str]]:
    """The `metric_aliases` rows (format, key, canonical): each format's own names, then the SHARED ones
    (`shared_names`), in format and key order."""
    rows = [(fmt, key, canonical) for fmt in sorted(by_format) for key, canonical in sorted(by_format[fmt].items())]
    return rows + [(SHARED, key, canonical) for key, canonical in shared_names(by_format).items()]


def named_step_metrics_sql(by_format: dict[str, dict[str, str]]) -> str:
    """The CREATE statement of `named_step_metrics`: every `step_metrics` column, and `canonical`, the name
    the pair's key has in its file's format (`files.format`), else the SHARED name, else NULL:
    canonical(pair) = own(format(file), key) ?? shared(key).

    When every format's names agree with the shared ones (no key means two things), own ?? shared is
    shared for every pair, and the view joins the shared rows alone: reading 2 million pairs took 0.16 s
    through the format's rows and the shared ones, 0.07 s through the shared ones alone."""
    shared = shared_names(by_format)
    if all(shared.get(key) == canonical for names in by_format.values() for key, canonical in names.items()):
        return f"""
CREATE OR REPLACE VIEW named_step_metrics AS
SELECT sm.run_id, sm.segment, sm.step, sm.key, sm.value, sm.text_value, sm.file_id, sm.line_no, a.canonical
FROM step_metrics sm
LEFT JOIN metric_aliases a ON a.format = '{SHARED}' AND a.key = sm.key
"""
    return f"""
CREATE OR REPLACE VIEW named_step_metrics AS
SELECT sm.run_id, sm.segment, sm.step, sm.key, sm.value, sm.text_value, sm.file_id, sm.line_no,
       coalesce(own.canonical, shared.canonical) AS canonical
FROM step_metrics sm
LEFT JOIN files f ON f.file_id = sm.file_id
LEFT JOIN metric_aliases own ON own.format = f.format AND own.key = sm.key
LEFT JOIN metric_aliases shared ON shared.format = '{SHARED}' AND shared.key = sm.key
"""


def steps_view_sql(validation_prefixes: tuple[str, ...]) -> str:
    """The CREATE statement of the `steps` view for these validation prefixes (see the module docstring)."""
    return f"CREATE OR REPLACE VIEW steps AS {_steps_rows_sql(validation_key_sql(validation_prefixes), STEP_COLUMNS)}"


def steps_of_runs_sql(run_ids_sql: str, columns: list[str], where: str = "true") -> str:
    """A query of the `steps` view's rows of the runs in `run_ids_sql` (a SQL list) whose step satisfies
    `where` (a condition on `step`), aggregated from those runs' pairs alone: run_id, segment, step, one
    column per canonical name of `columns` (a name outside STEP_COLUMNS too), is_validation_only,
    has_testing, has_checkpoint, truncated_line and flags, as the view gives them (both are
    `_steps_rows_sql`): only the aggregates asked for are planned and computed, and names the view
    has no column for can be read."""
    return _steps_rows_sql(validation_key_sql(declared_names()[1]), columns, f"run_id IN {run_ids_sql} AND ({where})")


def _steps_rows_sql(validation_key: str, columns, where: str = "true") -> str:
    """One row per (run, segment, step) of the pairs of `named_step_metrics` satisfying `where` (a condition on
    run_id and step): per canonical name of `columns`, the largest value of the step's pairs of that name;
    is_validation_only when `validation_key` holds for every key of the step; has_testing, has_checkpoint
    when it holds a testing_s or save_checkpoint_s pair; its `step_flags` (those satisfying `where`) as
    flags, and truncated_line when one of them is."""
    picked = "".join(f", max(value) FILTER (WHERE canonical = {_text(name)}) AS {name}"
                     for name in dict.fromkeys(columns))
    return f"""
WITH m AS (
    SELECT run_id, segment, step, key, value, canonical FROM named_step_metrics WHERE {where}
), per_step AS (
    SELECT run_id, segment, step{picked},
           bool_and({validation_key}) AS is_validation_only,
           count(*) FILTER (WHERE canonical = 'testing_s') > 0         AS has_testing,
           count(*) FILTER (WHERE canonical = 'save_checkpoint_s') > 0 AS has_checkpoint
    FROM m GROUP BY run_id, segment, step
), f AS (
    SELECT run_id, segment, step, list(DISTINCT flag ORDER BY flag) AS flags
    FROM step_flags WHERE {where} GROUP BY ALL
)
SELECT p.*, coalesce(list_contains(f.flags, 'truncated_line'), false) AS truncated_line,
       coalesce(f.flags, []::VARCHAR[])                         AS flags
FROM per_step p
LEFT JOIN f ON f.run_id = p.run_id AND f.segment = p.segment AND f.step = p.step
"""


# What returns the formats' metric names, (format -> key -> canonical, validation prefixes): the store knows
# no format, so the layer that does hands its function down (`Store.open`, and the ingest registry as it loads).
MetricNamesSource = Callable[[], tuple[dict[str, dict[str, str]], tuple[str, ...]]]
_NAMES_SOURCE: MetricNamesSource | None = None


def hand_down(source: MetricNamesSource) -> None:
    """Make `source` the function the store asks for the formats' metric names from now on (in this
    process; a forked child keeps it)."""
    global _NAMES_SOURCE
    _NAMES_SOURCE = source


def declared_names() -> tuple[dict[str, dict[str, str]], tuple[str, ...]]:
    """(format -> key -> canonical, validation prefixes): what the source handed down (`hand_down`) returns
    from the formats' declarations, asked again at each call so that an edited declaration reaches the next
    open."""
    if _NAMES_SOURCE is None:
        raise StoreError("the store was given no metric names: open it with polytrace_cli.Store.open")
    return _NAMES_SOURCE()


def declared_catalog() -> tuple[list[tuple[str, str, str]], dict[str, str], str]:
    """(`metric_aliases` rows, view name -> CREATE statement for each of CATALOG_VIEWS in order,
    fingerprint) from the formats' declarations (`declared_names`)."""
    by_format, prefixes = declared_names()
    global _LAST_CATALOG
    if _LAST_CATALOG is not None and _LAST_CATALOG[0] == (by_format, prefixes):
        return _LAST_CATALOG[1]
    rows = alias_rows(by_format)
    views = {"named_step_metrics": named_step_metrics_sql(by_format), "steps": steps_view_sql(prefixes)}
    digest = hashlib.sha256(json.dumps([rows, views]).encode()).hexdigest()[:16]
    _LAST_CATALOG = ((copy.deepcopy(by_format), prefixes), (rows, views, digest))
    return rows, views, digest


# The declarations `declared_catalog` last answered for (a copy), and its answer: asked at every open and
# every refresh of the step facts, it builds the rows again only when a declaration changed.
_LAST_CATALOG: tuple[tuple, tuple[list[tuple[str, str, str]], dict[str, str], str]] | None = None


def has_format_keyed_aliases(con: duckdb.DuckDBPyConnection) -> bool:
    """True when the store's `metric_aliases` is keyed by format (schema 023 on): a store migrated only part
    way (`migrate(up_to=...)`) holds the older table, and gets its catalog when it is upgraded."""
    return bool(con.execute(
        "SELECT count(*) FROM duckdb_columns() WHERE table_name = 'metric_aliases' AND column_name = 'format'"
        " AND database_name = current_database() AND schema_name = current_schema()").fetchall()[0][0])


def installed_fingerprint(con: duckdb.DuckDBPyConnection) -> str | None:
    """The fingerprint the store's `steps` view was generated from (None: no view, or not generated)."""
    rows = con.execute(
        "SELECT comment FROM duckdb_views() WHERE view_name = 'steps' AND NOT temporary "
        "AND database_name = current_database() AND schema_name = current_schema()"
    ).fetchall()
    comment = rows[0][0] if rows else None
    return comment[len(_COMMENT_PREFIX):] if comment and comment.startswith(_COMMENT_PREFIX) else None


def catalog_is_current(con: duckdb.DuckDBPyConnection) -> bool:
    """True when the store's aliases and `steps` view are those the code declares."""
    return installed_fingerprint(con) == declared_catalog()[2]


def install_catalog(con: duckdb.DuckDBPyConnection, in_transaction: bool = False,
                    declared: tuple[list[tuple[str, str, str]], dict[str, str], str] | None = None) -> bool:
    """Write the declared `metric_aliases` rows and views when the store's differ; True when written.
    Inside the caller's transaction with `in_transaction`, else in one of its own. `declared`: the
    `declared_catalog()` the caller already has."""
    rows, views, digest = declared or declared_catalog()
    if installed_fingerprint(con) == digest:
        return False
    if not in_transaction:
        con.execute("BEGIN TRANSACTION")
    try:
        con.execute("DELETE FROM metric_aliases")
        if rows:
            # One statement for every row: a new store's catalog took 15 ms of CPU with one statement per row, 9 ms so.
            con.execute("INSERT INTO metric_aliases (format, key, canonical)"
                        " SELECT unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), unnest(?::VARCHAR[])",
                        [[row[0] for row in rows], [row[1] for row in rows], [row[2] for row in rows]])
        for statement in views.values():
            con.execute(statement)
        con.execute(f"COMMENT ON VIEW steps IS {_text(_COMMENT_PREFIX + digest)}")
        if not in_transaction:
            con.execute("COMMIT")
    except Exception:
        if not in_transaction:
            try:
                con.execute("ROLLBACK")
            except duckdb.Error:
                pass  # DuckDB ended the transaction itself: the error that ended it is the one raised
        raise
    return True


def install_catalog_views(con: duckdb.DuckDBPyConnection) -> None:
    """For a read-only copy of a store (a lake read back): `metric_aliases` and the catalog's views as views
    of the code's declarations, whatever the copy was written with."""
    rows, views, _ = declared_catalog()
    values = ", ".join(f"({_text(fmt)}, {_text(key)}, {_text(canonical)})" for fmt, key, canonical in rows)
    source = (f"(VALUES {values}) AS a(format, key, canonical)" if values else
              "(SELECT NULL::VARCHAR, NULL::VARCHAR, NULL::VARCHAR WHERE false) AS a(format, key, canonical)")
    con.execute(f"CREATE OR REPLACE VIEW metric_aliases AS SELECT format, key, canonical FROM {source}")
    for statement in views.values():
        con.execute(statement)
