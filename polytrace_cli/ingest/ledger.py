"""The store's ledger of runs and files: which run a file belongs to (`derive_run`, `RunResolver`), the
`files` row of every file read, the run facts folded from what each file gave (`merge_run_meta`), a
file's rows removed, the files rejected as a whole, and what a read reports (`FileReport`).
"""

from __future__ import annotations

import functools
import json
import re
import time
from dataclasses import astuple, dataclass, field, fields
from pathlib import Path

import duckdb

from polytrace_cli.errors import ErrorCode
from polytrace_cli.ingest.base import UNREAD_RECORD, FileContext, file_owned_tables
from polytrace_cli.ingest.files import block_sha, path_text, state_kept_for
from polytrace_cli.semantics.step_timers import NULL_MEANS_CANNOT_TELL, step_time_inclusion
from polytrace_cli.store.sql import fetch_first, rollback


@dataclass
class FileReport:
    """What happened to one input file."""

    path: str
    status: str  # ingested, appended, replaced, truncated, unchanged, rejected, skipped, error
    format: str | None = None
    run: str | None = None
    bytes: int = 0
    lines: int = 0
    stored: int = 0
    ignored: int = 0
    rejected: int = 0
    rows: int = 0
    # Lines that look like metric records but were not read (ignored under UNREAD_RECORD).
    unread_records: int = 0
    # The rule of a writer's side file met in a folder and passed over (`files.SIDE_FILE_RULES`).
    side_rule: str | None = None
    seconds: float = 0.0
    message: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    @property
    def failed(self) -> bool:
        return self.status in ("rejected", "error")

    @property
    def unread(self) -> bool:
        """True when the file could not be opened at all (missing, unreadable): nothing of it was read."""
        return self.status == "error" and self.format is None and self.lines == 0


# Folder names that say what a folder holds rather than which run it is.
GENERIC_FOLDERS = {
    "profile", "packed_length_log", "multiturn_workload_log", "logs", "log", "files", "media",
    "table", "tables", "output", "outputs", "rollout_data", "validation_data", "rollout_data_dir",
    "validation_data_dir", "tensorboard", "tensorboard_log", "tb", "events", "runs", "wandb",
}
_TIMESTAMP_LIKE = re.compile(r"[\d_\-.:T]+")
# transformers' TensorBoard folder `runs/Nov26_15-55-36_host` names a start time, and its
# `checkpoint-N` folders a point of the run in its output folder.
_TRAINER_TIMESTAMP = re.compile(r"[A-Z][a-z]{2}\d{2}_\d{2}-\d{2}-\d{2}_.+")
_CHECKPOINT_FOLDER = re.compile(r"checkpoint-\d+")
# The folders trace writers put under a run's: a rollout replica's engine traces (verl), AReaL's tracers.
_TRACE_FOLDER = re.compile(r"agent_loop_rollout_replica_\d+|perf_tracer|session_tracer")
# The folders of an MLflow file-store run (`mlruns/<experiment>/<run>/metrics/<key>`) below the run's.
_MLFLOW_RUN_PARTS = {"metrics", "params", "tags", "artifacts"}


def derive_run(file: Path, resolved: bool = False) -> tuple[str, Path]:
    """A run's name and root folder from a file's location.

    Walks up from the file's folder past generic names (`files`, `profile`, `logs`, ...) and
    timestamp folders; the first other folder names the run. The deepest timestamp folder passed
    on the way, if any, is the run's root, so two timestamped runs under one folder stay apart.
    `resolved` says `file` is already a resolved path. Files under a `media` folder (wandb's `files/media/table/<key>/...`) belong to the folder that
    holds `media`: the key folders below it name a logged key, not a run. transformers' `checkpoint-N` folders are passed like generic ones
    and its TensorBoard `MonDD_HH-MM-SS_host` folders like timestamp folders, and the files of an
    MLflow file-store run (`<run>/metrics/<key>`, `params/`, `tags/`, `artifacts/`) belong to the run's folder.
    """
    return _run_of_folder((file if resolved else file.resolve()).parent)


