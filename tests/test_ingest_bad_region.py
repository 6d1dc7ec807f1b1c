"""A bad line in the middle of a trace costs only that line: DuckDB finds it, Python names it."""

from __future__ import annotations

from pathlib import Path

import pytest

from polytrace_cli.ingest import jsonl
from polytrace_cli.ingest.base import FileContext
from polytrace_cli.ingest.formats.polytrace import multiturn as polytrace_multiturn
from polytrace_cli.ingest.formats.polytrace import packed as polytrace_packed
from polytrace_cli.ingest.runner import ingest_paths

GOOD = ('{"step": 3, "rank": 0, "dp_rank": %d, "tp_rank": 0, "local_index": %d, "input": 10, "output": [5, 6, 7],'
        ' "n_sampling": 3, "validate": false}')

# Every kind of bad line the per-line rule names, and the (line offset, code) it must get.
BAD_LINES = [
    ('{"step": 3, "input": 10, "output": [5', "invalid-json"),
    ("Traceback (most recent call last):", "invalid-json"),
    ('{"step": 3, "input": 10, "output": [5], "note": "cut in a str', "invalid-json"),
    ("[1, 2, 3]", "not-an-object"),
    ("null", "not-an-object"),
    ("5", "not-an-object"),
    ('{"step": 3, "output": [5]}', "missing-field"),
    ('{"step": null, "input": 4, "output": [5]}', "missing-field"),
    ('{"step": 3.5, "input": 4, "output": [5]}', "type-error"),
    ('{"step": 3, "input": 4, "output": [5, 99999999999]}', "out-of-range"),
    ('{"step": 3, "input": "ten", "output": [5]}', "type-error"),
    ('{"step": 3, "input": 4, "output": []}', "constraint-error"),
    ('{"step": 3, "input": -4, "output": [5]}', "constraint-error"),
]


def _forbid_whole_file_fallback(monkeypatch):
    def fail(*_args, **_kwargs):
        raise AssertionError("the whole file fell back to the line-by-line Python path")

    monkeypatch.setattr(jsonl, "_slow_path", fail)


def test_one_bad_line_in_the_middle_costs_only_that_line(store, tmp_path, monkeypatch):
    _forbid_whole_file_fallback(monkeypatch)
    lines = [GOOD % (i % 2, i) for i in range(400)]
    lines[200] = lines[200][:-1]  # cut short: the closing brace is missing
    path = tmp_path / "run" / "packed_lengths_step_3.jsonl"
    path.parent.mkdir()
    path.write_text("\n".join(lines) + "\n")
    [report] = ingest_paths(store, [path])
    assert (report.status, report.lines, report.stored, report.ignored, report.rejected) == ("ingested", 400, 399, 0, 1)
    assert store.execute("SELECT lines, stored, ignored, rejected, rows FROM files").fetchall() == [
        (400, 399, 0, 1, 399 * 3)]
    stored = [row[0] for row in store.execute("SELECT prompt_idx FROM sample_groups ORDER BY prompt_idx").fetchall()]
    assert stored == [i for i in range(400) if i != 200]  # rows before and after the bad line
    assert store.execute("SELECT line_no, code, reason FROM ingest_errors").fetchall() == [
        (201, "invalid-json", "truncated JSON (line cut short)")]


def _context(con, path: Path, file_id: int) -> FileContext:
    text = path.read_bytes()
    lines = text.count(b"\n") + (1 if text and not text.endswith(b"\n") else 0)
    return FileContext(con=con, path=path, run_id=1, file_id=file_id, run_name="r", line_count=lines)


def _outcome(con, ctx: FileContext, order: str) -> tuple:
    records = con.execute(f"SELECT * EXCLUDE (line_no) FROM records ORDER BY {order}").fetchall()
    errors = [(line_no, reason, raw, code) for _, line_no, reason, raw, code in ctx._errors]
    return records, errors, dict(ctx.ignored), ctx.lines


@pytest.mark.parametrize("ending", ["\n", ""])
def test_region_path_agrees_with_the_python_path_on_every_kind_of_bad_line(store, tmp_path, ending):
    module = polytrace_packed
    lines = []
    expected_codes = {}
    for index, (bad, code) in enumerate(BAD_LINES):
        lines += [GOOD % (0, 10 * index), GOOD % (1, 10 * index + 1), bad]
        expected_codes[len(lines)] = code
    lines += ["", "   ", GOOD % (0, 999), "\u00e9t\u00e9"]
    expected_codes[len(lines)] = "invalid-json"
    path = tmp_path / "packed_lengths_step_3.jsonl"
    path.write_text("\r\n".join(lines[:3]) + "\r\n" + "\n".join(lines[3:]) + ending, encoding="utf-8")

    region = _context(store, path, 1)
    region.lines = region.text_lines
    assert jsonl._region_path(region, module.SPEC, module.REQUIRED, module.CHECKS)
    by_region = _outcome(store, region, "local_index")
    python = _context(store, path, 1)
    python.lines = python.text_lines
    jsonl._slow_path(python, module.SPEC, module.REQUIRED, module.CHECKS)
    by_python = _outcome(store, python, "local_index")

    assert by_region == by_python
    records, errors, ignored, lines_read = by_region
    assert sorted((line_no, code) for line_no, _, _, code in errors) == sorted(expected_codes.items())
    assert ignored == {"blank line": 2}
    assert len(records) == 2 * len(BAD_LINES) + 1
    assert lines_read == len(records) + len(errors) + 2


def test_region_path_on_a_nested_spec_matches_the_python_path(store, tmp_path):
    module = polytrace_multiturn
    good = ('{"step": 1, "prompt_len": 5, "final_response_len": %d, "turns": [{"turn": 0, "completion_tokens": 4}],'
            ' "tool_calls": [{"turn": 0, "tool_name": "search", "latency_s": 0.5}]}')
    lines = [good % n for n in range(6)]
    lines.insert(3, '{"step": 1, "prompt_len": 5, "final_response_len": 3, "turns": [{"turn": 1.5}]}')
    lines.insert(5, '{"step": 1, "prompt_len": 5, "final_response_len": 3, "tool_calls": [{"latency_s": "slow"}]}')
    path = tmp_path / "multiturn_workload_step_1.jsonl"
    path.write_text("\n".join(lines) + "\n")
    region = _context(store, path, 1)
    assert jsonl._region_path(region, module.SPEC, module.REQUIRED, module.CHECKS)
    by_region = _outcome(store, region, "final_response_len")
    python = _context(store, path, 1)
    jsonl._slow_path(python, module.SPEC, module.REQUIRED, module.CHECKS)
    assert by_region == _outcome(store, python, "final_response_len")
    assert [(line_no, code) for _, line_no, _, _, code in region._errors] == [(4, "type-error"), (6, "type-error")]


def test_a_file_that_is_not_utf8_falls_back_to_the_python_path(store, tmp_path):
    path = tmp_path / "run" / "packed_lengths_step_3.jsonl"
    path.parent.mkdir()
    path.write_bytes(((GOOD % (0, 0)) + "\n\xff\xfe{}\n" + (GOOD % (0, 1)) + "\n").encode("latin-1"))
    [report] = ingest_paths(store, [path])
    assert (report.lines, report.stored, report.rejected) == (3, 2, 1)
    assert store.execute("SELECT line_no, code FROM ingest_errors").fetchall() == [(2, "encoding-error")]
