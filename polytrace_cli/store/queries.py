"""Read-side queries over the store shared by several commands."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import duckdb

from polytrace_cli.errors import PolytraceError
from polytrace_cli.store.sql import fetch_first

if TYPE_CHECKING:
    import polars as pl

# Where a step's wall clock (`step_clock.source`) came from: a tracker's timestamps, or the times a console
# log printed its lines with.
TRACKER_CLOCK, CONSOLE_CLOCK = "tracker", "console"


def step_clock_sql(run_ids_sql: str, where: str = "true") -> str:
    """SQL of each step's wall clock (run_id, segment, step, logged_at, source) for `run_id IN
    run_ids_sql` and the rows `where` keeps: the latest `logged_at` of the step in `step_clock` from the
    run's best source, a tracker's timestamps (TRACKER_CLOCK; NULL in stores older than the column)
    where the run has any, else its console log's printed times (CONSOLE_CLOCK). One source per run, so
    that the gaps between its steps are read on one clock."""
    return f"""
        WITH c AS (SELECT run_id, segment, step, logged_at, coalesce(source, '{TRACKER_CLOCK}') AS source
                   FROM step_clock WHERE run_id IN {run_ids_sql} AND {where}),
        best AS (SELECT run_id, bool_or(source = '{TRACKER_CLOCK}') AS tracked FROM c GROUP BY run_id)
        SELECT c.run_id, c.segment, c.step, max(c.logged_at) AS logged_at, any_value(c.source) AS source
        FROM c JOIN best USING (run_id) WHERE (c.source = '{TRACKER_CLOCK}') = best.tracked GROUP BY ALL"""


# Per logged step: how many steps are missing just before it in its segment, at the run's regular
# interval k (the most common difference between consecutive logged steps of a segment when at least
# two differences share it, else 1): ⌈(step - previous step) / k⌉ - 1; null on a segment's first step.
# A log written every k steps has no hole; a log that lost records says how many.
STEP_GAPS_SQL = """
    WITH logged AS (
        SELECT DISTINCT run_id, segment, step FROM step_metrics {where}
    ), gaps AS (
        SELECT run_id, segment, step, step - lag(step) OVER (PARTITION BY run_id, segment ORDER BY step) AS gap
        FROM logged
    ), counted AS (
        SELECT run_id, gap, count(*) AS n FROM gaps WHERE gap IS NOT NULL GROUP BY run_id, gap
    ), spacing AS (
        SELECT run_id, CASE WHEN max(n) >= 2 THEN arg_max(gap, n) ELSE 1 END AS spacing FROM counted GROUP BY run_id
    )
    SELECT g.run_id, g.segment, g.step,
           CASE WHEN g.gap IS NOT NULL THEN greatest(ceil(g.gap / coalesce(sp.spacing, 1))::BIGINT - 1, 0) END
               AS missing_before
    FROM gaps g LEFT JOIN spacing sp USING (run_id)
"""


def step_gaps_sql(run_ids_sql: str | None = None) -> str:
    """`STEP_GAPS_SQL` over every run, or over the runs of `run_ids_sql` (a SQL list of ids)."""
    return STEP_GAPS_SQL.format(where=f"WHERE run_id IN {run_ids_sql}" if run_ids_sql else "")


RUNS_SQL = """
        WITH f AS (
            SELECT run_id, count(*) AS files, string_agg(DISTINCT format, ',' ORDER BY format) AS formats,
                   sum(rejected) AS rejected
            FROM files GROUP BY run_id
        ), s AS (
            SELECT run_id, count(*) AS samples, count(DISTINCT step) AS sample_steps,
                   min(step) AS first_step, max(step) AS last_step
            FROM samples GROUP BY run_id
        ), m AS (
            SELECT run_id, count(DISTINCT (segment, step)) AS metric_steps, min(step) AS first_step,
                   max(step) AS last_step, count(DISTINCT segment) AS segments
            FROM step_metrics GROUP BY run_id
        ), holes AS (
            SELECT run_id, sum(coalesce(missing_before, 0))::BIGINT AS missing_steps
            FROM (""" + step_gaps_sql() + """) GROUP BY run_id
        )
        SELECT r.name AS run, r.framework, r.task,
               coalesce(f.files, 0) AS files, f.formats,
               coalesce(s.samples, 0) AS samples,
               greatest(coalesce(s.sample_steps, 0), coalesce(m.metric_steps, 0)) AS steps,
               least(m.first_step, s.first_step) AS first_step, greatest(m.last_step, s.last_step) AS last_step,
               m.segments, holes.missing_steps,
               coalesce(f.rejected, 0)::BIGINT AS rejected,
               {mode} AS mode
        FROM runs r LEFT JOIN f USING (run_id) LEFT JOIN s USING (run_id) LEFT JOIN m USING (run_id)
        LEFT JOIN holes USING (run_id)
        {semantics}
        ORDER BY r.name
"""


def _runs_sql(con: duckdb.DuckDBPyConnection) -> str:
    """RUNS_SQL with the execution mode of the stored semantics records, or null where the store has none
    (a lake written before the mode existed)."""
    has_mode = fetch_first(con, "SELECT count(*) FROM duckdb_columns() WHERE table_name = 'run_semantics'"
                                " AND column_name = 'execution_mode'")[0]
    if not has_mode:
        return RUNS_SQL.format(mode="NULL::VARCHAR", semantics="")
    return RUNS_SQL.format(mode="sem.execution_mode", semantics="LEFT JOIN run_semantics sem USING (run_id)")


def runs_frame(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """One row per run: name, framework, task, files, formats, samples, steps, step range (over step
    metrics and samples), segments of its logs, the steps missing between its logged ones
    (`STEP_GAPS_SQL`; null without step metrics), rejected lines, the execution mode its stored semantics
    record names (null before one is decided)."""
    return con.sql(_runs_sql(con)).pl()


def runs_rows(con: duckdb.DuckDBPyConnection) -> tuple[list[str], list[tuple[Any, ...]]]:
    """The rows of `runs_frame` as column names and tuples (no polars needed)."""
    cursor = con.execute(_runs_sql(con))
    return [column[0] for column in cursor.description], cursor.fetchall()


def _ids_by_name(con: duckdb.DuckDBPyConnection, names: list[str]) -> dict[str, int]:
    """{name: run_id} of the runs among `names`: the one query from a run's name to its id."""
    return dict(con.execute("SELECT name, run_id FROM runs WHERE name IN (SELECT unnest(?))", [names]).fetchall())


def run_ids(con: duckdb.DuckDBPyConnection, names: list[str] | None) -> list[int]:
    """Run ids for the given names (all runs when none are given); unknown names are an error."""
    if not names:
        return [row[0] for row in con.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()]
    found = _ids_by_name(con, names)
    missing = [n for n in names if n not in found]
    if missing:
        known = ", ".join(r[0] for r in con.execute("SELECT name FROM runs ORDER BY name").fetchall()) or "none"
        raise PolytraceError(f"no run named {', '.join(missing)} (runs: {known})")
    return [found[n] for n in names]


def run_id(con: duckdb.DuckDBPyConnection, name: str) -> int:
    """The id of the run named `name` (`run_ids` of one name: an unknown name is an error listing the runs)."""
    return run_ids(con, [name])[0]


def run_id_if_any(con: duckdb.DuckDBPyConnection, name: str) -> int | None:
    """The id of the run named `name`, or None when the store holds no run of that name."""
    return _ids_by_name(con, [name]).get(name)


def run_ids_to_analyze(con: duckdb.DuckDBPyConnection, names: list[str] | None) -> list[int]:
    """`run_ids`, with a store that holds no run an error too (nothing to analyze)."""
    ids = run_ids(con, names)
    if not ids:
        raise PolytraceError("the store holds no runs yet (polytrace ingest PATH first)")
    return ids


def ingest_errors_frame(con: duckdb.DuckDBPyConnection, run: str | None, limit: int) -> pl.DataFrame:
    """Quarantined lines with their file, line number, error code, reason and raw excerpt."""
    ids = run_ids(con, [run] if run else None)
    return con.sql(
        """
        SELECT r.name AS run, f.path AS file, e.line_no AS line, e.code, e.reason, e.raw
        FROM ingest_errors e JOIN files f USING (file_id) JOIN runs r USING (run_id)
        WHERE r.run_id IN (SELECT unnest(?)) ORDER BY f.path, e.line_no NULLS FIRST LIMIT ?
        """,
        params=[ids, limit],
    ).pl()


def ingest_errors_count(con: duckdb.DuckDBPyConnection, run: str | None) -> int:
    """How many lines the store quarantined, for one run or all."""
    ids = run_ids(con, [run] if run else None)
    return fetch_first(con, """
        SELECT count(*) FROM ingest_errors e JOIN files f USING (file_id) WHERE f.run_id IN (SELECT unnest(?))
        """, [ids])[0]


READ_ONLY_STATEMENTS = ("SELECT", "EXPLAIN")
_EXPLAIN_PREFIX = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*EXPLAIN\b", re.IGNORECASE | re.DOTALL)


def read_only_relation(con: duckdb.DuckDBPyConnection, sql: str) -> duckdb.DuckDBPyRelation:
    """The relation of one read-only statement: a SELECT, or a plain EXPLAIN of a SELECT (EXPLAIN
    ANALYZE runs its statement and is refused); anything else is refused before it runs, even on a
    connection that could write."""
    statements = con.extract_statements(sql)
    if len(statements) != 1:
        raise PolytraceError(f"give exactly one SQL statement, not {len(statements)}")
    kind = statements[0].type.name
    if kind not in READ_ONLY_STATEMENTS:
        raise PolytraceError(f"queries are read-only: SELECT statements only, not {kind}")
    if kind == "EXPLAIN":
        _check_plain_explain(con, statements[0].query)
    relation = con.sql(sql)
    if relation is None:
        raise PolytraceError("the statement returned no rows to show")
    return relation


def _check_plain_explain(con: duckdb.DuckDBPyConnection, statement: str) -> None:
    """Refuse an EXPLAIN that is not `EXPLAIN <SELECT>`: EXPLAIN ANALYZE and EXPLAIN with options
    run or reach past the plan, and what follows EXPLAIN must itself be one SELECT."""
    match = _EXPLAIN_PREFIX.match(statement)
    refused = PolytraceError("queries are read-only: EXPLAIN of a SELECT only (not EXPLAIN ANALYZE)")
    if not match:
        raise refused
    try:
        inner = con.extract_statements(statement[match.end():])
    except duckdb.Error:
        raise refused from None
    if len(inner) != 1 or inner[0].type.name != "SELECT":
        raise refused


def query_frame(con: duckdb.DuckDBPyConnection, sql: str) -> pl.DataFrame:
    """The rows of one read-only statement (`read_only_relation`) as a frame."""
    return read_only_relation(con, sql).pl()
