"""Reading small step files as batches.

Consecutive small plain files of one bulk JSON-lines format (PolyTrace step files) are read as a
batch: one `read_json` over all of them and one transaction that stores every file with its own
`files` row, as if each had been loaded alone. A batch is all-or-nothing; a file with a bad line
leaves the batch and is loaded alone, and a batch that fails as a whole is loaded file by file.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import duckdb

from polytrace_cli.ingest.base import Ingester, file_owned_tables
from polytrace_cli.ingest.files import FileHashes, hash_and_count_bytes, is_compressed, path_text
from polytrace_cli.ingest.jsonl import (
    BulkJsonlIngester, create_stored_keyed, delete_records_of, few_refused, insert_typed_rows,
    load_batch_records, refused, stored_counts, strict_file_records,
)
from polytrace_cli.ingest.ledger import (
    FOLD_ORDER, FileReport, FileRow, RunResolver, fold_meta, insert_files, insert_rows, merge_run_meta,
)
from polytrace_cli.ingest.sniffing import SNIFF_BYTES, detect
from polytrace_cli.ingest.unchanged import is_unchanged, stored_files
from polytrace_cli.store.sql import fetch_first, rollback

# A batch holds files of at most BATCH_FILE_MAX_BYTES each, up to BATCH_MAX_FILES files or
# BATCH_MAX_BYTES in all; a larger file is read alone (one file already makes a bulk read).
BATCH_FILE_MAX_BYTES = 4 << 20
BATCH_MAX_FILES = 10_000
BATCH_MAX_BYTES = 128 << 20
# A batch whose files hold this many bytes on average is read as JSON records, fewer as text lines.
BATCH_JSON_MIN_MEAN_BYTES = 64 << 10
# The text of a file this small is kept from sniffing for the batch read (DuckDB need not open it).
BATCH_TEXT_KEEP_BYTES = 64 << 10
# A batch of fewer bytes is decoded strictly before DuckDB reads it, not beside: the read is then
# skipped when the decoder refuses too many of its files, which costs more than the overlap saves.
BATCH_OVERLAP_MIN_BYTES = 8 << 20
# A batch whose read fails (a line that does not parse, in a file unknown) is split in halves
# until this many files remain, which are then read one by one.
BATCH_SPLIT_MIN_FILES = 4


@dataclass
class BatchMember:
    """A file that may be read in a batch: plain, small, UTF-8-named, of a bulk JSON-lines format."""

    path: Path
    explicit: bool
    ingester: BulkJsonlIngester
    size: int
    text: str | None = None  # a small file's text, kept from sniffing and hashing for the batch read
    run_id: int = 0
    run: str = ""
    file_id: int = 0
    existing: int | None = None


def batch_member(path: Path, explicit: bool, forced: Ingester | None, hashes: FileHashes) -> BatchMember | None:
    if is_compressed(path) or path_text(path) != str(path):
        return None
    try:
        size = path.stat().st_size
        if not 0 < size <= BATCH_FILE_MAX_BYTES:
            return None
        with open(path, "rb") as handle:
            head = handle.read(SNIFF_BYTES)
            ingester = forced or detect(path, head)
            if not isinstance(ingester, BulkJsonlIngester):
                return None
            if size <= BATCH_TEXT_KEEP_BYTES and len(head) == SNIFF_BYTES:
                # small: read once for sniffing, hashing and counting lines (a shorter head ended the file)
                head += handle.read()
    except OSError:
        return None  # loaded alone, which reports why it cannot be read
    resolved = path.resolve() if explicit else path  # `walk` resolves the files it finds in folders
    if size > BATCH_TEXT_KEEP_BYTES:
        # The hashing thread reads and hashes it while this one sniffs the next file.
        hashes.of_resolved(resolved)
        return BatchMember(resolved, explicit, ingester, size)
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return None  # loaded alone, which names the line that is not UTF-8 text
    if "\0" in text:
        return None
    hashes.known(resolved, hash_and_count_bytes(head))  # handing a tiny file to the thread costs more
    return BatchMember(resolved, explicit, ingester, len(head), text)


def ingest_batch(con: duckdb.DuckDBPyConnection, members: list[BatchMember], resolver: RunResolver,
                  hashes: FileHashes, done: Callable[[FileReport], None],
                  load_alone: Callable[[BatchMember], None]) -> None:
    """Store `members` in one read and one transaction; files it cannot take are loaded alone.

    Unchanged files are reported as such first. A file with a bad line, or every file of a batch
    whose transaction fails, is loaded alone; a batch whose read fails is split in halves. A format
    whose records are rows of one table (`row_table`) is read straight into it (`_store_batch_direct`);
    when that read fails beside the strict decoder (a line that is not JSON), the files the decoder
    accepted are read so again, unless more than a quarter were refused.
    """
    if len(members) == 1:
        load_alone(members[0])
        return
    started = time.perf_counter()
    ingester = members[0].ingester
    for member in members:
        member.run_id, member.run = resolver.resolve(member.path, ingester.framework, resolved=True)
    changed, unchanged = _drop_unchanged(con, members, hashes)
    for member in unchanged:
        done(FileReport(path=path_text(member.path), status="unchanged", format=ingester.name, run=member.run,
                        bytes=member.size))
    if not changed:
        return
    batch_bytes = sum(m.size for m in changed)
    whole_json = batch_bytes >= BATCH_JSON_MIN_MEAN_BYTES * len(changed)
    paths = [str(m.path) for m in changed]
    with ThreadPoolExecutor(max_workers=1) as decoding:
        if not whole_json:
            strict = None
        elif batch_bytes < BATCH_OVERLAP_MIN_BYTES:
            strict = _strict_counts([m.path for m in changed], ingester.spec)
        else:
            # The strict decoder (which holds the interpreter) runs while DuckDB reads the files (which does not).
            strict = decoding.submit(_strict_counts, [m.path for m in changed], ingester.spec).result
        if whole_json and ingester.row_table is not None:
            try:
                stored, tried = None, False
                if callable(strict):
                    stored, tried = _store_batch_direct(con, changed, ingester, hashes, strict, started), True
                    strict = strict()
                left_out = set(refused(paths, strict))
                accepted = [m for m in changed if str(m.path) not in left_out]
                if stored is None and few_refused(paths, strict) and len(accepted) > 1 and not (tried and not left_out):
                    # The files the decoder refused (a line that is not JSON fails the typed read) are read alone.
                    stored = _store_batch_direct(con, accepted, ingester, hashes, strict, started)
                    stored = None if stored is None else (stored[0], stored[1] | left_out)
            except Exception:
                stored = {}, set(paths)  # every file is loaded alone
            except BaseException:
                _drop_runs_left_empty(resolver, members)
                raise
            if stored is not None:
                reports, bad = stored
                for member in changed:
                    if str(member.path) in bad:
                        load_alone(member)
                    else:
                        done(reports[member.file_id])
                return
        try:
            read = load_batch_records(con, paths, ingester.spec, ingester.required,
                                      ingester.checks, whole_json=whole_json,
                                      texts={str(m.path): m.text for m in changed if m.text is not None},
                                      strict_counts=strict)
        except duckdb.Error:
            read = None  # handled like a read that fails: the batch is split
    if read is None:
        if len(changed) <= BATCH_SPLIT_MIN_FILES:
            for member in changed:
                load_alone(member)
            return
        half = len(changed) // 2
        ingest_batch(con, changed[:half], resolver, hashes, done, load_alone)
        ingest_batch(con, changed[half:], resolver, hashes, done, load_alone)
        return
    bad, line_counts = read
    uncounted = _uncounted(changed, bad, line_counts, hashes)
    if uncounted:
        delete_records_of(con, uncounted)
        bad |= uncounted
    clean = [m for m in changed if str(m.path) not in bad]
    try:
        reports = _store_batch(con, clean, ingester, hashes, line_counts, started) if len(clean) > 1 else None
    except Exception:
        reports = None
    except BaseException:
        _drop_runs_left_empty(resolver, members)
        raise
    if reports is None:
        for member in changed:
            load_alone(member)
        return
    for member in changed:
        if str(member.path) in bad:
            load_alone(member)
        else:
            done(reports[member.file_id])


def _drop_runs_left_empty(resolver: RunResolver, members: list[BatchMember]) -> None:
    """The command stops (interrupt, full disk): leave no run that only this batch created."""
    for run_id in {m.run_id for m in members}:
        try:
            resolver.drop_if_empty(run_id)
        except Exception:
            pass


def _uncounted(members: list[BatchMember], bad: set[str], line_counts: dict[str, tuple[int, int]],
               hashes: FileHashes) -> set[str]:
    """The files, not already `bad`, whose lines as read (`line_counts`: lines, blank lines) are not
    the lines counted by hashing. Read as JSON records, a file's blank lines were skipped unseen: they
    are counted here (and set in `line_counts`), and a file whose lines still do not add up is read alone."""
    uncounted = set()
    for member in members:
        name = str(member.path)
        if name in bad:
            continue  # read alone, which hashes it then
        lines = hashes.result(member.path)[2]
        read_lines, blank = line_counts.get(name, (0, 0))
        if read_lines == lines:
            continue
        blank = _blank_lines(member.path)
        if blank is not None and read_lines + blank == lines:
            line_counts[name] = (lines, blank)
        else:
            uncounted.add(name)
    return uncounted


def _strict_counts(paths: list[Path], spec: dict) -> dict[str, int | None]:
    """`strict_file_records` of each file, by its name as DuckDB reports it."""
    return {str(path): strict_file_records(path, spec) for path in paths}


def _blank_lines(path: Path) -> int | None:
    """How many lines of a small file hold only white space, or None when it cannot be read again."""
    try:
        with open(path, "rb") as handle:
            return sum(1 for line in handle if not line.strip())
    except OSError:
        return None


def _drop_unchanged(con: duckdb.DuckDBPyConnection, members: list[BatchMember],
                    hashes: FileHashes) -> tuple[list[BatchMember], list[BatchMember]]:
    """(changed or new, unchanged) members: a file the store holds read the same way (format, parser
    version, options, size) with the same sha256 is unchanged and is not read again. Notes each
    member's previous `file_id`, if any."""
    known = stored_files(con, [(m.run_id, path_text(m.path)) for m in members])
    changed, unchanged = [], []
    for member in members:
        stored = known.get((member.run_id, path_text(member.path)))
        member.existing = stored.file_id if stored else None
        same = is_unchanged(stored, member.ingester, member.size, lambda m=member: hashes.result(m.path)[0])
        (unchanged if same else changed).append(member)
    return changed, unchanged


