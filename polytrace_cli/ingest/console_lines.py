"""Cleaning and parsing lines of a training job's console output (stdout captured to a file).

Console logs of RL trainers carry the same wrapping whatever the framework: ANSI colour codes,
carriage returns from progress bars, a Ray actor prefix such as `(TaskRunner pid=14640) ` or
`(WorkerDict pid=7, ip=10.0.0.1) `, and Ray's ` [repeated 3x across cluster]` suffix. This module
removes that wrapping and turns printed scalars back into numbers, twice over:

- as DuckDB SQL expressions (`clean_line_sql`, `scalar_value_sql`, `scalar_text_sql`) for the bulk
  path, which runs over every line of a file at once;
- as Python functions (`clean_line`, `parse_scalar`, `classify_noise`) with the same results, for
  the few lines the bulk path cannot handle and must name one by one.

Both versions must agree; `tests/test_ingest_verl_console.py` checks them against each other.
"""

from __future__ import annotations

import re

# ANSI CSI sequences (colours, cursor moves) and OSC sequences (window titles).
ANSI_PATTERN = r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07"
# `(TaskRunner pid=14640) `, `(main_task pid=3)`, `(WorkerDict pid=7, ip=10.0.0.1)`, possibly repeated.
RAY_PREFIX_PATTERN = r"^\s*(?:\([A-Za-z_][\w.\-]* pid=\d+(?:, ip=[0-9A-Fa-f.:]+)?\)\s*)+"
RAY_REPEAT_PATTERN = r"\s*\[repeated \d+x across cluster\]\s*$"

_ANSI = re.compile(ANSI_PATTERN)
_RAY_PREFIX = re.compile(RAY_PREFIX_PATTERN)
_RAY_REPEAT = re.compile(RAY_REPEAT_PATTERN)

# numpy 2 reprs `np.float64(0.5)`, `np.int64(3)`, `np.True_`, and torch `tensor(0.5, device='cuda:0')`.
NUMPY_WRAPPED_PATTERN = r"^(?:np|numpy)\.[a-z_]+\d*\((.*)\)$"
TENSOR_WRAPPED_PATTERN = r"^tensor\(([^,()]*)(?:,.*)?\)$"
_NUMPY_WRAPPED = re.compile(NUMPY_WRAPPED_PATTERN)
_TENSOR_WRAPPED = re.compile(TENSOR_WRAPPED_PATTERN)
_BOOLEANS = {"true": 1.0, "false": 0.0, "np.true_": 1.0, "np.false_": 0.0}
_NUMBER = re.compile(r"^[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|nan|inf|infinity)$", re.IGNORECASE)

# Noise rules for lines that are not metrics, in the order they are tried. Each is (rule, regex
# over the cleaned line). The SQL and Python classifiers both use this table.
NOISE_RULES: tuple[tuple[str, str], ...] = (
    ("blank", r"^\s*$"),
    ("tqdm", r"\d+%\|.*\||\d+/\d+ \[[\d:]+<[\d:?]+"),
    ("traceback", r"^Traceback \(most recent call last\)|^\s+File \"|^\s+\^+\s*$|^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt)(?::|$)"),
    ("warning", r"(?i)warn"),
    ("pprint", r"^\s*[\[{(]*'[^']*':\s|^\s*[{\[(]\s*$|^\s*[}\])]+,?\s*$"),
    ("logging", r"^\[?\d{4}-\d{2}-\d{2}[ T]\d|^(?:INFO|DEBUG|ERROR|CRITICAL|WARNING)\b|^\[\d{2}:\d{2}:\d{2}\]|^\(raylet\)"),
)
_NOISE = [(rule, re.compile(pattern)) for rule, pattern in NOISE_RULES]


def _clean_piece(piece: str) -> str:
    return _RAY_REPEAT.sub("", _RAY_PREFIX.sub("", _ANSI.sub("", piece)))


def clean_line(line: str, anchor: str = "step:") -> str:
    """A console line without ANSI codes, carriage returns, Ray prefix or Ray repeat suffix.

    A line holding several carriage-return separated pieces (progress-bar updates, perhaps followed
    by a metric line) is reduced to its last piece starting with `anchor`, else its last non-empty
    piece.
    """
    line = line.rstrip("\r")
    if "\r" not in line:
        return _clean_piece(line)
    pieces = [cleaned for cleaned in map(_clean_piece, line.split("\r")) if cleaned.strip()]
    anchored = [piece for piece in pieces if piece.startswith(anchor)]
    return anchored[-1] if anchored else (pieces[-1] if pieces else "")


def has_ray_prefix(line: str) -> bool:
    """True when the (ANSI-free) line starts with a Ray actor prefix."""
    return bool(_RAY_PREFIX.match(_ANSI.sub("", line)))


