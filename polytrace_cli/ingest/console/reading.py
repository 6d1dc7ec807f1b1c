"""Reading a console log into numbered lines, with one reader for every console format.

`read_lines` splits exactly as `str.split("\\n")` of the decoded text would (bad bytes replaced);
`read_console_lines` also repairs what a text log may carry: a byte-order mark, CR-only line ends,
NUL bytes and bytes that are not UTF-8 (each damaged line is named in an `encoding` column).
Both use polars' CSV reader (memory-mapped, in parallel, no Python string per line) when it gives
the same lines, and split in Python otherwise.
"""

from __future__ import annotations

import codecs
from pathlib import Path

from polytrace_cli.lazy import polars as pl


def read_lines(path: Path) -> pl.DataFrame:
    """The file's lines exactly as `str.split("\\n")` of its decoded text gives them (bad bytes
    replaced), numbered from 1: columns line_no, raw."""
    raw = _read_lines_polars(path)
    if raw is None:
        raw = pl.Series("raw", _split_text(path.read_bytes())[0], dtype=pl.String)
    return _numbered(raw)


def read_console_lines(path: Path) -> pl.DataFrame:
    """The file's lines as `read_lines` gives them, repaired: columns line_no, raw, and `encoding`
    (why a line's text is damaged, else null) when some line is.

    A byte-order mark is dropped; a file with carriage returns and no newline has CR-ended lines.
    NUL bytes and bytes that are not UTF-8 become replacement characters, so that a damaged line
    is still counted and classified: a metric line keeps its pairs (a damaged value is kept as
    text), any other damaged line is rejected (by the pipeline). The polars reader's lines
    need none of this (it refuses files with NULs or bad bytes, and drops a byte-order mark).
    """
    raw = _read_lines_polars(path)
    if raw is not None:
        return _numbered(raw)
    data = path.read_bytes().removeprefix(codecs.BOM_UTF8)
    parts, lossy = _split_text(data)
    if len(parts) == 1 and b"\n" not in data:
        parts = parts[0].split("\r")
        if parts[-1] == "":
            parts.pop()
    lines = _numbered(pl.Series("raw", parts, dtype=pl.String))
    if not lossy and b"\x00" not in data:
        return lines
    line = pl.col("raw")
    nul = line.str.contains("\x00", literal=True)
    return lines.with_columns(
        raw=line.str.replace_all("\x00", "\ufffd", literal=True),
        encoding=pl.when(nul & (line.str.replace_all("\x00", "", literal=True).str.strip_chars() == ""))
        .then(pl.lit("line holds NUL bytes and no text"))
        .when(nul).then(pl.lit("line holds NUL bytes"))
        .when(pl.lit(lossy) & line.str.contains("\ufffd", literal=True))
        .then(pl.lit("line holds bytes that are not UTF-8")),
    )


def _split_text(data: bytes) -> tuple[list[str], bool]:
    """(lines split on newlines, whether bytes that are not UTF-8 were replaced)."""
    try:
        text, lossy = data.decode("utf-8"), False
    except UnicodeDecodeError:
        text, lossy = data.decode("utf-8", errors="replace"), True
    parts = text.split("\n")
    if parts[-1] == "":
        parts.pop()  # a final newline ends the last line; it does not start another
    return parts, lossy


def _numbered(raw: pl.Series) -> pl.DataFrame:
    return pl.DataFrame({"raw": raw}).with_row_index("line_no", offset=1).with_columns(pl.col("line_no").cast(pl.Int64))


def _read_lines_polars(path: Path) -> pl.Series | None:
    """The file's lines split by polars' CSV reader (memory-mapped, in parallel, no Python string
    per line), or None when they might differ from `str.split("\\n")` of the decoded text.

    They are the same when the lines hold every byte of the file: their bytes plus one per newline
    add up to its size (the reader drops a CR before a newline or at the end, and a byte-order
    mark) and no replacement character appears (a bad byte was decoded, which changes sizes). A
    NUL byte (the reader's field separator here) gives an extra field: an error or lost bytes.
    """
    size = path.stat().st_size
    if not size:
        return None
    try:
        raw = pl.read_csv(path, has_header=False, separator="\x00", quote_char=None, new_columns=["raw"],
                          infer_schema=False, encoding="utf8-lossy").get_column("raw").fill_null("")
    except pl.exceptions.PolarsError:
        return None
    with open(path, "rb") as handle:
        handle.seek(-1, 2)
        newlines = raw.len() - (handle.read(1) != b"\n")
    if raw.str.len_bytes().sum() + newlines != size or raw.str.contains("\ufffd", literal=True).any():
        return None
    if not newlines and raw.str.contains("\r", literal=True).any():
        return None  # carriage returns and no newline: CR-ended lines, split apart by the caller
    return raw