def _store_batch(con: duckdb.DuckDBPyConnection, members: list[BatchMember], ingester: BulkJsonlIngester,
                 hashes: FileHashes, line_counts: dict[str, tuple[int, int]], started: float) -> dict[int, FileReport]:
    """Write every member's rows, `files` row, ignored lines and run metadata in one transaction.

    `records` holds the members' records with their `file_index` (`record_files` names them); `line_counts` each file's lines
    and blank lines as the batch read them, which must agree with the lines counted by hashing
    and the records stored (else nothing is written and the files are loaded alone). A file's
    `seconds` is its share, by bytes, of the batch's time.
    """
    _number_files(con, members, ingester)
    con.execute("CREATE OR REPLACE TEMP TABLE batch_keys AS SELECT r.file_index, f.file_id, f.run_id, f.file_rank"
                " FROM record_files r JOIN batch_files f USING (filename)")
    con.execute("CREATE OR REPLACE TEMP VIEW keyed AS SELECT f.file_id, f.run_id, f.file_rank,"
                " r.* EXCLUDE (file_index) FROM records r JOIN batch_keys f USING (file_index)")
    stored = dict(con.execute("SELECT f.file_id, count(*) FROM records r JOIN batch_keys f USING (file_index)"
                              " GROUP BY f.file_id").fetchall())
    with _batch_transaction(con, ("batch_keys", "batch_files", "records", "record_files")):
        _delete_replaced(con, members)
        ingester.write(con)
        reports = _record_batch_files(con, members, ingester, hashes, line_counts, stored, started)
        con.execute("COMMIT")
    return reports


