"""Many small step files read as one batch store exactly what reading them one by one stores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import copy_store
from polytrace_cli.ingest import batch as batching
from polytrace_cli.ingest import jsonl
from polytrace_cli.ingest.base import file_owned_tables
from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.store import open_store


def packed_line(step: int, index: int, dp_rank: int = 0, outputs=(5, 6, 7)) -> str:
    return json.dumps({"step": step, "rank": dp_rank * 4, "dp_rank": dp_rank, "tp_rank": 0, "local_index": index,
                       "input": 10 + index, "output": list(outputs), "n_sampling": len(outputs), "validate": False})


def multiturn_line(step: int, group: int, sample: int) -> str:
    return json.dumps({
        "step": step, "prompt_len": 20, "max_response_len": 64, "final_response_len": 30 + sample,
        "finish_reason": "stop", "prompt_group_id": group, "sample_id": sample,
        "turns": [{"turn": 0, "prompt_tokens": 20, "completion_tokens": 12, "finish_reason": "tool_calls",
                   "tool_call_count": 1, "engine_latency_s": 0.25},
                  {"turn": 1, "prompt_tokens": 40, "completion_tokens": 18, "finish_reason": "stop"}],
        "tool_calls": [{"turn": 0, "tool_name": "search", "query_count": 1, "latency_s": 1.5, "status": "ok"}],
    })


def write_run(folder: Path, steps: int = 24) -> list[Path]:
    """Packed step files (some with blank lines, one without a final newline, dp ranks varying by step)
    and merged and per-rank multi-turn step files."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for step in range(steps):
        lines = [packed_line(step, i, dp_rank=i % (1 + step % 3)) for i in range(3 + step % 4)]
        if step % 5 == 0:
            lines.insert(1, "")
        path = folder / f"packed_lengths_step_{step}.jsonl"
        path.write_text("\n".join(lines) + ("" if step == 7 else "\n"))
        paths.append(path)
    for step in range(6):
        path = folder / f"multiturn_workload_step_{step}.jsonl"
        path.write_text("\n".join(multiturn_line(step, g, s) for g in range(2) for s in range(2)) + "\n")
        paths.append(path)
        ranked = folder / f"multiturn_workload_step_{step}_rank_{step % 2}.jsonl"
        ranked.write_text(json.dumps({"step": step, "prompt_len": 5, "final_response_len": 9, "batch_data_id": 3,
                                      "rollout_offset": step, "turns": []}) + "\n")
        paths.append(ranked)
    return paths


def store_contents(con) -> dict[str, list[tuple]]:
    """Every file-owned table keyed by file path instead of file_id (and how many of its rows belong to
    no file), plus `files` and `runs`."""
    contents = {}
    for table in file_owned_tables(con):
        contents[table] = con.execute(
            f"SELECT f.path, t.* EXCLUDE (file_id) FROM {table} t JOIN files f USING (file_id) ORDER BY ALL"
        ).fetchall()
        contents[f"{table} rows of no file"] = con.execute(
            f"SELECT count(*) FROM {table} WHERE file_id NOT IN (SELECT file_id FROM files)").fetchone()[0]
    contents["files"] = con.execute(
        "SELECT * EXCLUDE (file_id, seconds, ingested_at) FROM files ORDER BY path").fetchall()
    contents["runs"] = con.execute("SELECT name, framework, task, source_dir, meta FROM runs ORDER BY name").fetchall()
    return contents


@pytest.fixture
def batch_reads(monkeypatch) -> list[int]:
    """The number of files in each batch read, into `records` or straight into the format's table."""
    sizes = []
    read, insert = jsonl.load_batch_records, jsonl.insert_typed_rows

    def counting(con, paths, *args, **options):
        sizes.append(len(paths))
        return read(con, paths, *args, **options)

    def counting_insert(con, paths, ingester):
        sizes.append(len(paths))
        return insert(con, paths, ingester)

    monkeypatch.setattr(batching, "load_batch_records", counting)
    monkeypatch.setattr(batching, "insert_typed_rows", counting_insert)
    return sizes