@functools.lru_cache(maxsize=4096)
def _run_of_folder(folder: Path) -> tuple[str, Path]:
    media = next((current for current in (folder, *folder.parents) if current.name.lower() == "media"), None)
    if media is not None:
        folder = media.parent
    mlflow = next((current for current in (folder, *folder.parents)
                   if current.name in _MLFLOW_RUN_PARTS and (current.parent / "meta.yaml").is_file()), None)
    if mlflow is not None:
        return mlflow.parent.name, mlflow.parent
    timestamp_root = None
    for current in (folder, *folder.parents):
        name = current.name
        if not name:
            break
        if _TIMESTAMP_LIKE.fullmatch(name) or _TRAINER_TIMESTAMP.fullmatch(name):
            timestamp_root = timestamp_root or current
            continue
        if name.lower() in GENERIC_FOLDERS or _CHECKPOINT_FOLDER.fullmatch(name) or _TRACE_FOLDER.fullmatch(name):
            continue
        return name, timestamp_root or current
    return (folder.name or "run"), folder


class RunResolver:
    """Finds or creates the run a file belongs to."""

    def __init__(self, con: duckdb.DuckDBPyConnection, run_name: str | None, task: str | None):
        self.con = con
        self.run_name = run_name
        self.task = task
        self._cache: dict[Path, tuple[int, str]] = {}

    def _identity(self, file: Path, resolved: bool = False) -> tuple[str, str, Path | None]:
        name, root = derive_run(file, resolved)
        if self.run_name:
            return self.run_name, path_text(root), None
        return path_text(name), path_text(root), root

    def resolve(self, file: Path, framework: str | None, resolved: bool = False) -> tuple[int, str]:
        name, source_dir, key = self._identity(file, resolved)
        cache_key = key or Path("::" + name)
        if cache_key not in self._cache:
            self._cache[cache_key] = self._find_or_create(name, source_dir, framework, explicit=key is None)
        return self._cache[cache_key]

    def existing(self, file: Path) -> tuple[int, str] | None:
        """The run the file belongs to if it is already in the store (never creates one)."""
        name, source_dir, key = self._identity(file)
        if key is None:
            return fetch_first(self.con, "SELECT run_id, name FROM runs WHERE name = ?", [name])
        return fetch_first(self.con, "SELECT run_id, name FROM runs WHERE source_dir = ?", [source_dir])

    def drop_if_empty(self, run_id: int) -> None:
        """Delete a run that holds no file (one whose only file just failed), so failures create no run."""
        if fetch_first(self.con, "SELECT 1 FROM files WHERE run_id = ? LIMIT 1", [run_id]):
            return
        self.con.execute("DELETE FROM runs WHERE run_id = ?", [run_id])
        self._cache = {key: value for key, value in self._cache.items() if value[0] != run_id}

    def _find_or_create(self, name: str, source_dir: str, framework: str | None, explicit: bool) -> tuple[int, str]:
        con = self.con
        if explicit:
            row = fetch_first(con, "SELECT run_id, name FROM runs WHERE name = ?", [name])
        else:
            row = fetch_first(con, "SELECT run_id, name FROM runs WHERE source_dir = ?", [source_dir])
        if row:
            if self.task:
                con.execute("UPDATE runs SET task = ? WHERE run_id = ?", [self.task, row[0]])
            return row[0], row[1]
        unique = name
        suffix = Path(source_dir).name
        attempt = 1
        while con.execute("SELECT count(*) FROM runs WHERE name = ?", [unique]).fetchall()[0][0]:
            attempt += 1
            unique = f"{name}-{suffix}" if attempt == 2 and suffix != name else f"{name}-{attempt}"
        run_id = con.execute("SELECT nextval('run_id_seq')").fetchall()[0][0]
        con.execute(
            "INSERT INTO runs (run_id, name, framework, task, source_dir, meta) VALUES (?, ?, ?, ?, ?, ?)",
            [run_id, unique, framework, self.task, source_dir, "{}"],
        )
        return run_id, unique


