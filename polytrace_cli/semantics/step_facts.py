"""Per-file step facts: what the `steps` view takes from each file's pairs, kept per file and step.

The `steps` view joins every pair of the store with its canonical name and pivots them; deciding
something over a whole run from it reads every pair of the run each time. `step_facts` keeps, per
file, segment and step, the largest value of each canonical name and whether every key of the step
has a validation prefix (the view's aggregates, which combine across files and across parts of a
file), and `run_steps_sql` gives the view's rows of one run from them (`run_steps_table` keeps
them, for the decisions taken one after another over the same run).

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

import json
import weakref

import duckdb

from polytrace_cli.store.catalog import declared_catalog, declared_names, validation_key_sql
from polytrace_cli.store.sql import fold_added_rows, whole_row_groups
from polytrace_cli.store.migrations import DERIVED_TABLES  # noqa: F401  (the tables `refresh` keeps)


def _facts_sql(where: str) -> str:
    """The facts of the pairs of `step_metrics sm` that satisfy `where` (`step_facts` columns)."""
    like = validation_key_sql(declared_names()[1])
    return f"""
        WITH m AS (
            SELECT sm.file_id, sm.run_id, sm.segment, sm.step, sm.key, sm.value, sm.canonical
            FROM named_step_metrics sm WHERE {where}
        )
        SELECT file_id, run_id, segment, step, canonical, max(value) AS value, count(*) AS pairs,
               NULL::BOOLEAN AS validation_only
        FROM m WHERE canonical IS NOT NULL GROUP BY file_id, run_id, segment, step, canonical
        UNION ALL
        SELECT file_id, run_id, segment, step, NULL, NULL, count(*), bool_and({like})
        FROM m GROUP BY file_id, run_id, segment, step
    """


# The connections known to be `writable` (a connection opened for writing stays so).
_WRITABLE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def writable(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the connection can keep facts: a store opened for writing, with the facts tables
    (which no code drops: a connection found writable is asked once)."""
    if _WRITABLE.get(con):
        return True
    rows = con.execute(
        "SELECT NOT d.readonly FROM duckdb_databases() d WHERE d.database_name = current_database()"
        " AND EXISTS (SELECT 1 FROM duckdb_tables() t WHERE t.database_name = current_database()"
        "             AND t.table_name = 'step_facts_files')").fetchall()
    found = bool(rows and rows[0][0])
    if found:
        _WRITABLE[con] = True
    return found


def refresh(con: duckdb.DuckDBPyConnection, run_id: int) -> bool:
    """Bring the run's facts up to date with its pairs (see the module); False, with nothing done,
    when the connection cannot keep them (`writable`): the caller then reads the `steps` view."""
    return _refreshed(con, run_id) is not None


def _refreshed(con: duckdb.DuckDBPyConnection, run_id: int) -> dict[int, list] | None:
    """`refresh`, returning the run's `step_facts_files` rows as it leaves them (file id -> [pairs,
    last line, catalog]: each file holding pairs, as the pairs are now), or None when it cannot."""
    if not writable(con):
        return None
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
    facts = {file_id: [pairs, last_line, catalog] for file_id, (pairs, last_line) in stored.items()}
    if not changed:
        return facts
    con.execute("DELETE FROM step_facts_files WHERE file_id IN (SELECT unnest(?))", [changed])
    for file_id, kept_line in grown:
        _add_grown(con, file_id, kept_line)
    if whole:
        con.execute("DELETE FROM step_facts WHERE file_id IN (SELECT unnest(?))", [whole])
        with whole_row_groups(con, sum(stored[file_id][0] for file_id in whole)):
            con.execute(f"INSERT INTO step_facts {_facts_sql('sm.file_id IN (SELECT unnest($1))')}", [whole])
    con.execute("INSERT INTO step_facts_files SELECT unnest(?), ?, unnest(?), unnest(?), ?",
                [changed, run_id, [stored[f][0] for f in changed], [stored[f][1] for f in changed], catalog])
    return facts


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
    con.execute(f"CREATE OR REPLACE TEMP TABLE step_facts_added AS {_facts_sql('sm.file_id = $1 AND sm.line_no > $2')}",
                [file_id, kept_line])
    fold_added_rows(con, "step_facts", "step_facts_added", ("file_id", "segment", "step"),
                    "file_id, run_id, segment, step, canonical",
                    "max(value) AS value, sum(pairs)::BIGINT AS pairs, bool_and(validation_only) AS validation_only")


