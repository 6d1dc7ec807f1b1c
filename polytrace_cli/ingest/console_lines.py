"""Cleaning and parsing lines of a training job's console output (stdout captured to a file).

Console logs of RL trainers carry the same wrapping whatever the framework: ANSI colour codes,
carriage returns from progress bars, a Ray actor prefix such as `(TaskRunner pid=14640) ` or
`(WorkerDict pid=7, ip=10.0.0.1) `, and Ray's ` [repeated 3x across cluster]` suffix. This module
removes that wrapping and turns printed scalars back into numbers, twice over:

- as polars expressions (`clean_expr`/`clean_lines`, `unwrap_series`, `scalar_columns`,
  `noise_rule_expr`) for the bulk path, which runs over every line of a file at once;
- as Python functions (`clean_line`, `parse_scalar`, `classify_noise`) with the same results, for
  the few lines the bulk path cannot handle and must name one by one.

Both versions must agree; `tests/test_ingest_verl_console.py` checks them against each other.
"""

from __future__ import annotations

import re
from typing import TypeVar

from polytrace_cli.lazy import polars as pl

FrameT = TypeVar("FrameT", "pl.DataFrame", "pl.LazyFrame")

# ANSI CSI sequences (colours, cursor moves) and OSC sequences (window titles).
ANSI_PATTERN = r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07"
# `(TaskRunner pid=14640) `, `(main_task pid=3)`, `(WorkerDict pid=7, ip=10.0.0.1)`, possibly repeated.
RAY_PREFIX_PATTERN = r"^\s*(?:\([A-Za-z_][\w.\-]* pid=\d+(?:, ip=[0-9A-Fa-f.:]+)?\)\s*)+"
RAY_REPEAT_PATTERN = r"\s*\[repeated \d+x across cluster\]\s*$"

_ANSI = re.compile(ANSI_PATTERN)
_RAY_PREFIX = re.compile(RAY_PREFIX_PATTERN)
_RAY_REPEAT = re.compile(RAY_REPEAT_PATTERN)

# numpy 2 reprs `np.float64(0.5)`, `np.int64(3)`, `np.True_`, and torch `tensor(0.5, device='cuda:0')`.
# A numpy wrapper is an ASCII type name, so its '(' sits at the same byte and character offset.
NUMPY_WRAPPED_PATTERN = r"^(?:np|numpy)\.[A-Za-z0-9_]+\(.*\)$"
TENSOR_WRAPPED_PATTERN = r"^tensor\(([^,()]*)(?:,.*)?\)$"
_NUMPY_WRAPPED = re.compile(NUMPY_WRAPPED_PATTERN, re.DOTALL)
_TENSOR_WRAPPED = re.compile(TENSOR_WRAPPED_PATTERN)
_BOOLEANS = {"true": 1.0, "false": 0.0, "np.true_": 1.0, "np.false_": 0.0}
# ASCII digits only ([0-9], not \d): polars' float cast reads no other digits, so both paths leave them as text.
_NUMBER = re.compile(r"^[+-]?(?:[0-9]+\.?[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|nan|inf|infinity)$",
                     re.IGNORECASE)

# What Python's str.strip() removes: Unicode White_Space plus the separators \x1c-\x1f, which
# polars' strip_chars() keeps.
_PYTHON_WHITESPACE = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006" \
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"

# Noise rules for lines that are not metrics, in the order they are tried. Each is (rule, regex
# over the cleaned line). The polars and Python classifiers both use this table.
# The noise rule of a line saying the job loaded a checkpoint to resume from (verl's `Load from
# checkpoint folder:`, OpenRLHF's `Loaded the checkpoint:`): the next metric line starts a segment.
CHECKPOINT_LOAD = "checkpoint-load"
NOISE_RULES: tuple[tuple[str, str], ...] = (
    ("blank", r"^\s*$"),
    (CHECKPOINT_LOAD, r"^Load from checkpoint folder:"),
    ("tqdm", r"\d+%\|.*\||\d+/\d+ \[[\d:]+<[\d:?]+"),
    ("traceback", r"^Traceback \(most recent call last\)|^\s+File \"|^\s+\^+\s*$|^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt)(?::|$)"),
    ("warning", r"(?i)warn"),
    ("pprint", r"^\s*[\[{(]*'[^']*':\s|^\s*[{\[(]\s*$|^\s*[}\])]+,?\s*$"),
    ("logging", r"^\[?\d{4}-\d{2}-\d{2}[ T]\d|^(?:INFO|DEBUG|ERROR|CRITICAL|WARNING)\b|^\[\d{2}:\d{2}:\d{2}\]|^\(raylet\)"),
)
_NOISE = [(rule, re.compile(pattern)) for rule, pattern in NOISE_RULES]