@pytest.fixture(params=["as text lines", "as JSON records"])
def read_kind(request, monkeypatch) -> str:
    """Each test runs with batches read both ways (the choice is by the files' mean size)."""
    monkeypatch.setattr(batching, "BATCH_JSON_MIN_MEAN_BYTES", 1 << 40 if request.param == "as text lines" else 0)
    monkeypatch.setattr(batching, "BATCH_OVERLAP_MIN_BYTES", 0)  # decoded beside the read, as large batches are
    return request.param


def test_a_batch_stores_exactly_what_file_by_file_ingest_stores(tmp_path, batch_reads, read_kind):
    write_run(tmp_path / "run_a")
    batched = open_store(tmp_path / "batched.duckdb")
    alone = open_store(tmp_path / "alone.duckdb")
    try:
        reports = ingest_paths(batched, [tmp_path / "run_a"], task="math")
        assert batch_reads == [12, 24]  # the multi-turn files sort first, then the packed ones
        assert {r.status for r in reports} == {"ingested"}
        ingest_paths(alone, [tmp_path / "run_a"], task="math", batch=False)
        assert len(batch_reads) == 2
        expected = store_contents(alone)
        assert store_contents(batched) == expected
        assert len(expected["sample_groups"]) > 0 and len(expected["turns"]) == 6 * 4 * 2
        assert len(expected["ignored_lines"]) == 5  # the packed steps 0, 5, 10, 15, 20 have a blank line
        assert batched.execute("SELECT sum(lines) = sum(stored) + sum(ignored) + sum(rejected) FROM files").fetchone()[0]
        assert [r.path for r in reports] == sorted(r.path for r in reports)
    finally:
        batched.close()
        alone.close()


def test_a_bad_file_in_a_batch_does_not_block_the_others(store, tmp_path, batch_reads, read_kind):
    paths = write_run(tmp_path / "run_b")
    out_of_range = paths[3]
    out_of_range.write_text(packed_line(3, 0) + "\n" + packed_line(3, 1, outputs=(5, 2**40)) + "\n")
    cut_short = paths[9]
    cut_short.write_text(packed_line(9, 0) + "\n" + packed_line(9, 1)[:-1] + "\n" + packed_line(9, 2) + "\n")
    reports = ingest_paths(store, [tmp_path / "run_b"])
    assert len(reports) == len(paths) and not any(r.failed for r in reports)
    # The file with a line that is not JSON leaves the batch once the read finds it; read typed, so does the
    # file the strict decoder refused.
    assert batch_reads[-1] == (22 if read_kind == "as JSON records" else 24)
    errors = store.execute(
        "SELECT f.path, e.line_no, e.code, e.reason FROM ingest_errors e JOIN files f USING (file_id) ORDER BY 1"
    ).fetchall()
    assert errors == [
        (str(out_of_range.resolve()), 2, "out-of-range", "field output[1]: 1099511627776 is out of range for INTEGER"),
        (str(cut_short.resolve()), 2, "invalid-json", "truncated JSON (line cut short)"),
    ]
    assert store.execute("SELECT lines, stored, rejected FROM files WHERE path = ?",
                         [str(cut_short.resolve())]).fetchall() == [(3, 2, 1)]
    assert store.execute("SELECT count(*) FROM files").fetchone()[0] == len(paths)
    untouched = store.execute("SELECT count(*) FROM sample_groups g JOIN files f USING (file_id)"
                              " WHERE f.path NOT IN (?, ?)", [str(out_of_range.resolve()), str(cut_short.resolve())])
    assert untouched.fetchone()[0] == sum(3 + step % 4 for step in range(24) if step not in (3, 9))