def pairs_after_sql(after: dict[int, int | None], columns: str, where: str = "true") -> tuple[str, list]:
    """(query, parameters): `columns` of the `step_metrics` pairs satisfying `where` of each file of
    `after` (file id -> the last line read before, None for all its lines) on its later lines. One
    select per file, its line bound a constant: DuckDB reads only the row groups holding later lines."""
    selects, parameters = [], []
    for file_id, line in after.items():
        selects.append(f"SELECT {columns} FROM step_metrics WHERE file_id = ? AND ({where})"
                       + ("" if line is None else " AND line_no > ?"))
        parameters += [file_id] if line is None else [file_id, line]
    return " UNION ALL ".join(selects), parameters


def run_steps_sql(columns: list[str], facts: str = "step_facts", present: set[str] | None = None) -> str:
    """A query of the `steps` view's rows of run $1 from its facts (after `refresh`): segment, step,
    the given canonical `columns`, is_validation_only, has_testing and has_checkpoint, as the view
    gives them. `facts` may name a subset of `step_facts` (whole steps of it) to read instead.
    `present`: the canonical names the run's facts hold (`present_names`; None: not known). A column of
    a name not among them is NULL on every step (the largest of no value), and has_testing or
    has_checkpoint false, without an aggregate for it."""

    def held(name: str) -> bool:
        return present is None or name in present

    picked = "".join(f", max(value) FILTER (WHERE canonical = '{column}') AS {column}" if held(column)
                     else f", NULL::DOUBLE AS {column}" for column in columns)
    read = ", ".join(f"'{name}'" for name in dict.fromkeys([*columns, "testing_s", "save_checkpoint_s"]))
    has = {name: f"count(*) FILTER (WHERE canonical = '{name}') > 0" if held(name) else "false"
           for name in ("testing_s", "save_checkpoint_s")}
    return f"""
        SELECT segment, step{picked},
               bool_and(validation_only) FILTER (WHERE canonical IS NULL) AS is_validation_only,
               {has["testing_s"]} AS has_testing,
               {has["save_checkpoint_s"]} AS has_checkpoint
        FROM {facts} WHERE run_id = $1 AND (canonical IS NULL OR canonical IN ({read}))
        GROUP BY segment, step
    """


def present_names(con: duckdb.DuckDBPyConnection, run_id: int, columns: list[str]) -> set[str]:
    """The names of `columns`, testing_s and save_checkpoint_s that the run's facts hold (a scan of its
    facts: a run logs a few of the stage names, and each absent one is an aggregate `run_steps_sql` skips)."""
    wanted = list(dict.fromkeys([*columns, "testing_s", "save_checkpoint_s"]))
    return {name for (name,) in con.execute(
        "SELECT DISTINCT canonical FROM step_facts WHERE run_id = $1 AND canonical IN (SELECT unnest($2::VARCHAR[]))",
        [run_id, wanted]).fetchall()}


# The temporary table holding one run's `steps` rows read from its facts (`run_steps_table`), and the
# one holding what they were read from.
RUN_STEPS = "step_facts_run_steps"
_RUN_STEPS_MADE_FROM = "step_facts_run_steps_made_from"


