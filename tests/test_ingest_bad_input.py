"""Bad input: every case gets a clear outcome, loses nothing, and leaves other files intact."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import copy_store
from polytrace_cli.cli import app
from polytrace_cli.ingest.base import Ingester
from polytrace_cli.ingest.registry import _REGISTRY
from polytrace_cli.ingest.driver import ingest_paths

GOOD = ('{"step": 0, "rank": 0, "dp_rank": 0, "tp_rank": 0, "local_index": %d, "input": 10, "output": [5, 6], '
        '"n_sampling": 2, "validate": false}')


def _trace(folder: Path, body: str, name: str = "packed_lengths_step_0.jsonl") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(body)
    return path


def _file_row(con, path: Path):
    return con.execute(
        "SELECT lines, stored, ignored, rejected, rows FROM files WHERE path = ?", [str(path.resolve())]
    ).fetchall()[0]


def _errors(con):
    return con.execute("SELECT line_no, reason FROM ingest_errors ORDER BY line_no").fetchall()


def test_truncated_last_line_is_rejected_and_the_rest_kept(store, tmp_path):
    path = _trace(tmp_path / "r", "\n".join([GOOD % 0, GOOD % 1, '{"step": 0, "rank": 0, "output": [5']))
    ingest_paths(store, [path])
    assert _file_row(store, path) == (3, 2, 0, 1, 4)
    assert _errors(store) == [(3, "truncated JSON (line cut short)")]


def test_line_that_is_not_json_and_blank_lines(store, tmp_path):
    path = _trace(tmp_path / "r", "\n".join([GOOD % 0, "", "Traceback (most recent call last):", GOOD % 1, ""]) + "\n")
    ingest_paths(store, [path])
    lines, stored, ignored, rejected, rows = _file_row(store, path)
    assert (lines, stored, ignored, rejected, rows) == (5, 2, 2, 1, 4)
    assert _errors(store)[0][0] == 3 and _errors(store)[0][1].startswith("not JSON")
    assert store.execute("SELECT rule, lines FROM ignored_lines").fetchall() == [("blank line", 2)]


def test_missing_fields_and_wrong_types_are_named(store, tmp_path):
    body = "\n".join([
        GOOD % 0,
        '{"step": 0, "rank": 0, "dp_rank": 0, "local_index": 1, "input": 10}',
        '{"step": 0, "rank": 0, "dp_rank": 0, "local_index": 2, "input": "ten", "output": [1]}',
        '{"step": 0, "rank": 0, "dp_rank": 0, "local_index": 3, "input": 10, "output": [1, "x"]}',
        '{"step": 0, "rank": 0, "dp_rank": 0, "local_index": 4, "input": 10, "output": []}',
        "[1, 2, 3]",
    ]) + "\n"
    path = _trace(tmp_path / "r", body)
    ingest_paths(store, [path])
    assert _errors(store) == [
        (2, "missing field output"),
        (3, "field input: expected integer, got string"),
        (4, "field output[1]: expected integer, got string"),
        (5, "output holds no response lengths"),
        (6, "not a JSON object (list)"),
    ]
    assert _file_row(store, path) == (6, 1, 0, 5, 2)


def test_empty_trace_file_is_stored_with_zero_lines(store, tmp_path):
    path = _trace(tmp_path / "r", "")
    reports = ingest_paths(store, [path])
    assert reports[0].status == "ingested"
    assert _file_row(store, path) == (0, 0, 0, 0, 0)


def test_binary_and_unknown_files_named_explicitly_are_rejected_whole(store, tmp_path):
    binary = tmp_path / "r" / "weights.bin"
    binary.parent.mkdir()
    binary.write_bytes(b"\x00\x01\x02garbage\xff" * 10)
    unknown = tmp_path / "r" / "notes.txt"
    unknown.write_text("just some notes\n")
    good = _trace(tmp_path / "r", GOOD % 0 + "\n")
    reports = {Path(r.path).name: r for r in ingest_paths(store, [binary, unknown, good])}
    assert reports["weights.bin"].status == "rejected"
    assert reports["weights.bin"].message == "binary file of unknown format"
    assert reports["notes.txt"].message.startswith("unknown format")
    assert reports["packed_lengths_step_0.jsonl"].status == "ingested"
    reasons = {r[0] for r in store.execute("SELECT reason FROM ingest_errors WHERE line_no IS NULL").fetchall()}
    assert reasons == {"binary file of unknown format", "unknown format (use --format to name it)"}


def test_unknown_files_found_in_a_folder_are_skipped_not_failed(store, tmp_path):
    _trace(tmp_path / "r", GOOD % 0 + "\n")
    (tmp_path / "r" / "README").write_text("about this run\n")
    reports = ingest_paths(store, [tmp_path / "r"])
    assert sorted(r.status for r in reports) == ["ingested", "skipped"]


def test_missing_path_is_an_error_that_does_not_stop_the_others(store, tmp_path):
    good = _trace(tmp_path / "r", GOOD % 0 + "\n")
    reports = ingest_paths(store, [tmp_path / "nope.jsonl", good])
    assert [(r.status, r.message) for r in reports] == [("error", "no such file or directory"), ("ingested", None)]


class _Interrupting(Ingester):
    name = "test-interrupting"

    def sniff(self, path, head):
        return path.name == "interrupt.jsonl"

    def load(self, ctx):
        ctx.insert("INSERT INTO sample_rows (run_id, file_id, step, response_len) SELECT ?, ?, 0, 1", [ctx.run_id, ctx.file_id])
        raise KeyboardInterrupt


def test_interrupt_inside_a_file_leaves_no_partial_rows(store, tmp_path):
    path = _trace(tmp_path / "r", "{}\n", name="interrupt.jsonl")
    _REGISTRY.insert(0, _Interrupting())
    try:
        with pytest.raises(KeyboardInterrupt):
            ingest_paths(store, [path])
    finally:
        _REGISTRY.pop(0)
    assert store.execute("SELECT count(*) FROM samples").fetchall()[0][0] == 0
    assert store.execute("SELECT count(*) FROM files").fetchall()[0][0] == 0


def test_strict_turns_rejected_lines_into_a_failing_exit(tmp_path):
    path = _trace(tmp_path / "r", GOOD % 0 + "\nnot json\n")
    db = tmp_path / "s.duckdb"
    runner = CliRunner()
    relaxed = runner.invoke(app, ["ingest", str(path), "--db", str(db)])
    assert relaxed.exit_code == 0
    path.write_text(GOOD % 0 + "\nstill not json\n")
    strict = runner.invoke(app, ["ingest", str(path), "--db", str(db), "--strict"])
    assert strict.exit_code == 1
    assert "--strict: 1 line(s) rejected" in strict.output


def test_locked_store_gives_one_line_and_non_zero_exit(tmp_path):
    db = tmp_path / "s.duckdb"
    path = _trace(tmp_path / "r", GOOD % 0 + "\n")
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import duckdb,time; c=duckdb.connect({str(db)!r}); print('ok', flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ok"
        result = subprocess.run([sys.executable, "-m", "polytrace_cli.cli", "ingest", str(path), "--db", str(db)],
                                capture_output=True, text=True)
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 2
    assert "locked by another process" in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_unwritable_store_folder_gives_one_line(tmp_path):
    path = _trace(tmp_path / "r", GOOD % 0 + "\n")
    result = CliRunner().invoke(app, ["ingest", str(path), "--db", "/sys/polytrace-test.duckdb"])
    assert result.exit_code == 2
    assert "not writable" in result.output


REWARD = '{"step": %s, "rank": 0, "reward_time_s": %s, "validate": %s}'


@pytest.mark.parametrize(("step", "seconds", "validate", "code"), [
    ("3", "1.5", "true", None),
    ("3.0", "1", "false", None),               # a whole number is an integer, in both paths
    ("5.7", "1.5", "true", "type-error"),      # DuckDB alone would round it to 6
    ('"3"', "1.5", "true", "type-error"),      # DuckDB alone would cast the string
    ("3", '"1.5"', "true", "type-error"),
    ("3", "1.5", '"yes"', "type-error"),       # DuckDB alone would read it as true
    ("3", "1.5", "1", "type-error"),
    ("2147483647", "1.5", "true", None),
    ("-2147483648", "1.5", "true", None),
    ("2147483648", "1.5", "true", "out-of-range"),
    ("-2147483649", "1.5", "true", "out-of-range"),
    ("1e20", "1.5", "true", "out-of-range"),
    ("-9223372036854775809", "1.5", "true", "out-of-range"),
    ("18446744073709551616", "1.5", "true", "out-of-range"),
])
def test_type_rules_are_the_same_alone_and_beside_a_bad_line(store, tmp_path, step, seconds, validate, code):
    line = REWARD % (step, seconds, validate)
    alone = _trace(tmp_path / "alone", line + "\n", "reward_timings_step_1.jsonl")
    beside = _trace(tmp_path / "beside", line + "\nnot json\n", "reward_timings_step_1.jsonl")
    ingest_paths(store, [alone, beside])
    codes = dict(store.execute(
        "SELECT f.path, list(e.code ORDER BY e.line_no) FROM files f LEFT JOIN ingest_errors e USING (file_id)"
        " GROUP BY f.path").fetchall())
    assert codes[str(alone.resolve())] == [code]
    assert codes[str(beside.resolve())] == [c for c in (code, "invalid-json") if c]
    stored = store.execute("SELECT file_id, step, seconds, validate FROM rank_timings ORDER BY file_id").fetchall()
    if code is None:
        assert [row[1:] for row in stored] == [(int(float(step)), float(seconds), validate == "true")] * 2
    else:
        assert stored == []


def test_out_of_range_list_item_is_rejected_not_stored_as_null(store, tmp_path):
    too_long = '{"step": 0, "input": 10, "output": [5, 1099511627776]}'
    too_short = '{"step": 0, "input": -9223372036854775808, "output": [5]}'
    path = _trace(tmp_path / "r", "\n".join([GOOD % 0, too_long, too_short]) + "\n")
    ingest_paths(store, [path])
    assert store.execute("SELECT line_no, code, reason FROM ingest_errors ORDER BY line_no").fetchall() == [
        (2, "out-of-range", "field output[1]: 1099511627776 is out of range for INTEGER"),
        (3, "out-of-range", "field input: -9223372036854775808 is out of range for INTEGER"),
    ]
    assert store.execute("SELECT response_lens FROM sample_groups").fetchall() == [([5, 6],)]


def test_an_out_of_range_step_does_not_abort_the_command_or_lose_other_files(tmp_path):
    folder = tmp_path / "run"
    _trace(folder, REWARD % ("1", "1.5", "true") + "\n" + REWARD % ("2147483648", "1.5", "true") + "\n",
           "reward_timings_step_1.jsonl")
    _trace(folder, REWARD % ("2", "2.5", "true") + "\n", "reward_timings_step_2.jsonl")
    _trace(folder, '{"step": 4294967296, "data": {"timing_s/step": 1}}\n{"step": 3, "data": {"timing_s/step": 1}}\n',
           "metrics.jsonl")
    db = tmp_path / "s.duckdb"
    result = CliRunner().invoke(app, ["ingest", str(folder), "--db", str(db)])
    assert result.exit_code == 0, result.output
    from polytrace_cli.store import open_store

    con = open_store(db, read_only=True)
    try:
        assert con.execute("SELECT step FROM rank_timings ORDER BY step").fetchall() == [(1,), (2,)]
        assert con.execute("SELECT DISTINCT step FROM step_metrics").fetchall() == [(3,)]
        assert con.execute("SELECT line_no, code FROM ingest_errors ORDER BY code").fetchall() == [
            (1, "out-of-range"), (2, "out-of-range")]
    finally:
        con.close()


def test_a_file_read_with_the_wrong_format_is_read_again_with_the_right_one(store, tmp_path):
    path = _trace(tmp_path / "r", GOOD % 0 + "\n" + GOOD % 1 + "\n")
    [wrong] = ingest_paths(store, [path], format_name="polytrace-reward")
    assert (wrong.status, wrong.rejected) == ("ingested", 2)
    [right] = ingest_paths(store, [path])
    assert (right.status, right.format, right.rejected) == ("replaced", "polytrace-packed", 0)
    assert store.execute("SELECT count(*) FROM sample_groups").fetchall() == [(2,)]
    assert store.execute("SELECT count(*) FROM ingest_errors").fetchall() == [(0,)]
    assert store.execute("SELECT format FROM files").fetchall() == [("polytrace-packed",)]
    [again] = ingest_paths(store, [path])
    assert again.status == "unchanged"


def test_out_of_range_values_in_whole_document_and_csv_formats_are_rejected_by_line(store, tmp_path):
    """Dataset JSON lengths, wandb CSV and table steps: a bad value rejects its entry, never the command."""
    folder = tmp_path / "run"
    table_folder = folder / "files" / "media" / "table"
    table_folder.mkdir(parents=True)
    (folder / "dataset.json").write_text(
        '{"1": {"input": [3, 1099511627776], "output": [5, 6]}, "2": {"input": [3], "output": [5.5]},'
        ' "3": {"input": [1], "output": [2]}, "4.0": {"input": [1], "output": [2]}}')
    (folder / "history.csv").write_text("Step,loss\n1,0.5\n5.7,0.4\n1e20,0.3\n3,0.1\n")
    (table_folder / "val_3_abc123.table.json").write_text(
        '{"columns": ["step", "input", "output"], "data": [[2147483648, "a", "b"], [5.7, "c", "d"], [3, "e", "f"]]}')
    reports = ingest_paths(store, [folder])
    assert {r.status for r in reports} == {"ingested"}
    rows = store.execute("SELECT f.format, e.line_no, e.code, e.reason FROM ingest_errors e JOIN files f USING (file_id)"
                         " ORDER BY f.format, e.line_no").fetchall()
    assert rows == [
        ("polytrace-dataset", 1, "out-of-range", "step 1: input[1]: 1099511627776 is out of range for INTEGER"),
        ("polytrace-dataset", 2, "type-error", "step 2: output[0]: expected integer, got number"),
        ("polytrace-dataset", 4, "type-error", "step key '4.0' is not an integer"),
        ("wandb-csv", 3, "type-error", "Step is not an integer: '5.7'"),
        ("wandb-csv", 4, "out-of-range", "Step is outside the step range: '1e20'"),
        ("wandb-table", 1, "out-of-range", "step is outside the step range: '2147483648'"),
        ("wandb-table", 2, "type-error", "step is not an integer: '5.7'"),
    ]
    assert store.execute("SELECT DISTINCT step FROM step_metrics ORDER BY step").fetchall() == [(1,), (3,)]
    assert store.execute("SELECT step, prompt_len, response_len FROM samples WHERE validate IS NULL OR NOT validate"
                         " ORDER BY step").fetchall() == [(3, 1, 2)]


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from polytrace_cli.ingest.jsonl import value_problem  # noqa: E402
from polytrace_cli.store import open_store  # noqa: E402

_EDGES = [2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64]
_JSON_VALUES = st.one_of(
    st.none(), st.booleans(), st.sampled_from(_EDGES), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([5.7, 3.0, -0.5, 1e20, 2147483648.0]),
    st.text(max_size=3), st.lists(st.integers(-5, 5), max_size=2),
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(step=_JSON_VALUES, tokens=_JSON_VALUES, validate=_JSON_VALUES)
def test_bulk_and_line_paths_agree_on_any_values(tmp_path_factory, empty_store_file, step, tokens, validate):
    """A reward line with arbitrary values is stored or rejected the same way alone (bulk read_json)
    and beside a bad line (per-line path), and exactly when `value_problem` says so."""
    import json as json_module

    folder = tmp_path_factory.mktemp("agree")
    record = {"step": step, "reward_time_s": 1.5, "response_sum": tokens, "validate": validate}
    line = json_module.dumps(record)
    alone = _trace(folder / "alone", line + "\n", "reward_timings_step_1.jsonl")
    beside = _trace(folder / "beside", line + "\n{oops\n", "reward_timings_step_1.jsonl")
    con = open_store(copy_store(empty_store_file, folder / "s.duckdb"))
    try:
        ingest_paths(con, [alone, beside])
        stored = con.execute("SELECT file_id, step, tokens, validate FROM rank_timings ORDER BY file_id").fetchall()
        codes = con.execute("SELECT file_id, code FROM ingest_errors WHERE line_no = 1 ORDER BY file_id").fetchall()
    finally:
        con.close()
    from polytrace_cli.ingest.formats.polytrace.reward import REQUIRED, SPEC

    expected = "missing-field" if step is None else (value_problem(record, SPEC, "") or (None,))[0]
    assert all(record.get(name) is not None for name in REQUIRED) or expected == "missing-field"
    if expected is None:
        assert [row[1:] for row in stored] == [(int(step), None if tokens is None else int(tokens), validate)] * 2
        assert codes == []
    else:
        assert stored == []
        assert [code for _, code in codes] == [expected, expected]


def test_the_error_codes_are_the_documented_vocabulary(store, tmp_path):
    from polytrace_cli.errors import ErrorCode
    from polytrace_cli.ingest.base import FileContext

    documented = (Path(__file__).resolve().parents[1] / "docs" / "errors.md").read_text()
    listed = re.findall(r"^\| `([a-z-]+)` \|", documented, flags=re.MULTILINE)
    assert listed == [code.value for code in ErrorCode] and len(ErrorCode) == 12
    ctx = FileContext(con=store, path=tmp_path, run_id=1, file_id=1, run_name="r")
    with pytest.raises(ValueError, match="unknown ingest error code"):
        ctx.reject(1, "made up", code="not-a-code")
