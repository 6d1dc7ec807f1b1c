"""Per-file step facts: what the `steps` view takes from each file's pairs, kept per file and step.

The `steps` view joins every pair of the store with its canonical name and pivots them; deciding
something over a whole run from it reads every pair of the run each time. `step_facts` keeps, per
file, segment and step, the largest value of each canonical name and whether every key of the step
has a validation prefix (the view's aggregates, which combine across files and across parts of a
file), and `run_steps_sql` gives the view's rows of one run from them.

`refresh` brings a run's facts up to date with its pairs before they are read. A file's facts are
taken once from its pairs; a log that grew (the same file, more pairs, all of the new ones on later
lines than the facts hold) adds only the facts of its new pairs, combined with what was kept for the
same steps. A file whose pairs changed otherwise, or whose facts were taken with other aliases or
validation prefixes (another catalog fingerprint), has them taken again; the facts of a file no
longer stored are dropped. A file's record in `step_facts_files` is removed before its facts change
and written after, so a refresh cut short leaves that file to be taken again whole (its facts
are then all replaced).
"""

from __future__ import annotations

import duckdb

from polytrace_cli.store.catalog import declared_catalog, declared_names, validation_key_sql
from polytrace_cli.store.connection import whole_row_groups


def _facts_sql(where: str) -> str:
    """The facts of the pairs of `step_metrics sm` that satisfy `where` (`step_facts` columns)."""
    like = validation_key_sql(declared_names()[1])
    return f"""
        WITH m AS (
            SELECT sm.file_id, sm.run_id, sm.segment, sm.step, sm.key, sm.value, a.canonical
            FROM step_metrics sm LEFT JOIN metric_aliases a ON a.key = sm.key WHERE {where}
        )
        SELECT file_id, run_id, segment, step, canonical, max(value) AS value, count(*) AS pairs,
               NULL::BOOLEAN AS validation_only
        FROM m WHERE canonical IS NOT NULL GROUP BY file_id, run_id, segment, step, canonical
        UNION ALL
        SELECT file_id, run_id, segment, step, NULL, NULL, count(*), bool_and({like})
        FROM m GROUP BY file_id, run_id, segment, step
    """