# A time printed at the start of a line, after any Ray prefix: Python logging's `asctime`
# (`2025-03-01 12:00:01,123`, slime's `[2025-10-30 10:00:00]`), ISO 8601 with a zone (`kubectl logs
# --timestamps`, `docker logs -t`: `2025-03-01T12:00:01.123456789Z`). A time without a zone is UTC.
STAMP_PATTERN = (r"^\[?(?P<date>\d{4}-\d{2}-\d{2})[ T](?P<time>\d{2}:\d{2}:\d{2})(?:[.,](?P<fraction>\d{1,9}))?"
                 r"(?P<zone>Z|[+-]\d{2}:?\d{2})?\]?")
# The stamp and what a logging format prints after it before the message: a level (`INFO`, `[INFO]`),
# a source location (`train.py:401`), a separator (` - `, ` -- `, ` | `).
STAMP_PREFIX_PATTERN = (STAMP_PATTERN + r"(?:\s+(?:-{1,2}|\|))?(?:\s*[\[(]?(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)[\])]?)?"
                        r"(?:\s*[\w.\-]+\.py:\d+)?(?:\s+(?:-{1,2}|\|))?\s+")
_STAMP_PREFIX = re.compile(STAMP_PREFIX_PATTERN)


def strip_stamp(cleaned: str) -> str:
    """A cleaned line without the time printed at its start (`STAMP_PREFIX_PATTERN`) and a Ray prefix
    after it (a tool stamping every line it captures stamps the actor's prefix too)."""
    match = _STAMP_PREFIX.match(cleaned)
    return _RAY_PREFIX.sub("", cleaned[match.end():]) if match else cleaned


def strip_stamp_expr(cleaned: pl.Expr, stamp: pl.Expr) -> pl.Expr:
    """Polars expression equal to `strip_stamp`, given the line's `STAMP_PREFIX_PATTERN` match `stamp`
    (null where there is none)."""
    return pl.when(stamp.is_not_null()).then(cleaned.str.slice(stamp.str.len_chars()).str.replace(RAY_PREFIX_PATTERN, "")) \
        .otherwise(cleaned)


def stamp_seconds(stamp: pl.Expr) -> pl.Expr:
    """Seconds since the Unix epoch of a printed time (`STAMP_PATTERN`): the date and time read in its
    zone (UTC without one), plus its fraction: epoch(date time) + 0.fraction − zone offset."""
    parts = stamp.str.extract_groups(STAMP_PATTERN)
    moment = pl.concat_str([parts.struct.field("date"), pl.lit(" "), parts.struct.field("time")]).str.to_datetime(
        "%Y-%m-%d %H:%M:%S", time_unit="us", strict=False)
    fraction = pl.concat_str([pl.lit("0."), parts.struct.field("fraction")]).cast(pl.Float64).fill_null(0.0)
    zone = parts.struct.field("zone").str.replace(":", "", literal=True)
    offset = (pl.when(zone.is_null() | (zone == "Z")).then(pl.lit(0.0))
              .otherwise((zone.str.slice(1, 2).cast(pl.Float64) * 3600 + zone.str.slice(3, 2).cast(pl.Float64) * 60)
                         * pl.when(zone.str.starts_with("-")).then(-1.0).otherwise(1.0)))
    return moment.dt.epoch("us").cast(pl.Float64) / 1e6 + fraction - offset


def stamp_has_zone(stamp: pl.Expr) -> pl.Expr:
    """Whether a printed time (`STAMP_PATTERN`) names its zone."""
    return stamp.str.extract_groups(STAMP_PATTERN).struct.field("zone").is_not_null()


# A progress bar's text up to its closing `]` (`… 1/10 [00:11<01:43, 11.45s/it]`): a record printed
# to stdout right after a bar drawn on stderr without a line end follows it in the same piece.
BAR_HEAD_PATTERN = r"^.*?\d+/(?:\d+|\?)\s*\[[^\]\r]*(?:<|it/s|s/it)[^\]\r]*\]\s*"
_BAR_HEAD = re.compile(BAR_HEAD_PATTERN)
# A Ray actor prefix between the bar and the record (the record came from an actor's stdout).
_BETWEEN = r"(?:\([A-Za-z_][\w.\-]* pid=\d+(?:, ip=[0-9A-Fa-f.:]+)?\)\s*)*"