def test_a_small_file_that_is_not_utf8_is_read_alone_without_failing_the_batch(store, tmp_path, batch_reads,
                                                                              read_kind):
    paths = write_run(tmp_path / "run_c", steps=20)
    latin = paths[11]
    latin.write_bytes((packed_line(11, 0) + "\n").encode() + b'{"note": "caf\xe9"}\n')
    reports = ingest_paths(store, [tmp_path / "run_c"])
    assert not any(r.failed for r in reports)
    assert batch_reads == [12, 3, 16]  # the packed steps sort 0, 1, 10, 11 (read alone), 12 ... 19, 2 ... 9
    assert store.execute("SELECT f.path, e.line_no, e.code FROM ingest_errors e JOIN files f USING (file_id)"
                         ).fetchall() == [(str(latin.resolve()), 2, "encoding-error")]
    assert store.execute("SELECT count(*) FROM files WHERE rejected = 0").fetchone()[0] == len(paths) - 1


def test_a_large_file_that_is_not_utf8_is_found_by_splitting_the_batch(store, tmp_path, batch_reads, read_kind):
    paths = write_run(tmp_path / "run_c", steps=20)
    latin = paths[11]
    good = "".join(packed_line(11, index) + "\n" for index in range(1, 600))
    assert len(good) > batching.BATCH_TEXT_KEEP_BYTES
    latin.write_bytes((packed_line(11, 0) + "\n").encode() + b'{"note": "caf\xe9"}\n' + good.encode())
    reports = ingest_paths(store, [tmp_path / "run_c"])
    assert not any(r.failed for r in reports)
    assert batch_reads[:2] == [12, 20] and len(batch_reads) > 2  # the failed read was split
    assert store.execute("SELECT f.path, e.line_no, e.code FROM ingest_errors e JOIN files f USING (file_id)"
                         ).fetchall() == [(str(latin.resolve()), 2, "encoding-error")]
    assert store.execute("SELECT lines, stored, rejected FROM files WHERE path = ?",
                         [str(latin.resolve())]).fetchall() == [(601, 600, 1)]
    assert store.execute("SELECT count(*) FROM files WHERE rejected = 0").fetchone()[0] == len(paths) - 1


def test_reingest_of_a_batch_is_skipped_file_by_file_and_a_changed_file_replaces_only_its_rows(
        store, tmp_path, batch_reads):
    paths = write_run(tmp_path / "run_d")
    ingest_paths(store, [tmp_path / "run_d"])
    before = store_contents(store)
    ids_before = dict(store.execute("SELECT path, file_id FROM files").fetchall())

    again = ingest_paths(store, [tmp_path / "run_d"])
    assert {r.status for r in again} == {"unchanged"}
    assert store_contents(store) == before

    changed = paths[5]
    changed.write_text(packed_line(5, 0, outputs=(1, 2)) + "\n")
    third = ingest_paths(store, [tmp_path / "run_d"])
    status = {Path(r.path).name: r.status for r in third}
    assert status.pop(changed.name) == "replaced"
    assert set(status.values()) == {"unchanged"}
    after = store_contents(store)
    key = str(changed.resolve())
    assert [row for row in after["sample_groups"] if row[0] == key] == [
        (key, 1, 5, 0, 0, 0, 0, 10, False, [1, 2], 2)]  # n_sampling last (added by a later migration)
    assert [row for row in after["sample_groups"] if row[0] != key] == [
        row for row in before["sample_groups"] if row[0] != key]
    ids_after = dict(store.execute("SELECT path, file_id FROM files").fetchall())
    assert {p: i for p, i in ids_after.items() if p != key} == {p: i for p, i in ids_before.items() if p != key}
    assert ids_after[key] != ids_before[key]