def run_steps_table(con: duckdb.DuckDBPyConnection, run_id: int, columns: list[str]) -> str | None:
    """The name of a temporary table holding the `steps` rows of the run as `run_steps_sql(columns)`
    gives them, after `refresh`; None when the facts cannot be kept (`writable`).

    The table is kept for the run it was last read for, with what it was read from (the run's
    `step_facts_files` rows) and its columns, so that the decisions taken over one run one after
    another (at ingest: whether the step time counts testing, then the semantics record) read the
    run's steps once, and a run whose files only grew or were added to since (a log being watched)
    has only the steps of the new pairs read again. Any other change, or columns it lacks, reads
    it whole. A temporary table follows the transaction that changed it: one rolled back leaves the
    table and what it was read from as they were.
    """
    facts = _refreshed(con, run_id)
    if facts is None:
        return None
    con.execute(f"CREATE TEMP TABLE IF NOT EXISTS {_RUN_STEPS_MADE_FROM} (run_id INTEGER, facts VARCHAR,"
                " columns VARCHAR[])")
    made = con.execute(f"SELECT run_id, facts, columns FROM {_RUN_STEPS_MADE_FROM}").fetchall()
    if made and made[0][0] == run_id and set(columns) <= set(made[0][2]):
        before = {int(file_id): kept for file_id, kept in json.loads(made[0][1]).items()}
        if before == facts:
            return RUN_STEPS
        grown = _grown_since(before, facts)
        if grown is not None:
            _read_steps_again(con, run_id, grown, made[0][2])
            _made_from(con, run_id, facts, made[0][2], replaced=True)
            return RUN_STEPS
    con.execute(f"CREATE OR REPLACE TEMP TABLE {RUN_STEPS} AS"
                f" {run_steps_sql(columns, present=present_names(con, run_id, columns))}", [run_id])
    _made_from(con, run_id, facts, columns, replaced=bool(made))
    return RUN_STEPS


def _made_from(con: duckdb.DuckDBPyConnection, run_id: int, facts: dict, columns: list[str], replaced: bool) -> None:
    """Record what RUN_STEPS was read from; `replaced`: the table holds the row of an earlier read."""
    arguments = [run_id, json.dumps(facts), list(columns)]
    if replaced:
        con.execute(f"UPDATE {_RUN_STEPS_MADE_FROM} SET run_id = ?, facts = ?, columns = ?", arguments)
    else:
        con.execute(f"INSERT INTO {_RUN_STEPS_MADE_FROM} VALUES (?, ?, ?)", arguments)


def _grown_since(before: dict, now: dict) -> dict[int, int | None] | None:
    """file id -> the last line whose facts `before` held (None: a file new since), for each file of
    the run whose facts changed only by pairs on later lines (a file keeps its pairs until it is
    removed: a file read again gets a new id); None when any other change happened (a file gone,
    fewer pairs, another catalog)."""
    changed: dict[int, int | None] = {}
    for file_id, kept in before.items():
        current = now.get(file_id)
        if current is None or current[2] != kept[2] or current[0] < kept[0] or kept[1] is None \
                or (current[1] or 0) < kept[1]:
            return None
        if current != kept:
            changed[file_id] = kept[1]
    changed.update({file_id: None for file_id in now.keys() - before.keys()})
    return changed


def _read_steps_again(con: duckdb.DuckDBPyConnection, run_id: int, grown: dict[int, int | None],
                      columns: list[str]) -> None:
    """Read again the RUN_STEPS rows of every step that a pair of `grown` (file id -> last line read
    before, None for all its lines) falls in, from all the run's facts of those steps."""
    later, arguments = pairs_after_sql(grown, "segment, step")
    con.execute(f"CREATE OR REPLACE TEMP TABLE step_facts_touched AS SELECT DISTINCT segment, step FROM ({later})",
                arguments)
    try:
        con.execute(f"DELETE FROM {RUN_STEPS} r USING step_facts_touched t WHERE r.segment = t.segment"
                    " AND r.step = t.step")
        facts = "(SELECT f.* FROM step_facts f SEMI JOIN step_facts_touched t USING (segment, step))"
        con.execute(f"INSERT INTO {RUN_STEPS} {run_steps_sql(columns, facts, present_names(con, run_id, columns))}",
                    [run_id])
    finally:
        con.execute("DROP TABLE IF EXISTS step_facts_touched")
