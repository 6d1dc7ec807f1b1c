"""Trace-event files read in bounded pieces: the event list is never held whole as Python objects.

A Chrome trace is one JSON document, `{"traceEvents": [...], ...}` (the object format) or a bare
`[...]` (the array format), that can be hundreds of MB. It is read in blocks of `BLOCK_BYTES`
(decompressed on the fly for `.gz`); each block's structure is found with numpy, without decoding
it: quotes not escaped by an odd run of backslashes open and close strings, and brackets outside
strings change the depth. The events are the objects one level inside the event array; a piece
is a run of whole events, cut at an event's closing brace, handed to DuckDB's `read_json` as a JSON
array of at most about `BLOCK_BYTES`. What lies outside the event array (Kineto's
`baseTimeNanoseconds`, `distributedInfo`, `deviceProperties`) is kept as text and decoded once.

A piece DuckDB cannot read (an event that is not JSON, a value of the wrong type) is split at its
top-level commas and each event decoded alone, so one bad event is quarantined by its index and
costs no other.

JSON-lines event streams (one event per line, as AReaL's tracer writes them) are read by lines, in
pieces of whole lines.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

BLOCK_BYTES = 16 << 20
# How far the event array may start into a file.
HEAD_LIMIT = 64 << 20

_QUOTE, _BACKSLASH = 34, 92
_OPEN_OBJECT, _CLOSE_OBJECT, _OPEN_ARRAY, _CLOSE_ARRAY, _COMMA = 123, 125, 91, 93, 44


def open_trace(path: Path):
    """The file's bytes, decompressed when it is gzip (by its magic bytes, not its name)."""
    with open(path, "rb") as probe:
        magic = probe.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