def test_the_command_summarises_many_files_per_run_format_and_status(tmp_path):
    from typer.testing import CliRunner

    from polytrace_cli.cli import app

    folder = tmp_path / "fleet"
    folder.mkdir()
    for step in range(250):
        (folder / f"packed_lengths_step_{step}.jsonl").write_text(packed_line(step, 0) + "\n")
    (folder / "packed_lengths_step_250.jsonl").write_text(packed_line(250, 0)[:-1] + "\n")
    result = CliRunner().invoke(app, ["ingest", str(folder), "--db", str(tmp_path / "s.duckdb")])
    assert result.exit_code == 0, result.output
    assert "251 files" in result.output  # one row: run fleet, polytrace-packed, ingested
    assert "packed_lengths_step_" not in result.output
    assert "251 file(s), 750 rows, 1 rejected lines" in result.output
    listed = CliRunner().invoke(app, ["ingest", str(folder), "--db", str(tmp_path / "s.duckdb"), "--json"])
    assert len(json.loads(listed.stdout)) == 251


@pytest.mark.parametrize("line, code", [("null", "not-an-object"), ("5", "not-an-object"), ("{}", "missing-field")])
def test_a_line_that_is_no_record_is_rejected_whichever_way_the_batch_is_read(store, tmp_path, read_kind, line, code):
    paths = write_run(tmp_path / "run_e", steps=8)
    odd = paths[2]
    odd.write_text(packed_line(2, 0) + "\n" + line + "\n" + packed_line(2, 1) + "\n")
    reports = ingest_paths(store, [tmp_path / "run_e"])
    assert not any(r.failed for r in reports)
    assert store.execute("SELECT e.line_no, e.code FROM ingest_errors e JOIN files f USING (file_id)").fetchall() == [
        (2, code)]
    assert store.execute("SELECT lines, stored, rejected FROM files WHERE path = ?",
                         [str(odd.resolve())]).fetchall() == [(3, 2, 1)]


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from polytrace_cli.ingest.formats.polytrace.packed import SPEC as PACKED_SPEC  # noqa: E402
from polytrace_cli.ingest.jsonl import value_problem  # noqa: E402

_ITEMS = st.one_of(st.integers(-5, 5), st.sampled_from([2**31 - 1, 2**31, -(2**31), 999_999_999, 10**9, 2**40]),
                   st.sampled_from([5.0, 5.7, 1e2, -0.0, True, None, "7", [1]]))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(step=st.one_of(st.integers(0, 3), st.sampled_from([2.0, 2.5, "2", True, 2**31, 10**9 - 1])),
       output=st.lists(_ITEMS, min_size=1, max_size=3), json_read=st.booleans())
def test_a_batch_stores_a_line_exactly_when_the_per_line_rule_accepts_it(tmp_path_factory, monkeypatch, empty_store_file,
                                                                          step, output, json_read):
    """Whichever way a batch is read, an odd line is stored as its values or its file is read alone
    and the line rejected with the code `value_problem` gives (checks aside)."""
    monkeypatch.setattr(batching, "BATCH_JSON_MIN_MEAN_BYTES", 0 if json_read else 1 << 40)
    folder = tmp_path_factory.mktemp("agree") / "run"
    folder.mkdir()
    record = {"step": step, "rank": 0, "dp_rank": 0, "tp_rank": 0, "local_index": 0, "input": 10, "output": output,
              "n_sampling": len(output), "validate": False}
    for index in range(3):
        lines = [packed_line(index, 0), json.dumps(record) if index == 1 else packed_line(index, 1)]
        (folder / f"packed_lengths_step_{index}.jsonl").write_text("\n".join(lines) + "\n")
    con = open_store(copy_store(empty_store_file, folder.parent / "s.duckdb"))
    try:
        ingest_paths(con, [folder])
        odd = con.execute("SELECT g.step, g.response_lens FROM sample_groups g JOIN files f USING (file_id)"
                          " WHERE f.path LIKE '%step_1.jsonl' AND g.prompt_idx = 0 AND g.prompt_len = 10"
                          " AND g.response_lens <> [5, 6, 7]").fetchall()
        codes = [code for (code,) in con.execute("SELECT code FROM ingest_errors").fetchall()]
        assert con.execute("SELECT sum(stored + rejected) FROM files").fetchone()[0] == 6
    finally:
        con.close()
    problem = value_problem(record, PACKED_SPEC, "")
    if problem is None and None not in output and min(output) >= 0:
        assert codes == [] and odd == [(int(step), [int(item) for item in output])]
    elif problem is not None:
        assert codes == [problem[0]] and odd == []


