"""Whole JSON documents (a trainer_state.json, a wandb table) read so that one bad entry costs only
that entry: numbers no double holds are marked rather than read as infinity, and an array whose
document is nested too deep for the parser is cut into its elements, each parsed alone.

The standard library's parser reads `1e400` as infinity and a 400-digit integer as an int no double
holds; `loads` reads both as `BeyondDouble` (the literal's text), which a reader rejects as
`out-of-range`. The bare `NaN` and `Infinity` tokens a Python writer prints on purpose stay floats.
"""

from __future__ import annotations

import json
import math
import re
import sys


class BeyondDouble(str):
    """A number literal that no double holds, as written (`1e400`, 400 digits)."""


def _float(text: str) -> float | BeyondDouble:
    value = float(text)
    return value if math.isfinite(value) else BeyondDouble(text)


def _int(text: str) -> int | BeyondDouble:
    # Beyond about 309 digits no double holds the integer; Python refuses to read past 4,300 digits.
    if len(text.lstrip("-")) < 309:
        return int(text)
    try:
        value = int(text)
    except ValueError:
        return BeyondDouble(text)
    return value if abs(value) <= sys.float_info.max else BeyondDouble(text)


def loads(text: str):
    """`json.loads` with number literals no double holds read as `BeyondDouble`. Raises ValueError
    (JSONDecodeError) for text that is not JSON and RecursionError for JSON nested too deep."""
    return json.loads(text, parse_float=_float, parse_int=_int)


def beyond_double(value) -> BeyondDouble | None:
    """The first number literal no double holds in `value` (a parsed JSON value, its lists and
    objects searched too), or None."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, BeyondDouble):
            return item
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


# A JSON string (escapes included) or one structural character.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{},:]', re.S)


def array_elements(text: str, key: str) -> tuple[list[str], str] | None:
    """The texts of the elements of the array under `key` of the top-level object in `text`, and the
    document with that array emptied, found by scanning (no recursion, so depth costs nothing); None
    when the document has no such array or its brackets do not balance."""
    depth = 0
    expect_key = False
    last_string = None
    start = None
    elements: list[str] = []
    element_start = None
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token[0] == '"':
            last_string = token if depth == 1 else None
            continue
        if token in "[{":
            depth += 1
            if start is None and depth == 2 and token == "[" and expect_key:
                start = match.end()
                element_start = start
        elif token in "]}":
            if start is not None and depth == 2 and token == "]":
                tail = text[element_start:match.start()]
                if tail.strip() or elements:
                    elements.append(tail)
                return elements, text[:start] + text[match.start():]
            depth -= 1
            if depth < 0:
                return None
        elif token == "," and start is not None and depth == 2:
            elements.append(text[element_start:match.start()])
            element_start = match.end()
        expect_key = token == ":" and depth == 1 and last_string is not None and _key_is(last_string, key)
    return None


def _key_is(token: str, key: str) -> bool:
    try:
        return json.loads(token) == key
    except ValueError:
        return False


# The characters that change the depth, or start a string that could hide one.
_BRACKET_OR_QUOTE = re.compile(r'[\[\]{}"]')
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_SPACE = re.compile(r"\s*")
_SCALAR_END = re.compile(r"[,}\]\s]")


def object_members(text: str) -> list[tuple[str, int, int]] | None:
    """(key, start, end) of each member of the top-level object in `text` (`text[start:end]` is the
    member's value, not parsed), found by balancing brackets and passing over strings: memory holds
    the spans, never the parsed document, and depth costs nothing. None when `text` is not an
    object of members this scan can delimit (the caller parses it whole and reports why)."""
    members: list[tuple[str, int, int]] = []
    pos = _SPACE.match(text).end()
    if not text.startswith("{", pos):
        return None
    pos = _SPACE.match(text, pos + 1).end()
    if text.startswith("}", pos):
        return members
    while True:
        key = _STRING.match(text, pos)
        if key is None:
            return None
        pos = _SPACE.match(text, key.end()).end()
        if not text.startswith(":", pos):
            return None
        start = _SPACE.match(text, pos + 1).end()
        end = _value_end(text, start)
        if end is None:
            return None
        try:
            name = json.loads(key.group())
        except ValueError:
            return None
        members.append((name, start, end))
        pos = _SPACE.match(text, end).end()
        if text.startswith(",", pos):
            pos = _SPACE.match(text, pos + 1).end()
        elif text.startswith("}", pos):
            return members
        else:
            return None


def _value_end(text: str, start: int) -> int | None:
    """Where the JSON value starting at `start` ends (its brackets balanced, strings passed over
    whole), or None when it does not end; its content is checked by whoever parses it."""
    if start >= len(text):
        return None
    first = text[start]
    if first == '"':
        match = _STRING.match(text, start)
        return match.end() if match else None
    if first not in "[{":
        match = _SCALAR_END.search(text, start)
        return match.start() if match else len(text)
    depth, pos = 0, start
    while (token := _BRACKET_OR_QUOTE.search(text, pos)) is not None:
        char = token.group()
        if char == '"':
            string = _STRING.match(text, token.start())
            if string is None:
                return None
            pos = string.end()
            continue
        pos = token.end()
        depth += 1 if char in "[{" else -1
        if depth == 0:
            return pos
    return None
