"""What every ingester is given and must report.

An ingester reads one file into the store through a `FileContext`. It must account for every line
it read: each is stored (produced rows), ignored by a named rule, or rejected into
`ingest_errors` with its line number and reason. The runner checks
`lines == stored + ignored + rejected` after every file.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import duckdb

from polytrace_cli.errors import ErrorCode, PolytraceError

RAW_EXCERPT_CHARS = 300

# The `ingest_errors.code` vocabulary: what kind of problem a quarantined line (or file) has.
# Steps are stored as INTEGER (samples, turns, rank timings); a step outside this range is rejected.
STEP_MIN, STEP_MAX = -(2**31), 2**31 - 1


def step_sql(text: str) -> str:
    """SQL for the step written in the text expression `text`: an INTEGER when the text is a whole
    number (`3`, `3.0`, `3e0`) within STEP_MIN..STEP_MAX, else NULL (never rounded or wrapped)."""
    number = f"TRY_CAST(trim({text}) AS DOUBLE)"
    return (f"(CASE WHEN {number} = floor({number}) AND {number} BETWEEN {STEP_MIN} AND {STEP_MAX}"
            f" THEN CAST({number} AS INTEGER) END)")


def step_problem_sql(text: str) -> str:
    """SQL for the ingest error code of a step text that `step_sql` turns into NULL."""
    number = f"TRY_CAST(trim({text}) AS DOUBLE)"
    return f"(CASE WHEN {number} = floor({number}) THEN '{ErrorCode.OUT_OF_RANGE}' ELSE '{ErrorCode.TYPE_ERROR}' END)"

def file_owned_tables(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Tables whose rows belong to one file, read from the catalog: every base table of the store
    with a `file_id` column except `files` itself. Re-ingesting a changed file replaces exactly
    their rows of that file."""
    rows = con.execute(
        """
        SELECT c.table_name FROM duckdb_columns() c
        JOIN duckdb_tables() t USING (database_name, schema_name, table_name)
        WHERE c.column_name = 'file_id' AND c.table_name <> 'files'
          AND c.database_name = current_database() AND c.schema_name = current_schema()
        ORDER BY c.table_name
        """
    ).fetchall()
    return [name for (name,) in rows]


# The ignore rule of a console line that is not a metric line although it looks like one (the
# grammar's `record_hint`): counted apart so that `ingest --strict` fails on it.
UNREAD_RECORD = "looks like a metric record, not read"


@dataclass
class FileContext:
    """One file being ingested inside its own transaction."""

    con: duckdb.DuckDBPyConnection
    path: Path
    run_id: int
    file_id: int
    run_name: str
    head: bytes = b""
    line_count: int | Future = 0  # newline-separated lines, counted while hashing (maybe still running)
    lines: int = 0
    stored: int = 0
    rejected: int = 0
    rows: int = 0
    ignored: Counter = field(default_factory=Counter)
    format_version: str | None = None
    run_meta: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    _errors: list[tuple] = field(default_factory=list)
    on_begin: Callable[[], None] | None = None
    in_transaction: bool = False
    # An appended read (`Ingester.appendable`): `path` holds only the lines after the first
    # `line_offset` lines of the file, and `resume` is the state the previous read left; a reader
    # that supports appending sets `resume_state` to what the next appended read will need.
    line_offset: int = 0
    resume: dict | None = None
    resume_state: dict | None = None
    # The input file itself, where `path` is a rewritten or decompressed copy of it (in a temporary
    # folder): formats that read a file's neighbours (an MLflow run folder) look beside this one.
    input_path: Path | None = None

    @property
    def location(self) -> Path:
        """Where the input file lies: `input_path` when `path` is a copy, else `path`."""
        return self.input_path or self.path

    @property
    def text_lines(self) -> int:
        """Newline-separated lines in the file (a last line without newline counts).

        Counted by the hashing pass, which may run beside the parse; asking waits for it.
        """
        if isinstance(self.line_count, Future):
            self.line_count = self.line_count.result()[2]
        return self.line_count

    def begin_writes(self) -> None:
        """Open the file's transaction (once) before its first write.

        Parsing into temporary tables happens before this, outside the transaction, so that a
        failed bulk parse (which DuckDB answers by aborting the transaction) can fall back to the
        line-by-line path. Everything written to the store happens after it, atomically.
        """
        if not self.in_transaction:
            self.con.execute("BEGIN TRANSACTION")
            self.in_transaction = True
            if self.on_begin:
                self.on_begin()

    def reject(self, line_no: int | None, reason: str, raw: str | bytes | None = None, *, code: ErrorCode) -> None:
        """Quarantine one line (or the whole file, with line_no None) with a reason and an error code
        (an `ErrorCode`)."""
        if code not in ErrorCode.__members__.values():
            raise ValueError(f"unknown ingest error code {code!r}")
        if isinstance(raw, bytes):
            raw = raw.decode("utf-8", errors="replace")
        excerpt = None if raw is None else raw[:RAW_EXCERPT_CHARS]
        self._errors.append((self.file_id, line_no, reason, excerpt, code))
        self.rejected += 1

    def ignore(self, rule: str, count: int = 1) -> None:
        """Count lines skipped on purpose under a named rule (e.g. 'blank', 'tqdm')."""
        if count:
            self.ignored[rule] += count

    def note(self, message: str) -> None:
        """A remark for the user about this file (e.g. 'zero steps: crashed before step 1')."""
        self.notes.append(message)

    def insert(self, sql: str, params: list | None = None) -> int:
        """Run an INSERT ... SELECT inside the file's transaction and count the rows it wrote."""
        self.begin_writes()
        written = self.con.execute(sql, params or []).fetchall()[0][0]
        self.rows += written
        return written

    def flush(self, ignored_before: Mapping[str, int] | None = None) -> None:
        """Write the buffered rejections and ignore counts, one row per rule in rule order.
        `ignored_before`: the counts per rule the file's earlier lines left (an appended read, whose
        caller deleted their rows), written summed with this read's."""
        self.begin_writes()
        if self._errors:
            self.con.executemany(
                "INSERT INTO ingest_errors (file_id, line_no, reason, raw, code) VALUES (?, ?, ?, ?, ?)",
                self._errors,
            )
            self._errors.clear()
        counts = self.ignored + Counter(ignored_before or {})
        if counts:
            rules = sorted(counts)
            self.con.execute(
                "INSERT INTO ignored_lines (file_id, rule, lines) SELECT ?, unnest(?::VARCHAR[]), unnest(?::BIGINT[])",
                [self.file_id, rules, [counts[rule] for rule in rules]],
            )

    @property
    def ignored_total(self) -> int:
        return sum(self.ignored.values())