def parse_scalar(text: str) -> tuple[float | None, str | None]:
    """(value, text_value) of one printed scalar.

    Numbers (`0.123`, `101.000`, `1e-06`, `nan`, `inf`, `-inf`), numpy-wrapped numbers
    (`np.float64(0.5)` -> 0.5) and torch scalars (`tensor(0.5, device='cuda:0')` -> 0.5) give
    (float, None); booleans give (1.0 or 0.0, 'True'/'False'); anything else gives (None, text).
    """
    text = text.strip()
    unwrapped = text
    match = _NUMPY_WRAPPED.match(text) or _TENSOR_WRAPPED.match(text)
    if match:
        unwrapped = match.group(1).strip()
    lowered = unwrapped.lower()
    if lowered in _BOOLEANS:
        return _BOOLEANS[lowered], "True" if _BOOLEANS[lowered] else "False"
    if _NUMBER.match(unwrapped):
        return float(unwrapped), None
    return None, text


def classify_noise(cleaned: str) -> str:
    """The name of the noise rule a non-metric cleaned line falls under ('other' when none)."""
    for rule, pattern in _NOISE:
        if pattern.search(cleaned):
            return rule
    return "other"


def _sql_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _clean_piece_sql(column: str) -> str:
    no_ansi = f"regexp_replace({column}, {_sql_literal(ANSI_PATTERN)}, '', 'g')"
    no_prefix = f"regexp_replace({no_ansi}, {_sql_literal(RAY_PREFIX_PATTERN)}, '')"
    return f"regexp_replace({no_prefix}, {_sql_literal(RAY_REPEAT_PATTERN)}, '')"


def clean_line_sql(column: str, anchor: str = "step:") -> str:
    """DuckDB expression equal to `clean_line(column, anchor)`.

    Lines without an interior carriage return (nearly all) take a plain chain of regexp_replace;
    the others are split on '\\r' and cleaned piece by piece with list lambdas.
    """
    line = f"rtrim({column}, chr(13))"
    pieces = (f"list_filter(list_transform(string_split({line}, chr(13)), lambda piece: {_clean_piece_sql('piece')}),"
              " lambda piece: trim(piece) <> '')")
    anchored = f"list_filter({pieces}, lambda piece: starts_with(piece, {_sql_literal(anchor)}))"
    return (f"CASE WHEN contains({line}, chr(13)) THEN coalesce({anchored}[-1], {pieces}[-1], '') "
            f"ELSE {_clean_piece_sql(line)} END")


def scalar_value_sql(column: str) -> str:
    """DuckDB expression equal to `parse_scalar(column)[0]` (the numeric value, or NULL)."""
    unwrapped = _unwrapped_sql(column)
    return (
        f"CASE WHEN lower({unwrapped}) IN ('true', 'np.true_') THEN 1.0 "
        f"WHEN lower({unwrapped}) IN ('false', 'np.false_') THEN 0.0 "
        f"WHEN regexp_matches({unwrapped}, {_sql_literal(_NUMBER.pattern)}, 'i') "
        f"THEN try_cast({unwrapped} AS DOUBLE) END"
    )


def scalar_text_sql(column: str) -> str:
    """DuckDB expression equal to `parse_scalar(column)[1]` (text of non-numbers, 'True'/'False')."""
    unwrapped = _unwrapped_sql(column)
    return (
        f"CASE WHEN lower({unwrapped}) IN ('true', 'np.true_') THEN 'True' "
        f"WHEN lower({unwrapped}) IN ('false', 'np.false_') THEN 'False' "
        f"WHEN regexp_matches({unwrapped}, {_sql_literal(_NUMBER.pattern)}, 'i') THEN NULL "
        f"ELSE trim({column}) END"
    )


def _unwrapped_sql(column: str) -> str:
    trimmed = f"trim({column})"
    return (
        f"(CASE WHEN regexp_matches({trimmed}, {_sql_literal(NUMPY_WRAPPED_PATTERN)}) "
        f"THEN trim(regexp_extract({trimmed}, {_sql_literal(NUMPY_WRAPPED_PATTERN)}, 1)) "
        f"WHEN regexp_matches({trimmed}, {_sql_literal(TENSOR_WRAPPED_PATTERN)}) "
        f"THEN trim(regexp_extract({trimmed}, {_sql_literal(TENSOR_WRAPPED_PATTERN)}, 1)) "
        f"ELSE {trimmed} END)"
    )


def classify_noise_sql(column: str) -> str:
    """DuckDB expression equal to `classify_noise(column)`."""
    # DuckDB's RE2 reads every pattern of NOISE_RULES the way Python's re does.
    cases = " ".join(
        f"WHEN regexp_matches({column}, {_sql_literal(pattern)}) THEN {_sql_literal(rule)}"
        for rule, pattern in NOISE_RULES
    )
    return f"CASE {cases} ELSE 'other' END"
