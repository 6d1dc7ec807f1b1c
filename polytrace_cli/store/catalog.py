"""What the store generates from the formats' declarations: the `metric_aliases` rows and the `steps` view.

Framework knowledge (which logged key is a stage time, which keys only validation logs) is declared
in Python by each format (`Ingester.metric_aliases`, `Ingester.validation_prefixes`). From those the
store gets its `metric_aliases` rows and its `steps` view; the view carries a fingerprint of what it
was generated from as its comment. Opening a store compares that fingerprint with the declarations
in the code and, when they differ (an alias was edited, a format was added, an older store), writes
both again in one transaction, so a store never answers from an older set of aliases.

The `steps` view: one row per (run, segment, step) of a step-aggregate log, with one column per name
in `STEP_COLUMNS`, each the largest value of the step's metrics whose key maps to that name;
`is_validation_only` when every metric of the step has a validation prefix; `has_testing` and
`has_checkpoint` when the step logged a `testing_s` or `save_checkpoint_s` metric; its flags.
"""

from __future__ import annotations

import hashlib
import json

import duckdb

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
)
_COMMENT_PREFIX = "polytrace catalog "


def _text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def validation_key_sql(validation_prefixes: tuple[str, ...]) -> str:
    """A SQL condition on `key`: true when the key starts with a validation prefix."""
    return " OR ".join(f"starts_with(key, {_text(prefix)})" for prefix in validation_prefixes) or "false"


def steps_view_sql(validation_prefixes: tuple[str, ...]) -> str:
    """The CREATE statement of the `steps` view for these validation prefixes (see the module docstring)."""
    like = validation_key_sql(validation_prefixes)
    columns = ", ".join(_text(name) for name in STEP_COLUMNS)
    return f"""
CREATE OR REPLACE VIEW steps AS
WITH m AS (
    SELECT sm.run_id, sm.segment, sm.step, sm.key, sm.value, a.canonical
    FROM step_metrics sm LEFT JOIN metric_aliases a ON a.key = sm.key
), per_step AS (
    SELECT run_id, segment, step,
           bool_and({like}) AS is_validation_only,
           count(*) FILTER (WHERE canonical = 'testing_s') > 0         AS has_testing,
           count(*) FILTER (WHERE canonical = 'save_checkpoint_s') > 0 AS has_checkpoint
    FROM m GROUP BY run_id, segment, step
), canonical AS (
    PIVOT (SELECT run_id, segment, step, canonical, value FROM m WHERE canonical IS NOT NULL)
    ON canonical IN ({columns})
    USING max(value)
    GROUP BY run_id, segment, step
), f AS (
    SELECT run_id, segment, step, list(DISTINCT flag ORDER BY flag) AS flags
    FROM step_flags GROUP BY ALL
)
SELECT p.run_id, p.segment, p.step, c.* EXCLUDE (run_id, segment, step),
       p.is_validation_only, p.has_testing, p.has_checkpoint,
       coalesce(list_contains(f.flags, 'truncated_line'), false) AS truncated_line,
       coalesce(f.flags, []::VARCHAR[])                         AS flags
FROM per_step p
LEFT JOIN canonical c ON c.run_id = p.run_id AND c.segment = p.segment AND c.step = p.step
LEFT JOIN f ON f.run_id = p.run_id AND f.segment = p.segment AND f.step = p.step
"""


def declared_names() -> tuple[dict[str, str], tuple[str, ...]]:
    """(aliases, validation prefixes): what the function the package root names in
    `METRIC_NAMES_SOURCE` returns from the formats' declarations."""
    import importlib

    from polytrace_cli import METRIC_NAMES_SOURCE

    module, function = METRIC_NAMES_SOURCE.split(":")
    return getattr(importlib.import_module(module), function)()


def declared_catalog() -> tuple[dict[str, str], str, str]:
    """(aliases, steps view statement, fingerprint) from the formats' declarations (`declared_names`)."""
    aliases, prefixes = declared_names()
    view = steps_view_sql(prefixes)
    digest = hashlib.sha256(json.dumps([aliases, view], sort_keys=True).encode()).hexdigest()[:16]
    return aliases, view, digest


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
                    declared: tuple[dict[str, str], str, str] | None = None) -> bool:
    """Write the declared `metric_aliases` rows and `steps` view when the store's differ; True when written.
    Inside the caller's transaction with `in_transaction`, else in one of its own. `declared`: the
    `declared_catalog()` the caller already has."""
    aliases, view, digest = declared or declared_catalog()
    if installed_fingerprint(con) == digest:
        return False
    if not in_transaction:
        con.execute("BEGIN TRANSACTION")
    try:
        con.execute("DELETE FROM metric_aliases")
        if aliases:
            # One statement for every row: a new store's catalog took 15 ms of CPU with one statement per row, 9 ms so.
            con.execute("INSERT INTO metric_aliases SELECT unnest(?::VARCHAR[]), unnest(?::VARCHAR[])",
                        [list(aliases), list(aliases.values())])
        con.execute(view)
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
    """For a read-only copy of a store (a lake read back): `metric_aliases` and `steps` as views of the
    code's declarations, whatever the copy was written with."""
    aliases, view, _ = declared_catalog()
    rows = ", ".join(f"({_text(key)}, {_text(canonical)})" for key, canonical in aliases.items())
    source = f"(VALUES {rows}) AS a(key, canonical)" if rows else "(SELECT NULL::VARCHAR, NULL::VARCHAR WHERE false) AS a(key, canonical)"
    con.execute(f"CREATE OR REPLACE VIEW metric_aliases AS SELECT key, canonical FROM {source}")
    con.execute(view)
