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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

BLOCK_BYTES = 16 << 20
# How far the event array may start into a file.
HEAD_LIMIT = 64 << 20

_QUOTE, _BACKSLASH = 34, 92
_OPEN_OBJECT, _CLOSE_OBJECT, _OPEN_ARRAY, _CLOSE_ARRAY, _COMMA = 123, 125, 91, 93, 44
# Each byte's class for the scan: 1 a quote, 2 a bracket (or an extra character asked for), 0 the rest.
def _classes_with(extra: bytes = b"") -> bytes:
    """The `bytes.translate` table of the classes (translating is C speed, without numpy's index copies)."""
    table = bytearray(256)
    table[_QUOTE] = 1
    for character in (_OPEN_OBJECT, _CLOSE_OBJECT, _OPEN_ARRAY, _CLOSE_ARRAY, *extra):
        table[character] = 2
    return bytes(table)


_CLASSES = _classes_with()


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

    def scan(self, data: bytes, extra: bytes = b"") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(positions, bytes, depth after each) of the block's brackets outside strings (and of the
        `extra` characters, e.g. commas, with their depth unchanged), and the state carried to the next
        block. Only the sparse structural bytes are handled as arrays: the quotes, the few backslashes
        before a quote, the brackets."""
        import numpy as np  # here, not at import: every sniff imports this module, few files are traces

        block = np.frombuffer(data, dtype=np.uint8)
        n = len(block)
        classes = np.frombuffer(data.translate(_CLASSES if not extra else _classes_with(extra)), dtype=np.uint8)
        interesting = np.flatnonzero(classes)
        kinds = classes[interesting]
        quotes = interesting[kinds == 1]
        if len(quotes):
            before = quotes - 1
            # A quote after a backslash is escaped when the run of backslashes before it is odd.
            suspects = np.flatnonzero(np.where(before >= 0, block[np.maximum(before, 0)] == _BACKSLASH,
                                               self.backslashes > 0))
            if len(suspects):
                keep = np.ones(len(quotes), dtype=bool)
                for index in suspects:
                    at = int(quotes[index]) - 1
                    run = 0
                    while at >= 0 and block[at] == _BACKSLASH:
                        run += 1
                        at -= 1
                    if at < 0:
                        run += self.backslashes
                    keep[index] = run % 2 == 0
                quotes = quotes[keep]
        positions = interesting[kinds == 2]
        # Inside a string when an odd number of real quotes (with the carried state) precede it.
        outside = (np.searchsorted(quotes, positions) + self.in_string) % 2 == 0
        positions = positions[outside]
        chars = block[positions]
        step = np.zeros(len(positions), dtype=np.int64)
        step[(chars == _OPEN_OBJECT) | (chars == _OPEN_ARRAY)] = 1
        step[(chars == _CLOSE_OBJECT) | (chars == _CLOSE_ARRAY)] = -1
        depth = self.depth + np.cumsum(step)
        if n:
            self.in_string = (self.in_string + len(quotes)) % 2
            tail = 0
            while tail < n and block[n - 1 - tail] == _BACKSLASH:
                tail += 1
            self.backslashes = tail + (self.backslashes if tail == n else 0)
            if len(depth):
                self.depth = int(depth[-1])
        return positions, chars, depth


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
        carry = b""  # the start of an event the previous block cut (or the head before the array)
        carry_state = (0, 0, 0)
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
                    raw = carry + raw
                    carry = b""
                scan.in_string, scan.backslashes, scan.depth = carry_state
                start_state = carry_state
                positions, chars, depth = scan.scan(raw)
                offset = 0
                if level is None:
                    found = self._find_array(raw, positions, chars, depth)
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
                after = positions >= offset
                closing = positions[after & (chars == _CLOSE_ARRAY) & (depth == level - 1)]
                stop = int(closing[0]) if len(closing) else len(raw)
                inside = after & (positions < stop)
                ends = positions[inside & (chars == _CLOSE_OBJECT) & (depth == level)]
                starts = positions[inside & (chars == _OPEN_OBJECT) & (depth == level + 1)]
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
                    # Right after an event's closing brace: outside strings, at the array's depth.
                    carry, carry_state = raw[last_end + 1:], (0, 0, level)
                else:
                    carry, carry_state = raw[offset:], (start_state if offset == 0 else (0, 0, level))
        if level is None:
            self.problem = "no traceEvents array"
            return
        if carry.strip() and not ended:
            self.problem = "the file ends inside the event array (cut short?)"
        self._read_outer(b"".join(outside))

    def _find_array(self, raw: bytes, positions: np.ndarray, chars: np.ndarray,
                    depth: np.ndarray) -> tuple[int, int] | None:
        """(offset of the event array's `[`, depth inside it) when this block opens it: a top-level
        array (the array format), or the array that is the value of the top-level key `traceEvents`."""
        for at, inside in zip(positions[(chars == _OPEN_ARRAY) & (depth <= 2)].tolist(),
                              depth[(chars == _OPEN_ARRAY) & (depth <= 2)].tolist()):
            if inside == 1:
                self.array_format = True
                return at, 1
            before = raw[max(0, at - 64):at].rstrip()
            if inside == 2 and before.endswith(b":") and before[:-1].rstrip().endswith(b'"traceEvents"'):
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
    positions, chars, depth = _Structure().scan(piece, extra=b",")
    cuts = positions[(chars == _COMMA) & (depth == level)].tolist()
    bounds = [1, *(c + 1 for c in cuts)]
    ends = [*cuts, len(piece) - 1]
    return [piece[a:b] for a, b in zip(bounds, ends) if piece[a:b].strip()]


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
