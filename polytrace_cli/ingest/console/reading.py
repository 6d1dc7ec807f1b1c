"""Reading a console log into numbered lines, with one reader for every console format.

`read_lines` splits exactly as `str.split("\\n")` of the decoded text would (bad bytes replaced);
`read_console_lines` also repairs what a text log may carry: a byte-order mark, CR-only line ends,
NUL bytes and bytes that are not UTF-8 (each damaged line is named in an `encoding` column).
Both use polars' CSV reader (memory-mapped, in parallel, no Python string per line) when it gives
the same lines, and split in Python otherwise.
"""

from __future__ import annotations

import codecs
import io
from collections.abc import Iterator
from pathlib import Path

from polytrace_cli.lazy import polars as pl


def read_lines(path: Path) -> pl.DataFrame:
    """The file's lines exactly as `str.split("\\n")` of its decoded text gives them (bad bytes
    replaced), numbered from 1: columns line_no, raw."""
    raw = _read_lines_polars(path)
    if raw is None:
        raw = pl.Series("raw", _split_text(path.read_bytes())[0], dtype=pl.String)
    return _numbered(raw)


# A console log is read in blocks of about this many bytes, each cut at a line end.
CONSOLE_BLOCK_BYTES = 8 << 20


def read_console_blocks(path: Path, block_bytes: int | None = None) -> Iterator[pl.DataFrame]:
    """The lines `read_console_lines` gives, as frames of consecutive lines of about `block_bytes`
    each (at least one frame, empty for an empty file), so that no more than a block of the file's
    text is held at a time.

    A block ends at a newline, and a newline is never inside a UTF-8 character, so each block decodes
    and splits as its part of the whole file does. What depends on the whole file is decided for
    it: a byte-order mark is dropped from the first block only, carriage returns end lines only in a
    file with no newline at all (read as one block), and a line holding a replacement character is
    damaged when the file has any byte that is not UTF-8 (checked once, when some block needs it).
    """
    block_bytes = block_bytes or CONSOLE_BLOCK_BYTES
    offset = 0
    file_lossy = None

    def lossy_anywhere() -> bool:
        nonlocal file_lossy
        if file_lossy is None:
            file_lossy = _has_bad_utf8(path, block_bytes)
        return file_lossy

    with open(path, "rb") as handle:
        rest = b""
        first = True
        while True:
            block = handle.read(block_bytes)
            data = rest + block
            cut = data.rfind(b"\n") + 1 if block else len(data)
            if not cut and block:
                rest = data  # no line end yet: a line longer than a block
                continue
            piece, rest = data[:cut], data[cut:]
            if piece or first:
                lines = _block_lines(piece, first, not block and first, lossy_anywhere)
                yield lines.with_columns(pl.col("line_no") + offset) if offset else lines
                offset += lines.height
            first = False
            if not block:
                return


def _has_bad_utf8(path: Path, block_bytes: int) -> bool:
    decoder = codecs.getincrementaldecoder("utf-8")()
    with open(path, "rb") as handle:
        try:
            while block := handle.read(block_bytes):
                decoder.decode(block)
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            return True
    return False


def _block_lines(data: bytes, first: bool, whole_file: bool, lossy_anywhere) -> pl.DataFrame:
    """`read_console_lines` of one block of a file (`first`: the file's first block; `whole_file`:
    the block is the whole file)."""
    if first:
        data = data.removeprefix(codecs.BOM_UTF8)
    raw = _split_polars(data, cr_ends_lines=whole_file and b"\n" not in data)
    if raw is not None:
        return _numbered(raw)
    return _repaired(data, whole_file, lossy_anywhere)


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
    return _repaired(data, True, None)


def _repaired(data: bytes, whole_file: bool, lossy_anywhere) -> pl.DataFrame:
    """The numbered, repaired lines of `data` (see `read_console_lines`), split in Python;
    `lossy_anywhere()` says whether the whole file holds a byte that is not UTF-8 (None: `data` is
    the whole file)."""
    parts, lossy = _split_text(data)
    if whole_file and len(parts) == 1 and b"\n" not in data:
        parts = parts[0].split("\r")
        if parts[-1] == "":
            parts.pop()
    lines = _numbered(pl.Series("raw", parts, dtype=pl.String))
    if not lossy and lossy_anywhere is not None and "\ufffd" in data.decode("utf-8", "replace"):
        lossy = lossy_anywhere()
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


def _split_polars(data: bytes, cr_ends_lines: bool) -> pl.Series | None:
    """`_read_lines_polars` of a block of bytes already read (`cr_ends_lines`: the block is a whole
    file without a newline, whose carriage returns end lines)."""
    if not data:
        return None
    try:
        raw = pl.read_csv(io.BytesIO(data), has_header=False, separator="\x00", quote_char=None, new_columns=["raw"],
                          infer_schema=False, encoding="utf8-lossy").get_column("raw").fill_null("")
    except pl.exceptions.PolarsError:
        return None
    newlines = raw.len() - (data[-1:] != b"\n")
    if raw.str.len_bytes().sum() + newlines != len(data) or raw.str.contains("\ufffd", literal=True).any():
        return None
    if cr_ends_lines and raw.str.contains("\r", literal=True).any():
        return None
    return raw


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