def test_line_endings_white_space_lines_and_a_bom_are_read_as_file_by_file_ingest_reads_them(tmp_path, read_kind):
    run = tmp_path / "run_f"
    run.mkdir()
    for step in range(6):
        lines = [packed_line(step, i) for i in range(4)]
        text = {1: "\r\n".join(lines) + "\r\n",
                2: "\n".join(lines[:2]) + "\n   \n\t\n" + "\n".join(lines[2:]) + "\n",
                3: "\ufeff" + "\n".join(lines) + "\n",
                4: "\n".join(lines)}.get(step, "\n".join(lines) + "\n")
        (run / f"packed_lengths_step_{step}.jsonl").write_text(text)
    stores = {}
    for batch in (True, False):
        con = open_store(tmp_path / f"batch_{batch}.duckdb")
        reports = ingest_paths(con, [run], batch=batch)
        stores[batch] = ([(Path(r.path).name, r.lines, r.stored, r.ignored, r.rejected) for r in reports],
                         store_contents(con))
        con.close()
    assert stores[True] == stores[False]
    assert stores[True][0][2] == ("packed_lengths_step_2.jsonl", 6, 4, 2, 0)  # two white-space lines ignored
    assert stores[True][0][3] == ("packed_lengths_step_3.jsonl", 4, 4, 0, 0)  # a BOM before line 1 is not part of it


@pytest.mark.parametrize("dirt", ["clean", "bad line", "not UTF-8"])
def test_a_bom_before_a_files_first_line_costs_no_line(tmp_path, dirt):
    """Every single-file path (DuckDB's whole-file read, the bad-region search, the per-line
    fallback for a file that is not all UTF-8) stores the first line of a file that starts with a
    UTF-8 byte order mark, as it stores its twin without one."""
    lines = [packed_line(1, i).encode() for i in range(5)]
    if dirt == "bad line":
        lines[2] = b'{"step": 1, "truncated'
    elif dirt == "not UTF-8":
        lines[2] = b"\xff\xfe not text"
    stores = {}
    for bom in (b"", b"\xef\xbb\xbf"):
        folder = tmp_path / ("bom" if bom else "plain")
        folder.mkdir()
        (folder / "packed_lengths_step_1.jsonl").write_bytes(bom + b"\n".join(lines) + b"\n")
        con = open_store(tmp_path / f"{folder.name}.duckdb")
        [report] = ingest_paths(con, [folder])
        stores[bool(bom)] = ((report.lines, report.stored, report.rejected),
                             con.execute("SELECT * EXCLUDE (file_id) FROM sample_groups ORDER BY ALL").fetchall(),
                             con.execute("SELECT line_no, code FROM ingest_errors ORDER BY line_no").fetchall())
        con.close()
    assert stores[True] == stores[False]
    assert stores[True][0] == ((5, 5, 0) if dirt == "clean" else (5, 4, 1))
    assert len(stores[True][1]) == stores[True][0][1]


