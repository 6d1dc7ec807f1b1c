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