def claim_run_framework(con: duckdb.DuckDBPyConnection, run_id: int, framework: str | None) -> None:
    """Set a run's framework from a file's content (a wandb or TensorBoard log whose keys name verl or
    OpenRLHF) unless a file of a training framework has already set it."""
    if framework:
        con.execute("UPDATE runs SET framework = ? WHERE run_id = ?"
                    " AND (framework IS NULL OR framework IN ('wandb', 'tensorboard'))", [framework, run_id])


# Run facts each file counts on its own, of which the run's is the largest any of its files gave.
LARGEST_OVER_FILES = frozenset({"dp_ranks_seen"})


def fold_meta(merged: dict, meta: dict) -> dict:
    """`merged` with a file's run metadata folded in: a value overwrites, a null never erases a value,
    and a fact of LARGEST_OVER_FILES keeps the largest value (the same whatever order files are read in)."""
    for key, value in meta.items():
        if value is None:
            continue
        if key in LARGEST_OVER_FILES and isinstance(merged.get(key), (int, float)) and isinstance(value, (int, float)):
            value = max(merged[key], value)
        merged[key] = value
    return merged


# The order a run's files' facts are folded in (`merge_run_meta`), a function of their paths alone (not
# of when each was read), so that a store grown by many ingests holds the facts one ingest of the same
# files gives: by path, a rotated log (`train.log.1`, `train.log.2.gz`: logrotate's and Python's
# RotatingFileHandler's names) before the log it was rotated from, the higher number (older) first.
# Over `file_run_meta m LEFT JOIN files f`; rows of no file (kept from before the table) come first, a
# file whose `files` row is not written yet (a store file giving several runs) last.
_ROTATION = r"\.([0-9]+)(\.(gz|bz2|xz|zst))?$"
FOLD_ORDER = (f"m.file_id IS NOT NULL, f.path IS NULL, regexp_replace(f.path, '{_ROTATION}', ''),"
              f" -coalesce(TRY_CAST(regexp_extract(f.path, '{_ROTATION}', 1) AS DOUBLE), 0), f.path, m.file_id")


def folds_before_another(con: duckdb.DuckDBPyConnection, run_id: int, file_ids: list[int]) -> bool:
    """Whether a file of the run other than `file_ids` comes after the first of them in FOLD_ORDER:
    the new files' facts then cannot simply be folded in last."""
    row = fetch_first(con, f"""
        WITH ordered AS (
            SELECT m.file_id, row_number() OVER (ORDER BY {FOLD_ORDER}) AS place
            FROM file_run_meta m LEFT JOIN files f USING (file_id) WHERE m.run_id = ?)
        SELECT count(*) FROM ordered
        WHERE file_id NOT IN (SELECT unnest(?::BIGINT[]))
          AND place > (SELECT min(place) FROM ordered WHERE file_id IN (SELECT unnest(?::BIGINT[])))""",
                      [run_id, file_ids, file_ids])
    return bool(row and row[0])


# Run facts decided over every row the run holds (`step_timers.step_time_inclusion`), not over one
# file's: a file that gives them (a verl log) holds the run's decision as it stands after the run's
# latest change (`share_run_wide_facts`), so what each file's row says does not depend on which of the
# run's files were stored when that file was read.
RUN_WIDE_FACTS = frozenset(NULL_MEANS_CANNOT_TELL)