@pytest.mark.parametrize("overlap", [True, False], ids=["decoded beside the read", "decoded first"])
@pytest.mark.parametrize("lax_files", [1, 12])
def test_files_the_strict_decoder_refuses_are_stored_as_file_by_file_ingest_stores_them(tmp_path, monkeypatch,
                                                                                      lax_files, overlap):
    """5.0 for an integer fits the project's rule but not the strict decoder: one such file leaves the
    typed batch read and is loaded alone; when more than a quarter of the files are such, the whole
    batch is read as JSON text and checked (decoded first, without a typed read). Either way the
    store is the file-by-file store."""
    monkeypatch.setattr(batching, "BATCH_JSON_MIN_MEAN_BYTES", 0)
    monkeypatch.setattr(batching, "BATCH_OVERLAP_MIN_BYTES", 0 if overlap else 1 << 40)
    typed_reads = []
    typed, insert = jsonl._create_typed_from_json, jsonl.insert_typed_rows
    monkeypatch.setattr(jsonl, "_create_typed_from_json",
                        lambda con, paths, *args, **kw: typed_reads.append(len(paths)) or typed(con, paths, *args, **kw))
    monkeypatch.setattr(batching, "insert_typed_rows",
                        lambda con, paths, ingester: typed_reads.append(len(paths)) or insert(con, paths, ingester))
    paths = write_run(tmp_path / "run_c")[:24]
    paths[23].write_text(paths[23].read_text() + packed_line(23, 9)[:-2] + "\n")  # and a line that is not JSON
    for path in paths[:lax_files]:
        # and a string for an integer, which DuckDB's typed read would take as the integer: the rule rejects it
        path.write_text(path.read_text().replace('"input": 1', '"input": 1.0E1, "was": 1')
                        .replace('"local_index": 0', '"local_index": "0"'))
    batched, alone = open_store(tmp_path / "batched.duckdb"), open_store(tmp_path / "alone.duckdb")
    try:
        reports = ingest_paths(batched, [tmp_path / "run_c"])
        assert {r.status for r in reports} == {"ingested"}
        ingest_paths(alone, [tmp_path / "run_c"], batch=False)
        assert store_contents(batched) == store_contents(alone)
        assert batched.execute("SELECT count(*) FROM ingest_errors").fetchone()[0] == lax_files + 1
        prompts = batched.execute("SELECT sum(prompt_len), count(*) FROM sample_groups").fetchone()
        assert prompts[1] > 24 and prompts == alone.execute("SELECT sum(prompt_len), count(*) FROM sample_groups").fetchone()
        # Beside the decoder all 24 packed files are read typed (the read fails on the line that is not
        # JSON); the 22 the decoder accepts are read typed again only when few enough are refused.
        assert (24 in typed_reads) == overlap and (22 in typed_reads) == (lax_files == 1)
    finally:
        batched.close()
        alone.close()


def test_a_batch_whose_every_file_holds_a_line_that_is_not_json_is_read_file_by_file(store, tmp_path, read_kind):
    folder = tmp_path / "run_d"
    folder.mkdir()
    for step in range(5):
        (folder / f"packed_lengths_step_{step}.jsonl").write_text(
            packed_line(step, 0) + "\n" + packed_line(step, 1)[:-3] + "\n" + packed_line(step, 2) + "\n")
    reports = ingest_paths(store, [folder])
    assert [(r.status, r.lines, r.stored, r.rejected) for r in reports] == [("ingested", 3, 2, 1)] * 5
    assert store.execute("SELECT count(*), count(DISTINCT file_id) FROM sample_groups").fetchone() == (10, 5)
    assert store.execute("SELECT DISTINCT line_no, code FROM ingest_errors").fetchall() == [(2, "invalid-json")]


def test_a_line_nested_past_the_decoders_depth_leaves_only_its_file_out_of_the_batch(store, tmp_path, read_kind):
    paths = write_run(tmp_path / "run_e")
    deep = '{"step": 4, "input": 5, "output": ' + "[" * 100_000 + "]" * 100_000 + "}"
    paths[4].write_text(packed_line(4, 0) + "\n" + deep + "\n")
    reports = ingest_paths(store, [tmp_path / "run_e"])
    assert len(reports) == len(paths) and not any(r.failed for r in reports)
    errors = store.execute("SELECT f.path, e.line_no, e.code FROM ingest_errors e JOIN files f USING (file_id)").fetchall()
    assert errors == [(str(paths[4].resolve()), 2, "invalid-json")]