@contextmanager
def _batch_transaction(con: duckdb.DuckDBPyConnection, temp_tables: tuple[str, ...]) -> Iterator[None]:
    """A batch's transaction, begun here and ended by the caller (COMMIT or `rollback`), or rolled back
    here when the caller raises; the view `keyed` and `temp_tables` are dropped after it either way."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield
    except BaseException:
        rollback(con)
        raise
    finally:
        con.execute("DROP VIEW IF EXISTS keyed")
        for table in temp_tables:
            con.execute(f"DROP TABLE IF EXISTS {table}")


def _number_files(con: duckdb.DuckDBPyConnection, members: list[BatchMember], ingester: BulkJsonlIngester) -> None:
    """Give each member a new `file_id`; temp table `batch_files`: each member's filename (as DuckDB
    reports it), its `file_index` (its position in `members`), file_id, run_id and file_rank."""
    ids = fetch_first(con, "SELECT list(id ORDER BY id) FROM (SELECT nextval('file_id_seq') AS id FROM range(?))",
                      [len(members)])[0]
    for member, file_id in zip(members, ids):
        member.file_id = file_id
    con.execute(
        "CREATE OR REPLACE TEMP TABLE batch_files AS SELECT unnest(?::VARCHAR[]) AS filename,"
        " (unnest(range(?)))::UBIGINT AS file_index, unnest(?::BIGINT[]) AS file_id, unnest(?::BIGINT[]) AS run_id,"
        " unnest(?::INTEGER[]) AS file_rank",
        [[str(m.path) for m in members], len(members), [m.file_id for m in members], [m.run_id for m in members],
         [ingester.file_rank(m.path) for m in members]])


def _delete_replaced(con: duckdb.DuckDBPyConnection, members: list[BatchMember]) -> None:
    """Remove what the stored earlier versions of `members` contributed (inside the batch's transaction)."""
    replaced = [m.existing for m in members if m.existing is not None]
    if replaced:
        for table in [*file_owned_tables(con), "files"]:
            con.execute(f"DELETE FROM {table} WHERE file_id IN (SELECT unnest(?))", [replaced])


def _record_batch_files(con: duckdb.DuckDBPyConnection, members: list[BatchMember], ingester: BulkJsonlIngester,
                        hashes: FileHashes, line_counts: dict[str, tuple[int, int]], stored: dict[int, int],
                        started: float) -> dict[int, FileReport]:
    """Inside the batch's transaction, once the members' rows are written (`keyed` shows them):
    every member's `files` row, ignored lines and run metadata; the members' reports by file_id.
    Raises when a member's lines counted by hashing are not its lines read, or not its records
    (`stored`, by file_id) and blank lines."""
    hashed = {m.file_id: hashes.result(m.path) for m in members}
    total_bytes = sum(m.size for m in members)
    summaries = ingester.summaries(con)
    seconds = time.perf_counter() - started
    files, ignored, reports, metas, file_metas = [], [], {}, {}, []
    for member in members:
        sha, size, lines = hashed[member.file_id]
        records = stored.get(member.file_id, 0)
        read_lines, blank = line_counts.get(str(member.path), (0, 0))
        if (lines, lines) != (read_lines, records + blank) or size != member.size:
            raise RuntimeError(f"{ingester.name} lost lines in {member.path}: {lines} counted, {read_lines} read,"
                               f" {records} stored, {blank} blank")
        rows, meta = summaries.get(member.file_id, (0, dict(ingester.meta_without_records)))
        share = seconds * size / total_bytes if total_bytes else 0.0
        files.append(FileRow(member.file_id, member.run_id, path_text(member.path), sha, size, ingester.name,
                             ingester.version, lines, records, blank, 0, rows, share,
                             read_options=ingester.read_options()))
        if blank:
            ignored.append((member.file_id, "blank line", blank))
        metas[member.file_id] = meta
        file_metas.append((member.file_id, member.run_id, json.dumps(meta, sort_keys=True)))
        reports[member.file_id] = FileReport(
            path=path_text(member.path), status="replaced" if member.existing is not None else "ingested",
            format=ingester.name, run=member.run, bytes=size, lines=lines, stored=records, ignored=blank,
            rows=rows, seconds=share)
    insert_files(con, files)
    if ignored:
        insert_rows(con, "ignored_lines", ["file_id", "rule", "lines"], ignored)
    insert_rows(con, "file_run_meta", ["file_id", "run_id", "meta"], file_metas)
    again = {m.run_id for m in members if m.existing is not None}
    # Per run, its members' facts folded in the order every file's are (`ledger.FOLD_ORDER`).
    ordered = con.execute(f"SELECT m.run_id, list(m.file_id ORDER BY {FOLD_ORDER}) FROM file_run_meta m"
                          " LEFT JOIN files f USING (file_id) WHERE m.file_id IN (SELECT unnest(?::BIGINT[]))"
                          " GROUP BY m.run_id ORDER BY m.run_id", [list(metas)]).fetchall()
    for run_id, file_ids in ordered:
        meta: dict = {}
        for file_id in file_ids:
            fold_meta(meta, metas[file_id])
        merge_run_meta(con, run_id, ingester.framework, meta, again=run_id in again, new_files=file_ids)
    return reports


def _store_batch_direct(con: duckdb.DuckDBPyConnection, members: list[BatchMember], ingester: BulkJsonlIngester,
                        hashes: FileHashes, strict: Callable[[], dict] | dict, started: float,
                        ) -> tuple[dict[int, FileReport], set[str]] | None:
    """Read the members straight into the ingester's `row_table` and store them in one transaction,
    as `_store_batch` stores them from `records`; (reports by file_id, the files left to be read
    alone), or None, with nothing written, when the batch must be read the other way
    (`load_batch_records`): DuckDB cannot read it typed, or the strict decoder (`strict`, its counts
    or a call that waits for them) refused more than a quarter of its files.

    The rows of a file are kept only when the strict decoder accepted every value of it, its rows
    are as many as the records the decoder counted (a record missing a required field is not
    inserted), no row fails one of the format's checks, and its lines counted by hashing are its
    records and blank lines; the other files' rows are deleted again before the commit and those
    files are left to be read alone, which names each bad line.
    """
    paths = [str(m.path) for m in members]
    _number_files(con, members, ingester)
    with _batch_transaction(con, ("batch_files",)):
        try:
            insert_typed_rows(con, paths, ingester)
        except duckdb.Error:
            rollback(con)
            return None
        known = strict if isinstance(strict, dict) else strict()
        if not few_refused(paths, known):
            rollback(con)
            return None
        create_stored_keyed(con, ingester)
        counts = stored_counts(con, ingester.checks)
        bad = set(refused(paths, known))
        for member in members:
            records, failing = counts.get(member.file_id, (0, 0))
            if failing or records != known.get(str(member.path)):
                bad.add(str(member.path))
        line_counts = {str(m.path): (counts.get(m.file_id, (0, 0))[0], 0) for m in members}
        bad |= _uncounted(members, bad, line_counts, hashes)
        clean = [m for m in members if str(m.path) not in bad]
        if bad:
            con.execute(f"DELETE FROM {ingester.row_table} WHERE file_id IN (SELECT unnest(?::BIGINT[]))",
                        [[m.file_id for m in members if str(m.path) in bad]])
        if not clean:
            rollback(con)
            return {}, bad
        _delete_replaced(con, clean)
        reports = _record_batch_files(con, clean, ingester, hashes, line_counts,
                                      {m.file_id: counts[m.file_id][0] for m in clean if m.file_id in counts}, started)
        con.execute("COMMIT")
    return reports, bad