def share_run_wide_facts(con: duckdb.DuckDBPyConnection, run_id: int) -> dict:
    """The run's RUN_WIDE_FACTS decided anew over its stored rows, written into the `file_run_meta` row
    and the kept `resume_state` meta of every file of the run that gives them; {} when none does.

    For each file f of the run whose row holds a key k of RUN_WIDE_FACTS:
    row(f)[k] = resume_state(f).meta[k] = step_time_inclusion(run)[k] (null: cannot tell)."""
    keys = sorted(RUN_WIDE_FACTS)
    holders = con.execute(
        "SELECT m.file_id, m.meta, f.resume_state FROM file_run_meta m LEFT JOIN files f USING (file_id)"
        f" WHERE m.run_id = ? AND ({' OR '.join('contains(m.meta, ?)' for _ in keys)})",
        [run_id, *(json.dumps(key) for key in keys)]).fetchall()
    holders = [(file_id, json.loads(text), state) for file_id, text, state in holders]
    holders = [(file_id, given, state) for file_id, given, state in holders if RUN_WIDE_FACTS & given.keys()]
    if not holders:
        return {}
    decided = {key: value for key, value in step_time_inclusion(con, run_id).items() if key in RUN_WIDE_FACTS}
    rows, states = [], []
    for file_id, given, state in holders:
        shared = {**given, **{key: decided[key] for key in given.keys() & RUN_WIDE_FACTS}}
        if shared != given:
            rows.append((file_id, json.dumps(shared, sort_keys=True)))
        kept = json.loads(state) if state else None
        if kept and isinstance(kept.get("meta"), dict) and kept["meta"].keys() & RUN_WIDE_FACTS:
            meta = {**kept["meta"], **{key: decided[key] for key in kept["meta"].keys() & RUN_WIDE_FACTS}}
            if meta != kept["meta"]:
                states.append((file_id, json.dumps({**kept, "meta": meta}, sort_keys=True)))
    if rows:
        con.execute("UPDATE file_run_meta SET meta = t.meta FROM (SELECT unnest(?::BIGINT[]) AS file_id,"
                    " unnest(?::VARCHAR[]) AS meta) t WHERE file_run_meta.file_id = t.file_id AND run_id = ?",
                    [[r[0] for r in rows], [r[1] for r in rows], run_id])
    if states:
        con.execute("UPDATE files SET resume_state = t.state FROM (SELECT unnest(?::BIGINT[]) AS file_id,"
                    " unnest(?::VARCHAR[]) AS state) t WHERE files.file_id = t.file_id",
                    [[r[0] for r in states], [r[1] for r in states]])
    return decided


def merge_run_meta(con: duckdb.DuckDBPyConnection, run_id: int, framework: str | None, meta: dict,
                   file_id: int | None = None, again: bool = False, new_files: list[int] | None = None) -> None:
    """Merge a file's run metadata into its run's `meta`: the run's meta is the fold (`fold_meta`, in
    FOLD_ORDER: by path, a rotated log before the log it was rotated from) of what each of its files
    gave (`file_run_meta`), whatever order they were read in; a key of NULL_MEANS_CANNOT_TELL that
    some file left undecided is stored as null when no file decided it. A fact of RUN_WIDE_FACTS is
    the run's decision over all its rows, shared first with every file that gives it
    (`share_run_wide_facts`). The run's framework is set to `framework` if it has none.

    `meta` is all file `file_id` gives the run, kept as its row (or, from a batch, the fold of the
    rows of `new_files`, written already). New files that come last in FOLD_ORDER fold in last; when
    one comes before a file read earlier, or a file is read `again` (grown, or replaced: its earlier
    row is gone or replaced), the run's meta is folded anew from every row, so nothing its earlier
    text gave stays behind."""
    if file_id is not None:
        con.execute("DELETE FROM file_run_meta WHERE file_id = ? AND run_id = ?", [file_id, run_id])
        con.execute("INSERT INTO file_run_meta (file_id, run_id, meta) VALUES (?, ?, ?)",
                    [file_id, run_id, json.dumps(meta, sort_keys=True)])
    decided = share_run_wide_facts(con, run_id)
    current_framework, current_meta = fetch_first(con, "SELECT framework, meta FROM runs WHERE run_id = ?", [run_id])
    added = new_files if new_files is not None else ([file_id] if file_id is not None else [])
    if not again and added and folds_before_another(con, run_id, added):
        again = True
    if again:
        merged, undecided = {}, set()
        for (text,) in con.execute(f"SELECT m.meta FROM file_run_meta m LEFT JOIN files f USING (file_id)"
                                   f" WHERE m.run_id = ? ORDER BY {FOLD_ORDER}", [run_id]).fetchall():
            given = json.loads(text)
            fold_meta(merged, given)
            undecided |= {key for key, value in given.items() if value is None}
    else:
        merged = fold_meta(json.loads(current_meta or "{}"), meta)
        undecided = {key for key, value in meta.items() if value is None}
    for key in NULL_MEANS_CANNOT_TELL & undecided:
        if merged.get(key) is None:
            merged[key] = None  # undecided is stored as null; a decided value stays
    merged.update(decided)
    con.execute(
        "UPDATE runs SET framework = ?, meta = ? WHERE run_id = ?",
        [current_framework or framework, json.dumps(merged, sort_keys=True), run_id],
    )


