"""verl file logger JSONL and rollout/validation dumps."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from polytrace_cli.cli import app
from polytrace_cli.ingest.base import counting_tokens_with
from polytrace_cli.ingest.runner import ingest_paths

FIXTURES = Path(__file__).parent / "fixtures" / "verl"


def test_file_logger_nonfinite_null_strings_restart_and_rejections(store):
    [report] = ingest_paths(store, [FIXTURES / "file_logger" / "metrics.jsonl"])
    assert report.format == "verl-jsonl"
    # 7 lines: 3 stored (steps 3, 4, 1), 1 blank, 3 rejected.
    assert (report.lines, report.stored, report.ignored, report.rejected) == (7, 3, 1, 3)
    rows = store.execute(
        "SELECT segment, step, key, value, text_value, line_no FROM step_metrics ORDER BY line_no, key").fetchall()
    step3 = {r[2]: r[3:5] for r in rows if r[1] == 3}
    assert step3["timing_s/gen"] == (30.5, None)
    assert math.isnan(step3["actor/pg_loss"][0])  # bare NaN
    assert step3["critic/score/max"] == (math.inf, None)  # bare Infinity
    assert step3["critic/score/min"] == (-math.inf, None)
    assert step3["resize/mode"] == (None, "schedule")  # string values kept as text
    step4 = {r[2]: r[3:5] for r in rows if r[1] == 4}
    assert math.isnan(step4["actor/pg_loss"][0])  # null
    assert step4["training/flag"] == (1.0, "True")
    assert step4["timing_s/gen"] == (31.0, None)
    assert store.execute("SELECT line_no, reason FROM ingest_errors ORDER BY line_no").fetchall() == [
        (4, "truncated JSON (line cut short)"), (5, "field step: expected an integer"), (6, "not a JSON object")]
    assert store.execute(
        "SELECT segment, step, gen_s, step_s, has_testing, has_checkpoint, flags FROM steps ORDER BY segment, step"
    ).fetchall() == [
        (0, 3, 30.5, 60.25, False, False, ["resumed"]),
        (0, 4, 31.0, 62.0, False, True, []),
        (1, 1, 29.75, 59.0, True, False, ["restart"]),
    ]
    meta = json.loads(store.execute("SELECT meta FROM runs").fetchall()[0][0])
    assert meta["framework"] == "verl" and meta["verl_version"] == ">=0.6"


def test_file_logger_pairs_keep_their_order_lists_objects_and_a_key_written_twice(store, tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    path.parent.mkdir()
    path.write_text(
        '{"step": 1, "data": {"z/last": 1, "a/first": 2.5, "n": null, "l": [1, 2], "o": {"x": 1}, "s": "q\\"t"}}\n'
        '{"step": 2, "data": {"dup": 1, "other": 3, "dup": 2}}\n'
        '{"step": 3, "data": {}}\n'
    )
    [report] = ingest_paths(store, [path])
    assert (report.lines, report.stored, report.rejected) == (3, 3, 0)
    rows = store.execute("SELECT step, key, value, text_value FROM step_metrics ORDER BY line_no, rowid").fetchall()
    assert [row[:2] for row in rows] == [(1, "z/last"), (1, "a/first"), (1, "n"), (1, "l"), (1, "o"), (1, "s"),
                                         (2, "dup"), (2, "other"), (2, "dup")]
    values = {(step, key, value if value == value else "nan", text) for step, key, value, text in rows}
    assert values == {(1, "z/last", 1.0, None), (1, "a/first", 2.5, None), (1, "n", "nan", None),
                      (1, "l", None, "[1,2]"), (1, "o", None, '{"x":1}'), (1, "s", None, 'q"t'),
                      (2, "dup", 1.0, None), (2, "other", 3.0, None), (2, "dup", 2.0, None)}


def test_file_logger_sniffing_accepts_either_key_order(tmp_path):
    from polytrace_cli.ingest.registry import detect

    for first in ('{"step": 1, "data": {"a": 1}}', '{"data": {"a": 1}, "step": 1}'):
        path = tmp_path / "log.jsonl"
        path.write_text(first + "\n")
        assert detect(path, path.read_bytes()).name == "verl-jsonl"
    path.write_text('{"step": 1, "loss": 0.5}\n')
    found = detect(path, path.read_bytes())
    assert found is None or found.name != "verl-jsonl"


def test_rollout_dump_samples_with_estimated_lengths(store):
    reports = ingest_paths(store, [FIXTURES / "rollout"])
    assert [(Path(r.path).name, r.format, r.stored, r.rejected) for r in reports] == [
        ("7.jsonl", "verl-rollout", 3, 1), ("0.jsonl", "verl-rollout", 1, 0)]
    # ceil(chars / 4): "What is 2+2?" 12 -> 3; "The answer is 4." 16 -> 4; "5" -> 1;
    # "Name a prime number bigger than ten." 36 -> 9; "Eleven is prime; so is 13." 26 -> 7.
    assert store.execute(
        "SELECT step, prompt_idx, sample_idx, prompt_len, response_len, validate, length_estimated, score"
        " FROM samples ORDER BY validate, step, prompt_idx, sample_idx").fetchall() == [
        (7, 0, 0, 3, 4, False, True, 1.0),
        (7, 0, 1, 3, 1, False, True, 0.0),
        (7, 1, 0, 9, 7, False, True, 1.0),
        (0, 0, 0, 2, 1, True, True, 0.5),  # validation_data/0.jsonl without a step field: the file name's
    ]
    assert store.execute("SELECT line_no, reason FROM ingest_errors").fetchall() == [
        (4, "truncated JSON (line cut short)")]


def test_tokenizer_option_must_be_local(tmp_path):
    result = CliRunner().invoke(app, ["ingest", str(FIXTURES / "rollout"), "--db", str(tmp_path / "s.duckdb"),
                                      "--tokenizer", str(tmp_path / "no-such-tokenizer")])
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert "tokenizer" in result.output


def test_tokenizer_counts_replace_the_character_estimate(store, monkeypatch):
    class WordTokenizer:  # a stand-in with the Hugging Face call signature: one token per word
        def __call__(self, texts, add_special_tokens=False):
            return {"input_ids": [text.split() for text in texts]}

    with counting_tokens_with(WordTokenizer()):
        ingest_paths(store, [FIXTURES / "rollout" / "rollout_data" / "7.jsonl"])
    assert store.execute("SELECT prompt_len, response_len, length_estimated FROM samples ORDER BY prompt_idx,"
                         " sample_idx").fetchall() == [(3, 4, True), (3, 1, True), (7, 6, True)]


@pytest.mark.parametrize("name", ["7.jsonl", "12.jsonl"])
def test_rollout_sniffing_needs_step_file_name_and_text_fields(tmp_path, name):
    from polytrace_cli.ingest.registry import detect

    path = tmp_path / name
    path.write_text('{"input": "p", "output": "r", "score": 1.0, "step": 1}\n')
    assert detect(path, path.read_bytes()).name == "verl-rollout"
    other = tmp_path / "samples.jsonl"
    other.write_text('{"input": "p", "output": "r", "score": 1.0, "step": 1}\n')
    found = detect(other, other.read_bytes())
    assert found is None or found.name != "verl-rollout"


def test_reading_again_with_another_tokenizer_replaces_the_lengths(store, monkeypatch):
    class WordTokenizer:  # one token per word
        def __call__(self, texts, add_special_tokens=False):
            return {"input_ids": [text.split() for text in texts]}

    path = FIXTURES / "rollout" / "rollout_data" / "7.jsonl"
    ingest_paths(store, [path])
    estimated = store.execute("SELECT prompt_len FROM samples ORDER BY prompt_idx, sample_idx").fetchall()
    assert [r.status for r in ingest_paths(store, [path])] == ["unchanged"]
    with counting_tokens_with(WordTokenizer()):
        assert [r.status for r in ingest_paths(store, [path])] == ["replaced"]
    # The tokenizer held for that ingest only: the next one estimates from characters again.
    assert [r.status for r in ingest_paths(store, [path])] == ["replaced"]
    assert store.execute("SELECT read_options FROM files").fetchall() == [("characters/4",)]
    with counting_tokens_with(WordTokenizer()):
        ingest_paths(store, [path])
    counted = store.execute("SELECT prompt_len FROM samples ORDER BY prompt_idx, sample_idx").fetchall()
    assert counted == [(3,), (3,), (7,)] != estimated
    assert store.execute("SELECT read_options FROM files").fetchall() == [("tokenizer=WordTokenizer",)]


def _file_logger_line(step: int, data: dict) -> str:
    return json.dumps({"step": step, "data": data})


def test_file_logger_validation_and_training_line_of_one_step_are_one_step(store, tmp_path):
    path = tmp_path / "metrics.jsonl"
    train = {"timing_s/gen": 10.0, "timing_s/update_actor": 5.0, "timing_s/step": 15.5}
    path.write_text("\n".join([
        _file_logger_line(0, {"val-core/acc": 0.25}),             # validation before training
        _file_logger_line(1, train),
        _file_logger_line(1, {"val-core/acc": 0.5}),              # step 1's validation: same step
        _file_logger_line(2, train),
        _file_logger_line(2, train),                              # same keys again: a restarted job
        _file_logger_line(3, train),
        _file_logger_line(1, train),                              # step went back: a restarted job
    ]) + "\n")
    [report] = ingest_paths(store, [path])
    assert (report.lines, report.stored, report.rejected) == (7, 7, 0)
    assert store.execute("SELECT DISTINCT segment, step, line_no FROM step_metrics ORDER BY line_no").fetchall() == [
        (0, 0, 1), (0, 1, 2), (0, 1, 3), (0, 2, 4), (1, 2, 5), (1, 3, 6), (2, 1, 7)]
    assert store.execute("SELECT segment, step, flag, line_no FROM step_flags ORDER BY line_no").fetchall() == [
        (1, 2, "restart", 5), (2, 1, "restart", 7)]


def test_file_logger_records_whether_step_time_includes_testing(store, tmp_path):
    # Residual step_s - (gen + update_actor) is 0.5 s without testing; the two steps with 8 s of
    # testing have a residual of 8.5 s: testing is inside the step time. No checkpoint: cannot tell.
    path = tmp_path / "metrics.jsonl"
    lines = []
    for step in range(1, 7):
        data = {"timing_s/gen": 10.0, "timing_s/update_actor": 5.0, "timing_s/step": 15.5}
        if step % 3 == 0:
            data.update({"timing_s/testing": 8.0, "timing_s/step": 23.5})
        lines.append(_file_logger_line(step, data))
    path.write_text("\n".join(lines) + "\n")
    ingest_paths(store, [path])
    meta = json.loads(store.execute("SELECT meta FROM runs").fetchall()[0][0])
    assert meta["step_time_includes_testing"] is True
    assert "step_time_includes_checkpoint" in meta and meta["step_time_includes_checkpoint"] is None


@pytest.mark.parametrize("printed, step, code", [
    ("3.0", 3, None),
    ("2147483647", 2147483647, None),
    ("2147483648", None, "out-of-range"),
    ("-2147483649", None, "out-of-range"),
    ("1e20", None, "out-of-range"),
    ("2.5", None, "type-error"),
    ('"7"', None, "type-error"),
])
def test_file_logger_step_follows_the_step_rule_of_every_format(store, tmp_path, printed, step, code):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "data": {"a": 1}}\n{"step": %s, "data": {"a": 2}}\n' % printed)
    [report] = ingest_paths(store, [path])
    assert report.format == "verl-jsonl"
    assert store.execute("SELECT line_no, code FROM ingest_errors").fetchall() == ([] if code is None else [(2, code)])
    assert store.execute("SELECT line_no, step FROM step_metrics ORDER BY line_no").fetchall() == (
        [(1, 1)] + ([(2, step)] if code is None else []))


@pytest.mark.parametrize("blank_line", [False, True])
def test_file_logger_clean_file_read_whole_stores_what_the_line_by_line_path_stores(tmp_path, monkeypatch, blank_line):
    from polytrace_cli.ingest.formats.verl import jsonl as verl_jsonl
    from polytrace_cli.store import open_store

    lines = [json.dumps({"step": step, "data": {"timing_s/step": 10.0 + step, "timing_s/gen": 4.0, "flag": step % 2 == 0,
                                                 "mode": "sched", "lst": [1, step], "n": None, "big": 2**40}})
             for step in (1, 2, 3, 2, 3, 4)]  # a restart at the fourth line
    lines[1] = lines[1].replace('"timing_s/gen": 4.0', '"timing_s/gen": NaN, "inf": Infinity, "ninf": -Infinity')
    lines[2] = lines[2].replace('"step": 3', '"step": 3.0')
    if blank_line:
        lines.insert(3, "")
    contents, read_whole = [], []
    original = verl_jsonl._read_clean_file
    for whole in (True, False):
        def choose(ctx, whole=whole):
            read_whole.append(original(ctx) if whole else False)
            return read_whole[-1]

        monkeypatch.setattr(verl_jsonl, "_read_clean_file", choose)
        folder = tmp_path / f"whole_{whole}" / "run"
        folder.mkdir(parents=True)
        (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        con = open_store(folder.parent / "s.duckdb")
        [report] = ingest_paths(con, [folder / "metrics.jsonl"])
        contents.append((
            (report.lines, report.stored, report.ignored, report.rejected, report.rows),
            con.execute("SELECT segment, step, key, value, text_value, line_no FROM step_metrics"
                        " ORDER BY line_no, key").fetchall(),
            con.execute("SELECT segment, step, flag, detail, line_no FROM step_flags ORDER BY line_no").fetchall(),
            con.execute("SELECT meta FROM runs").fetchall()))
        con.close()
    assert read_whole == [not blank_line, False]
    assert str(contents[0]) == str(contents[1])  # NaN compares unequal to itself; its text does not
    rows = contents[0][1]
    assert len(rows) == 6 * 7 + 2 and contents[0][0][:4] == (6 + blank_line, 6, blank_line, 0)
    step2 = {key: (value, text) for segment, step, key, value, text, _ in rows if (segment, step) == (0, 2)}
    assert math.isnan(step2["timing_s/gen"][0]) and step2["inf"][0] == math.inf and step2["ninf"][0] == -math.inf
    assert math.isnan(step2["n"][0]) and step2["flag"] == (1.0, "True") and step2["lst"] == (None, "[1,2]")
    assert step2["big"] == (2.0**40, None) and step2["mode"] == (None, "sched")
    assert contents[0][2] == [(1, 2, "restart", "step went back from 3 to 2", 4 + blank_line)]


def test_file_logger_with_a_bom_keeps_its_first_line(store, tmp_path):
    text = (FIXTURES / "file_logger" / "metrics.jsonl").read_bytes()
    bom_file = tmp_path / "metrics.jsonl"
    bom_file.write_bytes(b"\xef\xbb\xbf" + text)
    [report] = ingest_paths(store, [bom_file])
    assert report.format == "verl-jsonl"
    assert (report.lines, report.stored, report.ignored, report.rejected) == (7, 3, 1, 3)