@dataclass
class _Structure:
    """The state of the structural scan between blocks."""

    in_string: int = 0
    backslashes: int = 0  # backslashes ending the previous block
    depth: int = 0

    def scan(self, block: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(depth after each byte, structural-open mask, structural-close mask) of one block, and the
        state carried to the next."""
        n = len(block)
        positions = np.arange(n, dtype=np.int64)
        is_backslash = block == _BACKSLASH
        last_other = np.maximum.accumulate(np.where(is_backslash, -1, positions))
        quotes = np.flatnonzero(block == _QUOTE)
        before = quotes - 1
        last = np.where(before >= 0, last_other[np.maximum(before, 0)], -1)
        run = np.where(last >= 0, before - last, quotes + self.backslashes)
        toggles = np.zeros(n, dtype=np.int8)
        toggles[quotes[run % 2 == 0]] = 1
        in_string = (np.cumsum(toggles, dtype=np.int64) + self.in_string) % 2 == 1
        outside = ~in_string
        opens = ((block == _OPEN_OBJECT) | (block == _OPEN_ARRAY)) & outside
        closes = ((block == _CLOSE_OBJECT) | (block == _CLOSE_ARRAY)) & outside
        depth = self.depth + np.cumsum(opens.astype(np.int64) - closes.astype(np.int64))
        if n:
            self.in_string = int(in_string[-1])
            self.backslashes = int(n - 1 - last_other[-1]) if last_other[-1] >= 0 else n + self.backslashes
            self.depth = int(depth[-1])
        return depth, opens, closes


@dataclass
class TracePieces:
    """The pieces of one trace file's event array and what lies around it."""

    path: Path
    block_bytes: int = BLOCK_BYTES
    outer: dict = field(default_factory=dict)  # the document without its event array
    array_format: bool = False
    found_events: bool = False
    problem: str | None = None  # why the document is not a trace (no event array, cut short)

    def __iter__(self) -> Iterator[bytes]:
        """Each piece as the text of a JSON array of whole events (`[e, e, ...]`)."""
        scan = _Structure()
        outside: list[bytes] = []  # the document's text outside the event array
        carry = b""  # the start of an event the previous block cut
        carry_state: tuple[int, int, int] | None = None
        level = None  # the depth inside the event array
        ended = False
        with open_trace(self.path) as handle:
            while True:
                raw = handle.read(self.block_bytes)
                if not raw:
                    break
                if ended:
                    outside.append(raw)
                    continue
                if carry:
                    scan.in_string, scan.backslashes, scan.depth = carry_state
                    raw = carry + raw
                    carry = b""
                start_state = (scan.in_string, scan.backslashes, scan.depth)
                block = np.frombuffer(raw, dtype=np.uint8)
                depth, opens, closes = scan.scan(block)
                offset = 0
                if level is None:
                    found = self._find_array(raw, block, depth, opens)
                    if found is None:
                        # The key may be cut by the block's end: the head is scanned again with more.
                        carry, carry_state = raw, start_state
                        if len(raw) > HEAD_LIMIT:
                            break
                        continue
                    array_at, level = found
                    outside.append(raw[:array_at + 1])
                    offset = array_at + 1
                    self.found_events = True
                closing = np.flatnonzero(closes[offset:] & (block[offset:] == _CLOSE_ARRAY) & (depth[offset:] == level - 1))
                stop = offset + int(closing[0]) if len(closing) else len(raw)
                ends = np.flatnonzero(closes[offset:stop] & (depth[offset:stop] == level)) + offset
                starts = np.flatnonzero(opens[offset:stop] & (depth[offset:stop] == level + 1)) + offset
                if len(closing):
                    ended = True
                    last_end = int(ends[-1]) if len(ends) else offset - 1
                    if len(starts) and starts[-1] > last_end:
                        self.problem = "an event is not closed before the event array ends"
                    if len(ends):
                        yield b"[" + raw[offset:last_end + 1].lstrip(b", \t\r\n") + b"]"
                    outside.append(raw[stop:])
                    continue
                if len(ends):
                    last_end = int(ends[-1])
                    piece = raw[offset:last_end + 1].lstrip(b", \t\r\n")
                    if piece:
                        yield b"[" + piece + b"]"
                    rest = raw[last_end + 1:]
                    cut_state = self._state_at(raw, last_end + 1, start_state)
                else:
                    rest = raw[offset:]
                    cut_state = self._state_at(raw, offset, start_state)
                carry, carry_state = rest, cut_state
        if level is None:
            self.problem = "no traceEvents array"
            return
        if carry and not ended:
            self.problem = "the file ends inside the event array (cut short?)"
        self._read_outer(b"".join(outside))

    def _state_at(self, raw: bytes, at: int, start_state: tuple[int, int, int]) -> tuple[int, int, int]:
        """The scan state before byte `at` of `raw` (a cut between events: outside any string)."""
        scan = _Structure(*start_state)
        if at:
            scan.scan(np.frombuffer(raw[:at], dtype=np.uint8))
        return scan.in_string, scan.backslashes, scan.depth

    def _find_array(self, raw: bytes, block: np.ndarray, depth: np.ndarray,
                    opens: np.ndarray) -> tuple[int, int] | None:
        """(offset of the event array's `[`, depth inside it) when this block opens it: a top-level
        array (the array format), or the array that is the value of the top-level key `traceEvents`."""
        candidates = np.flatnonzero(opens & (block == _OPEN_ARRAY) & (depth <= 2))
        for at in candidates:
            at = int(at)
            inside = int(depth[at])
            if inside == 1:
                self.array_format = True
                return at, 1
            if inside == 2 and raw[max(0, at - 64):at].rstrip().endswith(b":") and \
                    raw[max(0, at - 64):at].rstrip()[:-1].rstrip().endswith(b'"traceEvents"'):
                return at, 2
        return None

    def _read_outer(self, text: bytes) -> None:
        # The text outside the event array is the document with an empty event array.
        if self.array_format or not text.strip():
            return
        try:
            outer = json.loads(text)
        except ValueError:
            return
        if isinstance(outer, dict):
            outer.pop("traceEvents", None)
            self.outer = outer


def split_piece(piece: bytes, level: int = 1) -> list[bytes]:
    """The events of a piece (`[e, e, ...]`) as their own texts, cut at the commas between them."""
    block = np.frombuffer(piece, dtype=np.uint8)
    depth, _, _ = _Structure().scan(block)
    cuts = np.flatnonzero((block == _COMMA) & (depth == level) & _outside_strings(block))
    bounds = [1, *(int(c) + 1 for c in cuts)]
    ends = [*(int(c) for c in cuts), len(piece) - 1]
    return [piece[a:b] for a, b in zip(bounds, ends) if piece[a:b].strip()]


def _outside_strings(block: np.ndarray) -> np.ndarray:
    scan = _Structure()
    n = len(block)
    positions = np.arange(n, dtype=np.int64)
    last_other = np.maximum.accumulate(np.where(block == _BACKSLASH, -1, positions))
    quotes = np.flatnonzero(block == _QUOTE)
    before = quotes - 1
    last = np.where(before >= 0, last_other[np.maximum(before, 0)], -1)
    run = np.where(last >= 0, before - last, quotes + scan.backslashes)
    toggles = np.zeros(n, dtype=np.int8)
    toggles[quotes[run % 2 == 0]] = 1
    return np.cumsum(toggles, dtype=np.int64) % 2 == 0


def line_pieces(path: Path, block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[int, bytes]]:
    """(number of the piece's first line, whole lines) of a JSON-lines file, in pieces of about
    `block_bytes`."""
    first_line = 1
    carry = b""
    with open_trace(path) as handle:
        while True:
            raw = handle.read(block_bytes)
            if not raw:
                break
            raw = carry + raw
            cut = raw.rfind(b"\n") + 1
            if not cut:
                carry = raw
                continue
            piece, carry = raw[:cut], raw[cut:]
            yield first_line, piece
            first_line += piece.count(b"\n")
    if carry:
        yield first_line, carry + b"\n"