def delete_file_rows(con: duckdb.DuckDBPyConnection, file_id: int) -> None:
    """Remove everything one file contributed to the store."""
    for table in file_owned_tables(con):
        con.execute(f"DELETE FROM {table} WHERE file_id = ?", [file_id])
    con.execute("DELETE FROM files WHERE file_id = ?", [file_id])


def _record_whole_file_rejection(
    con: duckdb.DuckDBPyConnection, run_id: int, path: Path, sha: str, size: int, lines: int, fmt: str, reason: str,
    code: ErrorCode,
) -> None:
    """Store a file that failed as a whole: all its lines count as rejected, under one error with line NULL.
    A read of it stored before is removed, and with it what that read told its run (the run's facts are
    folded again from its other files)."""
    con.execute("BEGIN TRANSACTION")
    try:
        old = fetch_first(con, "SELECT file_id FROM files WHERE run_id = ? AND path = ?", [run_id, path_text(path)])
        if old:
            delete_file_rows(con, old[0])
            merge_run_meta(con, run_id, None, {}, again=True)
        file_id = con.execute("SELECT nextval('file_id_seq')").fetchall()[0][0]
        insert_files(con, [FileRow(file_id, run_id, path_text(path), sha, size, fmt, "-", lines, 0, 0, lines, 0, 0.0)])
        con.execute("INSERT INTO ingest_errors (file_id, line_no, reason, code) VALUES (?, NULL, ?, ?)",
                    [file_id, reason, code])
        con.execute("COMMIT")
    except BaseException:
        rollback(con)
        raise


def growth_check(path: Path, size: int, sha: str, complete: int | None) -> dict:
    """What the file's next read needs to take it as grown and hash only its growth: the sha256 of its
    last block read (`block_sha`) and the hash state after its last whole 64-byte block (`sha_state`),
    when the read ended at a newline (`complete`, the bytes read); else nothing to go on from."""
    if not complete:
        return {"block_sha": None}
    return {"block_sha": block_sha(path, complete), "sha_state": state_kept_for(path, size, sha)}


def insert_rows(con: duckdb.DuckDBPyConnection, table: str, columns: list[str], rows: list[tuple]) -> None:
    """Insert many rows in one statement (each column passed as one list), typed by the table's columns."""
    names = ", ".join(columns)
    unnested = ", ".join(f"unnest(?) AS {name}" for name in columns)
    con.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM (SELECT {unnested})",
                [[row[index] for row in rows] for index in range(len(columns))])


@dataclass
class FileRow:
    """A `files` row: what the store records of one file read (its provenance, how it was read, its
    accounting `lines = stored + ignored + rejected`, and what its next read of a grown log goes on from)."""

    file_id: int
    run_id: int
    path: str
    sha256: str
    bytes: int
    format: str
    parser_version: str
    lines: int
    stored: int
    ignored: int
    rejected: int
    rows: int
    seconds: float
    format_version: str | None = None
    read_options: str | None = None
    complete_bytes: int | None = None
    resume_state: str | None = None