def writable(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the connection can keep facts: a store opened for writing, with the facts tables."""
    rows = con.execute(
        "SELECT NOT d.readonly FROM duckdb_databases() d WHERE d.database_name = current_database()"
        " AND EXISTS (SELECT 1 FROM duckdb_tables() t WHERE t.database_name = current_database()"
        "             AND t.table_name = 'step_facts_files')").fetchall()
    return bool(rows and rows[0][0])


def refresh(con: duckdb.DuckDBPyConnection, run_id: int) -> bool:
    """Bring the run's facts up to date with its pairs (see the module); False, with nothing done,
    when the connection cannot keep them (`writable`): the caller then reads the `steps` view."""
    if not writable(con):
        return False
    catalog = declared_catalog()[2]
    stored, kept = {}, {}
    for file_id, pairs, last_line, kept_pairs, kept_line, made_with in con.execute(
            """
            SELECT file_id, s.pairs, s.last_line, k.pairs, k.last_line, k.catalog
            FROM (SELECT file_id, count(*) AS pairs, max(line_no) AS last_line FROM step_metrics
                  WHERE run_id = $1 GROUP BY file_id) s
            FULL JOIN (SELECT file_id, pairs, last_line, catalog FROM step_facts_files WHERE run_id = $1) k
            USING (file_id)
            """, [run_id]).fetchall():
        if pairs is not None:
            stored[file_id] = (pairs, last_line)
        if made_with is not None:
            kept[file_id] = (kept_pairs, kept_line, made_with)
    gone = [file_id for file_id in kept if file_id not in stored]
    if gone:
        con.execute("DELETE FROM step_facts_files WHERE file_id IN (SELECT unnest(?))", [gone])
        con.execute("DELETE FROM step_facts WHERE file_id IN (SELECT unnest(?))", [gone])
    whole, grown = [], []
    for file_id, (pairs, last_line) in stored.items():
        before = kept.get(file_id)
        if before == (pairs, last_line, catalog):
            continue
        if before and before[2] == catalog and _only_grew(con, file_id, before[0], before[1], pairs):
            grown.append((file_id, before[1]))
        else:
            whole.append(file_id)
    changed = whole + [file_id for file_id, _ in grown]
    if not changed:
        return True
    con.execute("DELETE FROM step_facts_files WHERE file_id IN (SELECT unnest(?))", [changed])
    for file_id, kept_line in grown:
        _add_grown(con, file_id, kept_line)
    if whole:
        con.execute("DELETE FROM step_facts WHERE file_id IN (SELECT unnest(?))", [whole])
        with whole_row_groups(con, sum(stored[file_id][0] for file_id in whole)):
            con.execute(f"INSERT INTO step_facts {_facts_sql('sm.file_id IN (SELECT unnest($1))')}", [whole])
    con.execute("INSERT INTO step_facts_files SELECT unnest(?), ?, unnest(?), unnest(?), ?",
                [changed, run_id, [stored[f][0] for f in changed], [stored[f][1] for f in changed], catalog])
    return True


def _only_grew(con: duckdb.DuckDBPyConnection, file_id: int, kept_pairs: int, kept_line: int | None,
               pairs: int) -> bool:
    """Whether the file's pairs after line `kept_line` are exactly the pairs it gained since its facts
    were kept (`pairs` - `kept_pairs`): a log that grew."""
    if kept_line is None or pairs <= kept_pairs:
        return False
    added = con.execute("SELECT count(*) FROM step_metrics WHERE file_id = ? AND line_no > ?",
                        [file_id, kept_line]).fetchall()[0][0]
    return added == pairs - kept_pairs


def _add_grown(con: duckdb.DuckDBPyConnection, file_id: int, kept_line: int) -> None:
    """Combine the facts of the file's pairs after line `kept_line` into those kept for the same steps."""
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE step_facts_combined AS
        WITH added AS ({_facts_sql('sm.file_id = $1 AND sm.line_no > $2')})
        SELECT file_id, run_id, segment, step, canonical, max(value) AS value, sum(pairs)::BIGINT AS pairs,
               bool_and(validation_only) AS validation_only
        FROM (SELECT f.* FROM step_facts f SEMI JOIN added a
                  ON f.file_id = a.file_id AND f.segment = a.segment AND f.step = a.step
              UNION ALL SELECT * FROM added)
        GROUP BY file_id, run_id, segment, step, canonical
        """, [file_id, kept_line])
    try:
        con.execute("DELETE FROM step_facts f WHERE f.file_id = ? AND EXISTS (SELECT 1 FROM step_facts_combined c"
                    " WHERE c.segment = f.segment AND c.step = f.step)", [file_id])
        con.execute("INSERT INTO step_facts SELECT * FROM step_facts_combined")
    finally:
        con.execute("DROP TABLE IF EXISTS step_facts_combined")


def run_steps_sql(columns: list[str]) -> str:
    """A query of the `steps` view's rows of run $1 from its facts (after `refresh`): segment, step,
    the given canonical `columns`, is_validation_only, has_testing and has_checkpoint, as the view
    gives them."""
    picked = "".join(f", max(value) FILTER (WHERE canonical = '{column}') AS {column}" for column in columns)
    read = ", ".join(f"'{name}'" for name in dict.fromkeys([*columns, "testing_s", "save_checkpoint_s"]))
    return f"""
        SELECT segment, step{picked},
               bool_and(validation_only) FILTER (WHERE canonical IS NULL) AS is_validation_only,
               count(*) FILTER (WHERE canonical = 'testing_s') > 0 AS has_testing,
               count(*) FILTER (WHERE canonical = 'save_checkpoint_s') > 0 AS has_checkpoint
        FROM step_facts WHERE run_id = $1 AND (canonical IS NULL OR canonical IN ({read}))
        GROUP BY segment, step
    """