def test_packed_files_read_straight_into_their_table_store_what_file_by_file_ingest_stores(tmp_path, monkeypatch,
                                                                                          fresh_store):
    """A batch of packed files is read straight into `sample_groups` and checked there: a file missing a
    required field, failing a check (no response, a negative length) or refused by the strict decoder has
    its rows deleted before the commit and is read alone; a file of blank lines and a file that replaces
    its earlier version are stored by the batch. Both stores match, before and after the change."""
    monkeypatch.setattr(batching, "BATCH_JSON_MIN_MEAN_BYTES", 0)
    monkeypatch.setattr(batching, "BATCH_OVERLAP_MIN_BYTES", 0)
    direct, table_writes = [], []
    insert = jsonl.insert_typed_rows
    monkeypatch.setattr(batching, "insert_typed_rows",
                        lambda con, paths, ingester: direct.append(len(paths)) or insert(con, paths, ingester))
    paths = write_run(tmp_path / "run_g", steps=12)[:12]
    odd = {2: packed_line(2, 0) + "\n" + '{"step": 2, "input": 3}' + "\n",  # no output
           4: packed_line(4, 0) + "\n" + packed_line(4, 1, outputs=()) + "\n",  # no response
           6: packed_line(6, 0).replace('"input": 10', '"input": -1') + "\n",  # negative length
           8: packed_line(8, 0) + "\n" + packed_line(8, 1).replace('"step": 8', '"step": "8"') + "\n"}  # refused
    for step, text in odd.items():
        paths[step].write_text(text)
    batched, alone = open_store(fresh_store(tmp_path / "batched.duckdb")), open_store(fresh_store(tmp_path / "alone.duckdb"))
    try:
        before = {key: con.execute("SELECT count(*) FROM sample_groups").fetchone()[0] for key, con in
                  (("batched", batched), ("alone", alone))}
        assert before == {"batched": 0, "alone": 0}
        reports = ingest_paths(batched, [tmp_path / "run_g"])
        assert direct == [12] and {r.status for r in reports} == {"ingested"}
        ingest_paths(alone, [tmp_path / "run_g"], batch=False)
        assert store_contents(batched) == store_contents(alone)
        codes = batched.execute("SELECT f.path, e.code FROM ingest_errors e JOIN files f USING (file_id) ORDER BY 1").fetchall()
        assert codes == [(str(paths[2].resolve()), "missing-field"), (str(paths[4].resolve()), "constraint-error"),
                         (str(paths[6].resolve()), "constraint-error"), (str(paths[8].resolve()), "type-error")]
        assert batched.execute("SELECT count(*) FROM sample_groups WHERE n_sampling = len(response_lens)").fetchone()[0] \
            == batched.execute("SELECT count(*) FROM sample_groups").fetchone()[0] > 0
        paths[5].write_text(packed_line(5, 0, outputs=(1, 2)) + "\n\n")
        paths[7].write_text(packed_line(7, 0) + "\n" + packed_line(7, 1, outputs=(4, -4)) + "\n")
        for con, batch in ((batched, True), (alone, False)):
            again = ingest_paths(con, [tmp_path / "run_g"], batch=batch)
            assert {Path(r.path).name: r.status for r in again if r.status != "unchanged"} == {
                paths[5].name: "replaced", paths[7].name: "replaced"}
        assert direct == [12, 2]
        assert store_contents(batched) == store_contents(alone)
        assert batched.execute("SELECT response_lens FROM sample_groups JOIN files f USING (file_id) WHERE f.path = ?",
                               [str(paths[5].resolve())]).fetchall() == [([1, 2],)]
    finally:
        batched.close()
        alone.close()