def _clean_piece(piece: str) -> str:
    return _RAY_REPEAT.sub("", _RAY_PREFIX.sub("", _ANSI.sub("", piece)))


def _unbar(piece: str, anchor: str) -> str:
    """The piece from `anchor` on when a progress bar precedes the anchor (see BAR_HEAD_PATTERN)."""
    if anchor in piece and not piece.startswith(anchor):
        head = re.match(BAR_HEAD_PATTERN + _BETWEEN + "(?=" + re.escape(anchor) + ")", piece)
        if head:
            return piece[head.end():]
    return piece


def clean_line(line: str, anchor: str = "step:") -> str:
    """A console line without ANSI codes, carriage returns, Ray prefix or Ray repeat suffix.

    Each carriage-return separated piece of a line (progress-bar updates, perhaps a metric record) is
    judged on its own: a piece holding a progress bar followed at once by `anchor` is a record (from
    the anchor on). The line is reduced to its last piece starting with `anchor`, else its last
    non-empty piece.
    """
    line = line.rstrip("\r")
    if "\r" not in line:
        return _unbar(_clean_piece(line), anchor)
    pieces = [_unbar(cleaned, anchor) for cleaned in map(_clean_piece, line.split("\r")) if cleaned.strip()]
    anchored = [piece for piece in pieces if piece.startswith(anchor)]
    return anchored[-1] if anchored else (pieces[-1] if pieces else "")


def parse_scalar(text: str) -> tuple[float | None, str | None]:
    """(value, text_value) of one printed scalar.

    Numbers (`0.123`, `101.000`, `1e-06`, `nan`, `inf`, `-inf`), numpy-wrapped numbers
    (`np.float64(0.5)` -> 0.5) and torch scalars (`tensor(0.5, device='cuda:0')` -> 0.5) give
    (float, None); booleans give (1.0 or 0.0, 'True'/'False'); anything else gives (None, text).
    """
    text = text.strip()
    unwrapped = unwrap_scalar(text)
    lowered = unwrapped.lower()
    if lowered in _BOOLEANS:
        return _BOOLEANS[lowered], "True" if _BOOLEANS[lowered] else "False"
    if _NUMBER.match(unwrapped):
        return float(unwrapped), None
    return None, text


def unwrap_scalar(text: str) -> str:
    """The trimmed text without a numpy wrapper (`np.float64(0.5)` -> `0.5`: from the first '('
    to the final ')') or torch wrapper (`tensor(0.5, device='cuda:0')` -> `0.5`)."""
    text = text.strip()
    if _NUMPY_WRAPPED.match(text):
        return text[text.index("(") + 1:-1].strip()
    match = _TENSOR_WRAPPED.match(text)
    return match.group(1).strip() if match else text


def classify_noise(cleaned: str) -> str:
    """The name of the noise rule a non-metric cleaned line falls under ('other' when none)."""
    for rule, pattern in _NOISE:
        if pattern.search(cleaned):
            return rule
    return "other"


def clean_expr(line: pl.Expr) -> pl.Expr:
    """Polars expression equal to `clean_line` for lines without an interior carriage return.

    (`clean_lines` splits the others into their pieces first.)
    """
    return (
        line.str.strip_chars_end("\r")
        .str.replace_all(ANSI_PATTERN, "")
        .str.replace(RAY_PREFIX_PATTERN, "")
        .str.replace(RAY_REPEAT_PATTERN, "")
    )


def clean_lines(raw: pl.Series, anchor: str = "step:") -> pl.Series:
    """`clean_line` over a whole series of lines, in bulk with polars (see `clean_columns`)."""
    return clean_columns(pl.DataFrame({"raw": raw}), "raw", "c", anchor).get_column("c").alias(raw.name)