# The tokenizer that counts text lengths (rollout dumps) in the current ingest, None for characters / 4.
# Set for the length of one ingest by `counting_tokens_with`, never for the process.
_TOKENIZER: ContextVar[object | None] = ContextVar("polytrace_tokenizer", default=None)


def load_tokenizer(name_or_path: str) -> object:
    """A locally available Hugging Face tokenizer (a folder, or a name in the local cache): nothing is
    downloaded. A missing `transformers` package or tokenizer is a one-line error."""
    try:
        from transformers import AutoTokenizer
    except ImportError as error:
        raise PolytraceError("--tokenizer needs the `transformers` package (pip install transformers)") from error
    try:
        return AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
    except Exception as error:  # transformers raises OSError/ValueError variants
        raise PolytraceError(f"cannot load tokenizer {name_or_path!r} from local files: {error}") from error


@contextmanager
def counting_tokens_with(tokenizer: object | None) -> Iterator[None]:
    """Within the block, formats that estimate lengths from text count `tokenizer`'s tokens (called as a
    Hugging Face tokenizer: `tokenizer(texts, add_special_tokens=False)["input_ids"]`); None: characters / 4."""
    token = _TOKENIZER.set(tokenizer)
    try:
        yield
    finally:
        _TOKENIZER.reset(token)


def current_tokenizer() -> object | None:
    """The tokenizer set by the enclosing `counting_tokens_with`, or None."""
    return _TOKENIZER.get()


class Ingester:
    """One input format: how to recognise it and how to load it.

    Parse into temporary tables freely; write to the store only through `FileContext.insert` (or
    after calling `begin_writes`), so that a file's rows land in one transaction.

    Subclasses set `name` (the --format value), `version` (bumped when parsing changes, stored
    in `files.parser_version`), `framework` (the run's framework when this file creates it) and
    implement `sniff` and `load`. A format whose logs name step metrics declares what they mean:
    `metric_aliases` maps a logged key to a canonical name (a column of the `steps` view, such as
    `gen_s`, or a name analyses look up; a mapping, or (key, canonical) pairs), and `validation_prefixes`
    are the key prefixes of metrics logged by validation only. The names are the format's own: the
    store's `metric_aliases` rows are keyed by (format, key), and a pair of one of its files takes the
    name its format gives the key, else the one every format naming the key agrees on
    (`named_step_metrics`). The rows and the views are generated from every registered format's
    declarations when a store is opened (`store/catalog.py`).
    """

    name: ClassVar[str]
    version: ClassVar[str] = "1"
    # True when `load` can read only the lines appended to a file since its last read (see FileContext.resume).
    appendable: ClassVar[bool] = False
    framework: ClassVar[str | None] = None
    description: ClassVar[str] = ""
    metric_aliases: ClassVar[Mapping[str, str]] = {}
    validation_prefixes: ClassVar[tuple[str, ...]] = ()

    def sniff(self, path: Path, head: bytes) -> bool:
        """True when the file at `path`, whose first bytes are `head`, is of this format."""
        raise NotImplementedError

    def load(self, ctx: FileContext) -> None:
        """Read ctx.path into the store and account for every line on ctx."""
        raise NotImplementedError

    def read_options(self) -> str:
        """The options in force that change the rows this ingester writes, as text ('' when none).

        Part of the key that lets an unchanged file be skipped on re-ingest, with the format name
        and `version`.
        """
        return ""


class JsonlTraceIngester(Ingester):
    """A JSON-lines trace recognised by its file name, or by marker keys in its first line(s)."""

    file_name: ClassVar["re.Pattern[str]"]
    content_markers: ClassVar[tuple[bytes, ...]] = ()

    def sniff(self, path: Path, head: bytes) -> bool:
        if self.file_name.match(path.name):
            return True
        window = head[:8000]
        return bool(self.content_markers) and window.lstrip().startswith(b"{") and all(
            marker in window for marker in self.content_markers
        )