FILE_COLUMNS = [column.name for column in fields(FileRow)]


def insert_files(con: duckdb.DuckDBPyConnection, files: list[FileRow]) -> None:
    """Write the `files` rows of files read (one read, a batch, files rejected whole): every `files` row is
    written here, in one statement."""
    insert_rows(con, "files", FILE_COLUMNS, [astuple(row) for row in files])


def record_growth(con: duckdb.DuckDBPyConnection, grown: FileRow) -> None:
    """Add an appended read to its file's `files` row: the counts, rows and seconds of the new lines (in
    `grown`) added to the row's, the provenance and the state to go on from replaced."""
    con.execute(
        "UPDATE files SET sha256 = ?, bytes = ?, complete_bytes = ?, format_version = ?, lines = lines + ?,"
        " stored = stored + ?, ignored = ignored + ?, rejected = rejected + ?, rows = rows + ?,"
        " seconds = seconds + ?, resume_state = ?, ingested_at = current_timestamp WHERE file_id = ?",
        [grown.sha256, grown.bytes, grown.complete_bytes, grown.format_version, grown.lines, grown.stored,
         grown.ignored, grown.rejected, grown.rows, grown.seconds, grown.resume_state, grown.file_id])


@dataclass
class WholeFileFailure:
    """A file rejected as a whole, recorded once every file has been read (see `record_failures`)."""

    path: Path
    sha: str
    size: int
    lines: int
    format: str
    reason: str
    code: ErrorCode
    report: FileReport


def record_failures(con: duckdb.DuckDBPyConnection, resolver: RunResolver, failures: list[WholeFileFailure]) -> None:
    """Store each file rejected whole under its run, when that run exists (other files of it were
    stored); a failure never creates a run, so such a file is only reported."""
    for failure in failures:
        run = resolver.existing(failure.path)
        if run is None:
            failure.report.notes.append("not stored: its run holds no other file")
            continue
        _record_whole_file_rejection(con, run[0], failure.path.resolve(), failure.sha, failure.size, failure.lines,
                                     failure.format, failure.reason, failure.code)
        failure.report.run = run[1]


def reject_whole_file(path: Path, fmt: str, reason: str, code: ErrorCode, sha: str, size: int, lines: int,
                      failed_whole: list[WholeFileFailure]) -> FileReport:
    """The report of a file rejected as a whole (all its `lines` rejected); the failure is appended to
    `failed_whole`, for `record_failures` once every file is read."""
    report = FileReport(path=path_text(path), status="rejected", format=None if fmt == "unknown" else fmt,
                        bytes=size, lines=lines, rejected=lines, message=reason)
    failed_whole.append(WholeFileFailure(path, sha, size, lines, fmt, reason, code, report))
    return report


def commit_file(con, ctx: FileContext, run_id: int, framework: str | None, meta: dict | None = None,
            again: bool = False) -> None:
    """Merge the file's run facts (`meta`, by default what this read found) into its run and commit its
    transaction; `again`: the file was read before (`merge_run_meta`)."""
    merge_run_meta(con, run_id, framework, ctx.run_meta if meta is None else meta, ctx.file_id, again)
    con.execute("COMMIT")


def roll_back_file(con, ctx: FileContext) -> None:
    if ctx.in_transaction:
        rollback(con)


def fill_report(report: FileReport, ctx: FileContext, started: float) -> None:
    """Fill `report` with what the file's read accounted for."""
    report.lines, report.stored, report.ignored = ctx.lines, ctx.stored, ctx.ignored_total
    report.rejected, report.rows, report.notes = ctx.rejected, ctx.rows, list(ctx.notes)
    report.unread_records = ctx.ignored.get(UNREAD_RECORD, 0)
    report.seconds = time.perf_counter() - started