def clean_columns(frame: FrameT, raw: str, out: str, anchor: str = "step:") -> FrameT:
    """`frame` (eager or lazy) with column `out` equal to `clean_line` over the column `raw`.

    Lines holding an interior carriage return (progress-bar redraws) are split into pieces, each
    piece cleaned, and the last non-blank piece starting with `anchor` kept, else the last
    non-blank piece. Lines that hold most of a log's bytes take a shortcut (`_anchored_tail`): a
    line whose wrapping all lies before its first `anchor` is cleaned to the text from that
    anchor on, without running the cleaning regexes over the rest of the line; so is a line of
    progress-bar redraws whose last piece is a clean record (`_redrawn_tail`). Each way runs only
    on its own lines (the others are null for it, which costs nothing).
    """
    tail, rest, interior = pl.col("_tail"), pl.col("_rest"), pl.col("_interior")
    staged = frame.with_columns(_tail=pl.coalesce(_anchored_tail(pl.col(raw), anchor),
                                                  _redrawn_tail(pl.col(raw), anchor))).with_columns(
        _rest=pl.when(tail.is_null()).then(pl.col(raw)))
    staged = staged.with_columns(_interior=rest.str.strip_chars_end("\r").str.contains("\r", literal=True))
    pieces = (
        pl.when(interior).then(rest).str.strip_chars_end("\r").str.split("\r")
        .list.eval(unbar_expr(clean_expr(pl.element()), anchor))
        .list.eval(pl.element().filter(pl.element().str.strip_chars() != ""))
    )
    staged = staged.with_columns(_pieces=pieces)
    last_piece = (
        pl.col("_pieces").list.eval(pl.element().filter(pl.element().str.starts_with(anchor))).list.last()
        .fill_null(pl.col("_pieces").list.last()).fill_null("")
    )
    return staged.with_columns(
        pl.coalesce(tail, pl.when(interior).then(last_piece),
                    pl.when(~interior).then(unbar_expr(clean_expr(rest), anchor))).alias(out)
    ).drop("_tail", "_rest", "_interior", "_pieces")


def unbar_expr(piece: pl.Expr, anchor: str) -> pl.Expr:
    """Polars expression equal to `_unbar`: the piece from `anchor` on when a progress bar precedes it.
    The regex runs only on the pieces holding the anchor after their start."""
    glued = piece.str.contains(anchor, literal=True) & ~piece.str.starts_with(anchor)
    cut = piece.str.replace(BAR_HEAD_PATTERN + _BETWEEN + "(" + re.escape(anchor) + ")", "${1}")
    return pl.when(glued).then(cut).otherwise(piece)


def _redrawn_tail(line: pl.Expr, anchor: str) -> pl.Expr:
    """The last carriage-return piece of a line holding one inside it, where that equals
    `clean_line`: the piece starts with `anchor` and holds no ESC and no `[repeated` (cleaning
    leaves such a piece as it is, and no piece after it can be kept); null elsewhere."""
    trimmed = line.str.strip_chars_end("\r")
    last = pl.when(trimmed.str.contains("\r", literal=True)).then(trimmed).str.split("\r").list.last()
    usable = (last.str.starts_with(anchor) & ~last.str.contains("\x1b", literal=True)
              & ~last.str.contains("[repeated", literal=True))
    return pl.when(usable).then(last)


def _anchored_tail(line: pl.Expr, anchor: str) -> pl.Expr:
    """The line from its first `anchor` on, where that equals `clean_line`; null elsewhere.

    It does when the line holds no carriage return and no `[repeated`, the text before the anchor
    (the head, ASCII so that byte and character offsets agree) cleans to nothing and holds every
    ESC of the line: an ANSI sequence complete in the head ends there, one that is not leaves an
    ESC in the cleaned head, and the Ray prefix cannot reach past the head since the anchor's first
    character is neither a space nor '('.
    """
    if anchor[:1] in ("", "(") or anchor[:1].isspace() or "\x1b" in anchor:
        raise ValueError(f"anchor {anchor!r} must not be empty, hold ESC or start with a space or '('")
    at = line.str.find(anchor, literal=True)
    # The other tests run on the lines holding the anchor and no carriage return alone (null elsewhere).
    candidate = at.is_not_null() & ~line.str.contains("\r", literal=True)
    only = pl.when(candidate).then(line)
    head = only.str.head(at)
    usable = (
        candidate
        & ~only.str.contains("[repeated", literal=True)
        & (head.str.len_bytes() == at)
        & (head.str.count_matches("\x1b", literal=True) == only.str.count_matches("\x1b", literal=True))
        & (clean_expr(head) == "")
    )
    return pl.when(usable).then(line).str.slice(at)


