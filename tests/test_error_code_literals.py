"""Ingest error codes are named through the `ErrorCode` enum at every call site, never as string literals:
a code typed as text can drift from docs/errors.md's vocabulary unseen, a member cannot. (That every member
is documented, in order, is `test_ingest_bad_input.test_the_error_codes_are_the_documented_vocabulary`.)"""

from __future__ import annotations

import ast
from pathlib import Path

from polytrace_cli.errors import ErrorCode

PACKAGE = Path(__file__).resolve().parents[1] / "polytrace_cli"


def literal_codes(source: str) -> list[tuple[int, str]]:
    """(line, text) of each string literal in `source` that is an ErrorCode value, and of each string
    literal given as a `code=` keyword argument (whatever its text, in an `a if c else b` too)."""
    values = {code.value for code in ErrorCode}
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in values:
            found.add((node.lineno, node.value))
        if isinstance(node, ast.keyword) and node.arg == "code":
            found.update((literal.lineno, literal.value) for literal in _given(node.value))
    return sorted(found)


def _given(node: ast.expr) -> list[ast.Constant]:
    """The string literals an argument evaluates to: itself, or either branch of a conditional (not the
    literals inside a call, such as a column name)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node]
    if isinstance(node, ast.IfExp):
        return _given(node.body) + _given(node.orelse)
    return []


def test_the_scan_finds_a_code_written_as_text():
    source = (
        'ctx.reject(1, "bad", code="out-of-range")\n'
        'ctx.reject(2, "bad", code="made-up" if x else ErrorCode.TYPE_ERROR)\n'
        'raise IngestError("cut short", "corrupt-file")\n'
        'ctx.reject(3, "fine", code=ErrorCode.OUT_OF_RANGE)\n'
        'ctx.reject(4, "fine", code=code)\n'
        'frame.select(reason="r", code=pl.col("code"))\n'
    )
    assert literal_codes(source) == [(1, "out-of-range"), (2, "made-up"), (3, "corrupt-file")]


def test_no_module_writes_an_error_code_as_text():
    written = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "errors.py":
            continue  # the enum itself
        found = literal_codes(path.read_text())
        if found:
            written[str(path.relative_to(PACKAGE))] = found
    assert written == {}
