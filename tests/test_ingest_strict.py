"""The strict typed decoder that lets DuckDB read a clean trace with its column types.

It must never accept a value the project's rule (`value_problem`) refuses, and whenever it accepts a
line, DuckDB's typed read must give the values `json_transform` gives the line's JSON text.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polytrace_cli.ingest import jsonl
from polytrace_cli.ingest.formats.polytrace.multiturn import SPEC as MULTITURN_SPEC
from polytrace_cli.ingest.formats.polytrace.packed import SPEC as PACKED_SPEC
from polytrace_cli.ingest.jsonl import NOT_JSON_LINES, duckdb_type, strict_file_records, strict_records, value_problem
from polytrace_cli.ingest.runner import ingest_paths
from polytrace_cli.store import open_store

_EDGES = [2**15, -(2**15) - 1, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**63 - 1, 2**63, -(2**63) - 1]
_SCALARS = st.one_of(
    st.none(), st.booleans(), st.sampled_from(_EDGES), st.integers(-(2**70), 2**70), st.integers(-5, 5),
    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([5.7, 3.0, -0.0, 1e20, 2147483648.0, 1e308]),
    st.text(max_size=3),
)
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["turn", "tool_name", "latency_s", "x"]), inner,
                                                 max_size=3)), max_leaves=6)
_SPECS = {"packed": PACKED_SPEC, "multiturn": MULTITURN_SPEC,
          "scalars": {"a": "SMALLINT", "b": "BIGINT", "c": "DOUBLE", "d": "BOOLEAN", "e": "VARCHAR", "f": "JSON"}}


def _record(spec: dict, data) -> dict:
    return {name: data.draw(_VALUES) for name in spec if data.draw(st.booleans())}


@settings(max_examples=300, deadline=None)
@given(spec_name=st.sampled_from(sorted(_SPECS)), data=st.data())
def test_the_strict_decoder_accepts_only_values_that_fit_and_duckdb_types_them_as_json_transform_does(spec_name, data):
    spec = _SPECS[spec_name]
    record = _record(spec, data)
    line = json.dumps(record).encode()
    accepted = strict_records(line, spec) == 1
    if not accepted:
        return
    assert value_problem(record, spec, "") is None
    con = duckdb.connect()
    columns = "{" + ", ".join(f"'{name}': '{duckdb_type(sub)}'" for name, sub in spec.items()) + "}"
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "line.jsonl"
        path.write_bytes(line + b"\n")
        typed = con.execute(f"SELECT * FROM read_json(?, format='newline_delimited', columns={columns})",
                            [str(path)]).fetchall()
    transformed = con.execute(
        "SELECT " + ", ".join(f"json_transform(json_extract(?::JSON, '$.\"{name}\"'), ?)" for name in spec),
        [value for name, sub in spec.items() for value in (line.decode(), json.dumps(sub))]).fetchall()
    assert typed == transformed


@pytest.mark.parametrize(("text", "expected"), [
    (b'{"step": 1, "output": [1, 2]}\n\n  \n{"step": 2}\n', 2),
    (b'{"step": 1}\r\n{"step": 2}', 2),
    (b'{"step": 5.0}\n', None),  # fits by the project's rule, but the decoder refuses it: the exact rule decides
    (b'{"step": "5"}\n', None),
    (b'{"step": true}\n', None),
    (b'{"step": 2147483648}\n', None),
    (b'{"output": [1, 2.5]}\n', None),
    (b'{"validate": 1}\n', None),
    (b'null\n', None),
    (b'{"step": 1\n', NOT_JSON_LINES),
])
def test_strict_records_counts_clean_lines_and_refuses_the_rest(text, expected):
    assert strict_records(text, PACKED_SPEC) == expected


def test_a_file_is_decoded_block_by_block_with_the_same_answer(tmp_path):
    path = tmp_path / "t.jsonl"
    lines = [json.dumps({"step": i, "output": list(range(i % 7))}) for i in range(500)]
    path.write_text("\n".join(lines))  # no newline after the last line
    for block in (16, 100, 1 << 20):
        assert strict_file_records(path, PACKED_SPEC, block_bytes=block) == 500
    lines[321] = lines[321].replace('"step": 321', '"step": 3.5')
    path.write_text("\n".join(lines) + "\n")
    assert strict_file_records(path, PACKED_SPEC, block_bytes=64) is None
    lines[321] = json.dumps({"step": 321})[:-3]
    path.write_text("\n".join(lines) + "\n")
    assert strict_file_records(path, PACKED_SPEC, block_bytes=64) == NOT_JSON_LINES


def _packed(step: int, index: int, outputs) -> str:
    return json.dumps({"step": step, "rank": 0, "dp_rank": 0, "tp_rank": 0, "local_index": index, "input": 7,
                       "output": outputs, "n_sampling": len(outputs), "validate": False})


def _trajectory(step: int, sample: int, completion) -> str:
    return json.dumps({"step": step, "prompt_len": 20, "max_response_len": 64, "final_response_len": 30,
                       "prompt_group_id": 0, "sample_id": sample,
                       "turns": [{"turn": 0, "prompt_tokens": 20, "completion_tokens": completion,
                                  "engine_latency_s": 0.5}],
                       "tool_calls": [{"turn": 0, "tool_name": "search", "latency_s": 1.5}]})


@pytest.fixture
def json_text_reads(monkeypatch) -> list:
    """The specs read as JSON text and checked (`_create_checked`), which is made to fail."""
    from polytrace_cli.ingest import runner

    monkeypatch.setattr(runner, "BATCH_JSON_MIN_MEAN_BYTES", 0)
    calls = []

    def refuse(*args, **kwargs):
        calls.append(args[1])
        raise duckdb.InvalidInputException("the JSON-text read was used")

    monkeypatch.setattr(jsonl, "_create_checked", refuse)
    return calls


def test_clean_step_files_in_a_batch_are_read_with_column_types(tmp_path, json_text_reads):
    """With the JSON-text read made to fail, clean files of a batch are still stored: the typed read
    stored them."""
    folder = tmp_path / "run"
    folder.mkdir()
    for step in range(3):
        lines = [_packed(step, i, [i, i + 1]) for i in range(4)]
        (folder / f"packed_lengths_step_{step}.jsonl").write_text("\n".join(lines) + "\n")
    con = open_store(tmp_path / "s.duckdb")
    try:
        reports = ingest_paths(con, [folder])
        assert [r.status for r in reports] == ["ingested"] * 3 and not json_text_reads
        assert con.execute("SELECT count(*), sum(len(response_lens)) FROM sample_groups").fetchone() == (12, 24)
    finally:
        con.close()


def test_one_trace_is_read_with_column_types_when_the_strict_pass_pays(tmp_path, json_text_reads):
    """A trace whose spec holds lists of objects, or lists of integers, is decoded strictly and read
    with its types; a spec of scalars alone is read as JSON text (cheaper for one large file); a
    value the decoder refuses (a whole number written 3.0) sends the file to the JSON-text read."""
    folder = tmp_path / "run"
    folder.mkdir()
    trace = folder / "multiturn_workload_step_0.jsonl"
    trace.write_text("\n".join(_trajectory(0, sample, 10 + sample) for sample in range(4)) + "\n")
    con = open_store(tmp_path / "s.duckdb")
    try:
        assert [r.status for r in ingest_paths(con, [trace])] == ["ingested"] and not json_text_reads
        assert con.execute("SELECT count(*), sum(completion_tokens) FROM turns").fetchone() == (4, 46)
        assert jsonl.strict_pass_pays(MULTITURN_SPEC) and jsonl.strict_pass_pays(PACKED_SPEC)
        assert not jsonl.strict_pass_pays({"a": "INTEGER", "b": ["VARCHAR"], "c": "DOUBLE"})
        packed = folder / "packed_lengths_step_0.jsonl"
        packed.write_text(_packed(0, 0, [1, 2]) + "\n")
        ingest_paths(con, [packed])
        assert not json_text_reads
        packed.write_text(_packed(0, 0, [1, 2]).replace("[1, 2]", "[1, 2.0]") + "\n")
        ingest_paths(con, [packed])
        assert json_text_reads and all(spec is PACKED_SPEC for spec in json_text_reads)
        assert con.execute("SELECT response_lens FROM sample_groups").fetchall() == [([1, 2],)]
        trace.write_text(_trajectory(0, 0, 3.0) + "\n")
        ingest_paths(con, [trace])
        assert json_text_reads[-1] is MULTITURN_SPEC
    finally:
        con.close()


def test_lines_the_decoder_reads_otherwise_than_duckdb_are_still_judged_line_by_line(tmp_path):
    """The decoder reads two objects on one line, or one object over two lines, as JSON lines; DuckDB
    does not, so such a file never takes the typed read and its lines are named as before."""
    folder = tmp_path / "run"
    folder.mkdir()
    good = [_packed(0, i, [3, 4]) for i in range(3)]
    (folder / "packed_lengths_step_0.jsonl").write_text("\n".join([good[0], good[1] + " " + good[2]]) + "\n")
    (folder / "packed_lengths_step_1.jsonl").write_text("\n".join([good[0], good[1].replace(", ", ",\n", 1)]) + "\n")
    con = open_store(tmp_path / "s.duckdb")
    try:
        ingest_paths(con, [folder])
        files = con.execute("SELECT lines, stored, ignored, rejected FROM files ORDER BY path").fetchall()
        codes = con.execute("SELECT line_no, code FROM ingest_errors e JOIN files f USING (file_id)"
                            " ORDER BY f.path, line_no").fetchall()
    finally:
        con.close()
    assert files == [(2, 1, 0, 1), (3, 1, 0, 2)]
    assert codes == [(2, "invalid-json"), (2, "invalid-json"), (3, "invalid-json")]


_LIST_SPECS = {"packed": PACKED_SPEC, "small": {"s": ["SMALLINT"], "b": ["BIGINT"], "x": "SMALLINT"}}
_LIST_INTEGERS = st.one_of(st.integers(-5, 300), st.sampled_from(_EDGES + [9999, 10**4, 32767, 32768, -32769]))
_LIST_ITEMS = st.one_of(_LIST_INTEGERS, st.none(), st.booleans(), st.sampled_from([2.5, 1e5, 3.0, "7"]),
                        st.lists(st.integers(0, 3), max_size=2))
# Mostly lists of integers only (the fast check's own case), sometimes lists with anything in them.
_LISTS = st.one_of(st.lists(_LIST_INTEGERS, max_size=4), st.lists(_LIST_INTEGERS, max_size=4),
                   st.lists(_LIST_ITEMS, max_size=4), st.none())


def _exact_verdict(data: bytes, spec: dict) -> int | None:
    """What the exact strict decoder (every list item decoded as a Python value) says of `data`."""
    import msgspec

    try:
        return len(jsonl._strict_decoders(spec).exact.decode_lines(data))
    except msgspec.ValidationError:
        return None
    except msgspec.DecodeError:
        return NOT_JSON_LINES


@settings(max_examples=200, deadline=None)
@given(spec_name=st.sampled_from(sorted(_LIST_SPECS)), data=st.data())
def test_integer_lists_read_as_raw_text_get_the_exact_decoders_verdict(spec_name, data):
    spec = _LIST_SPECS[spec_name]
    lists = [name for name, sub in spec.items() if isinstance(sub, list)]
    lines = []
    for _ in range(data.draw(st.integers(1, 4))):
        record = {name: data.draw(_LISTS) for name in lists
                  if data.draw(st.integers(0, 5))}
        if "step" in spec:
            record["step"] = data.draw(st.integers(0, 9))
        separators = data.draw(st.sampled_from([(", ", ": "), (",", ":"), (" ,\t", " : ")]))
        lines.append(json.dumps(record, separators=separators).encode())
    text = b"\n".join(lines) + b"\n"
    assert strict_records(text, spec) == _exact_verdict(text, spec)