def unwrap_series(values: pl.Series) -> pl.Series:
    """`unwrap_scalar` over a series of trimmed values, in bulk.

    `np.float64(...)`, verl's usual repr, is cut with two literal strips (a capture-group
    replacement costs five times as much over a million values). The rows holding another
    numpy-like wrapper (`np.`/`numpy.` and a final ')') or a torch one (`tensor(`) are gathered
    and handled apart: `NUMPY_WRAPPED_PATTERN` and `TENSOR_WRAPPED_PATTERN` only run on them.
    """
    frame = pl.DataFrame({"t": values})
    t = pl.col("t")
    closed = t.str.ends_with(")")
    flags = frame.select(
        f64=t.str.starts_with("np.float64(") & closed,
        other=(t.str.starts_with("np.") | t.str.starts_with("numpy.")) & closed & ~t.str.starts_with("np.float64("),
        tensor=t.str.starts_with("tensor("),
    )
    inner = frame.select(
        pl.when(flags.get_column("f64")).then(t.str.strip_prefix("np.float64(").str.strip_suffix(")"))
    ).to_series()
    for flag, cut in (("other", _numpy_inner), ("tensor", _tensor_inner)):
        rows = flags.get_column(flag).arg_true()
        if len(rows):
            inner = inner.scatter(rows, cut(values.gather(rows)))
    return pl.select(pl.coalesce(pl.lit(inner), pl.lit(values)).str.strip_chars()).to_series().alias(values.name)


def _numpy_inner(values: pl.Series) -> pl.Series:
    """Between the first '(' and the final ')' of values matching NUMPY_WRAPPED_PATTERN, else null.
    (A numpy wrapper is ASCII, so the byte offset of its '(' is also a character offset.)"""
    return pl.select(
        pl.when(pl.lit(values).str.contains(NUMPY_WRAPPED_PATTERN))
        .then(pl.lit(values).str.slice(pl.lit(values).str.find("(", literal=True) + 1).str.strip_suffix(")"))
    ).to_series()


def _tensor_inner(values: pl.Series) -> pl.Series:
    return values.str.extract(TENSOR_WRAPPED_PATTERN, 1)


def scalar_columns(frame: pl.DataFrame, raw: str, value: str = "value", text: str = "text_value") -> pl.DataFrame:
    """`frame` with columns `value` and `text` equal to `parse_scalar` over the trimmed column `raw`.

    Booleans give 1.0/0.0 and 'True'/'False'; numbers (after unwrapping) their float and a null
    text; anything else a null value and the original text. Intermediate columns are materialized
    once rather than re-evaluated inside each branch, and the boolean test (lower-casing) runs only
    when some short value is not a number.
    """
    unwrapped, number = pl.col("_unwrapped"), pl.col("_number")
    values = unwrap_series(frame.get_column(raw))
    floats = values.cast(pl.Float64, strict=False)
    # What polars parses as a float is a subset of what `_NUMBER` accepts, so the regex only decides
    # the values the cast left null. Those are first
    # stripped of what Python's strip also removes (the separators \x1c-\x1f).
    numbers = floats.is_not_null()
    undecided = (~numbers & values.is_not_null()).arg_true()
    if len(undecided):
        retry = values.gather(undecided).str.strip_chars(_PYTHON_WHITESPACE)
        values = values.scatter(undecided, retry)
        numbers = numbers.scatter(undecided, retry.str.contains("(?i)" + _NUMBER.pattern))
        floats = floats.scatter(undecided, retry.cast(pl.Float64, strict=False))
    staged = frame.with_columns(values.alias("_unwrapped"), floats.alias("_cast"), numbers.alias("_number"))
    if staged.select((~number & (unwrapped.str.len_bytes() <= 9)).any()).item():
        lower = unwrapped.str.to_lowercase()
        true, false = lower.is_in(["true", "np.true_"]), lower.is_in(["false", "np.false_"])
    else:
        true = false = pl.lit(False)
    return staged.with_columns(
        pl.when(number).then(pl.col("_cast"))
        .when(true).then(pl.lit(1.0)).when(false).then(pl.lit(0.0))
        .otherwise(pl.lit(None, pl.Float64)).alias(value),
        pl.when(number).then(pl.lit(None, pl.String))
        .when(true).then(pl.lit("True")).when(false).then(pl.lit("False"))
        .otherwise(pl.col(raw)).str.strip_chars().alias(text),
    ).drop("_unwrapped", "_cast", "_number")


def noise_rule_expr(cleaned: pl.Expr) -> pl.Expr:
    """Polars expression equal to `classify_noise` (Rust's regex reads NOISE_RULES as Python does)."""
    rules = pl.when(pl.lit(False)).then(pl.lit(None, pl.String))
    for rule, pattern in NOISE_RULES:
        rules = rules.when(cleaned.str.contains(pattern)).then(pl.lit(rule))
    return rules.otherwise(pl.lit("other"))
