"""A log ingested as it grows ends as one ingest of the final file: same rows, line numbers, counts."""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import replace
from pathlib import Path

import duckdb
import pytest

from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.store import open_store
from polytrace_cli.semantics.record import FIELDS
from polytrace_cli.workload.distributions import LengthModel, Marginal
from polytrace_cli.workload.steplog import Injection, StepTimeModel, console_text, jsonl_text, step_table
from polytrace_cli.workload.synth import WorkloadSpec

LENGTHS = LengthModel(prompt=Marginal("lognorm", {"s": 0.2, "scale": 100.0}),
                      response=Marginal("lognorm", {"s": 0.5, "scale": 800.0}))
SPEC = WorkloadSpec(task="math", steps=30, batch=16, n=4, dp_ranks=4, max_response_len=4500, drift=0.005, seed=11)
# A validation every 10 steps, checkpoints, a job restarted from its step-15 checkpoint, a long tail.
MODEL = StepTimeModel(validate_every=10, checkpoint_every=12, resume_after=15, injections=(Injection(20, "long_tail"),))
BAD_LINE = "step:7.5 - critic/score/mean:0.5\n"

# Per table, the columns that must match (ids and timings differ between two stores).
COMPARED = {
    "files": "path, sha256, bytes, format, format_version, parser_version, lines, stored, ignored, rejected, rows,"
             " complete_bytes",
    "step_metrics": "segment, step, key, value, text_value, line_no",
    "step_flags": "segment, step, flag, detail, line_no",
    "ignored_lines": "rule, lines",
    "ingest_errors": "line_no, reason, raw, code",
    "runs": "name, framework, meta",
    "run_semantics": ", ".join(FIELDS),
    "step_facts": "segment, step, canonical, value, pairs, validation_only",
    "step_facts_files": "pairs, last_line, catalog",
}


def store_rows(con: duckdb.DuckDBPyConnection) -> dict[str, list[tuple]]:
    """Every compared table's rows, sorted (a NaN as the text 'NaN', which equals itself)."""
    def comparable(value):
        return "NaN" if isinstance(value, float) and math.isnan(value) else value

    return {table: [tuple(map(comparable, row)) for row in
                    con.execute(f"SELECT {columns} FROM {table} ORDER BY ALL").fetchall()]
            for table, columns in COMPARED.items()}


# Generated once per worker in well under a second: the tests need not queue on one worker.
CHEAP_SHARED_FIXTURES = {"log_text", "jsonl_log", "trl_log"}


@pytest.fixture(scope="module")
def log_text() -> bytes:
    text = console_text(step_table(LENGTHS, SPEC, MODEL), SPEC, MODEL)
    lines = text.splitlines(keepends=True)
    lines.insert(40, BAD_LINE)  # a step that is not a whole number: rejected with its line number
    return "".join(lines).encode()


def one_shot(db: Path, log: Path, text: bytes) -> dict[str, list[tuple]]:
    """The store's rows after one ingest of `text` written at `log`, into a new store `db`."""
    log.write_bytes(text)
    con = open_store(db)
    try:
        ingest_paths(con, [log], run_name="r")
        return store_rows(con)
    finally:
        con.close()


def test_a_log_grown_at_random_cuts_ends_as_one_ingest(tmp_path, log_text):
    log = tmp_path / "grown" / "run" / "train.log"
    log.parent.mkdir(parents=True)
    con = open_store(tmp_path / "grown.duckdb")
    cuts = sorted(random.Random(3).sample(range(1, len(log_text)), 20)) + [len(log_text)]
    statuses = []
    for cut in cuts:  # most cuts fall inside a line: that line is read once it is finished
        log.write_bytes(log_text[:cut])
        (report,) = ingest_paths(con, [log], run_name="r", complete_lines=True)
        statuses.append((cut, report.status))
        stored_bytes = con.execute("SELECT bytes FROM files").fetchall()[0][0]
        assert stored_bytes == log_text[:cut].rfind(b"\n") + 1
    # Until a metric line is stored there is no state to go on from: the few lines are read again.
    first_metric_end = log_text.index(b"\n", log_text.index(b"step:1 -")) + 1
    first_with_state = next(i for i, (cut, _) in enumerate(statuses) if cut >= first_metric_end)
    after = [status for _, status in statuses[first_with_state + 1:]]
    assert set(after) <= {"appended", "unchanged"} and after.count("appended") >= 12, statuses
    rows = store_rows(con)
    con.close()
    expected = one_shot(tmp_path / "once.duckdb", log, log_text)
    assert rows == expected
    assert [line for line, *_ in rows["ingest_errors"]] == [41]
    assert any(flag == "restart" for _, _, flag, _, _ in rows["step_flags"])


def test_an_appended_ingest_reads_only_the_new_lines(tmp_path, log_text):
    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    half = log_text[: log_text.rfind(b"\n", 0, len(log_text) // 2) + 1]
    log.write_bytes(half)
    con = open_store(tmp_path / "s.duckdb")
    (first,) = ingest_paths(con, [log], run_name="r")
    log.write_bytes(log_text)
    (second,) = ingest_paths(con, [log], run_name="r")
    assert (first.status, second.status) == ("ingested", "appended")
    assert second.bytes == len(log_text) - len(half)
    assert second.lines == log_text.count(b"\n") - half.count(b"\n")
    half_lines = half.count(b"\n")
    assert second.notes[0] == f"read from byte {len(half):,} (line {half_lines + 1:,}) on"
    (third,) = ingest_paths(con, [log], run_name="r")
    assert third.status == "unchanged"
    con.close()


def ingested(tmp_path: Path, text: bytes, name: str = "train.log") -> tuple[Path, duckdb.DuckDBPyConnection]:
    """`text` written as run/`name` and ingested into a new store: (the log, the store)."""
    log = tmp_path / "run" / name
    log.parent.mkdir()
    log.write_bytes(text)
    con = open_store(tmp_path / "s.duckdb")
    ingest_paths(con, [log], run_name="r")
    return log, con


@pytest.mark.parametrize("name, fixture, first_step", [("train.log", "log_text", b"step:1 -"),
                                                     ("metrics.jsonl", "jsonl_log", b'{"step": 1,'),
                                                     ("train.log", "trl", b"'loss': 0.001,")])
def test_a_shrunk_or_rewritten_file_is_read_again_whole(tmp_path, request, name, fixture, first_step):
    log_text = trl_text(tmp_path, "dict-below-its-bar") if fixture == "trl" else request.getfixturevalue(fixture)
    log, con = ingested(tmp_path, log_text, name)
    shorter = log_text[: log_text.rfind(b"\n", 0, len(log_text) // 3) + 1]
    log.write_bytes(shorter)
    (shrunk,) = ingest_paths(con, [log], run_name="r")
    assert shrunk.status == "truncated" and shrunk.notes[0].startswith("truncated:")
    changed = shorter.replace(first_step, first_step.replace(b"1", b"2"), 1) + log_text[len(shorter):]
    log.write_bytes(changed)
    (rewritten,) = ingest_paths(con, [log], run_name="r")
    assert rewritten.status == "replaced" and "changed since it was read" in rewritten.notes[0]
    rows = store_rows(con)
    con.close()
    assert rows == one_shot(tmp_path / "once.duckdb", log, changed)


def test_new_lines_that_change_the_run_settings_are_read_whole(tmp_path, log_text):
    """A restarted job printing another config: the file's settings would differ from a whole read."""
    log, con = ingested(tmp_path, log_text)
    spec, model = replace(SPEC, steps=3, batch=32), StepTimeModel()
    other = console_text(step_table(LENGTHS, spec, model), spec, model).encode()
    log.write_bytes(log_text + other)
    (report,) = ingest_paths(con, [log], run_name="r")
    assert report.status == "replaced" and report.notes[0].startswith("read again whole: the appended lines change")
    rows = store_rows(con)
    con.close()
    assert rows == one_shot(tmp_path / "once.duckdb", log, log_text + other)


def test_a_progress_bar_still_being_drawn_is_read_with_its_file(tmp_path, log_text):
    """New bytes without a newline (a bar redrawn by carriage returns) are read as the file's last line."""
    log, con = ingested(tmp_path, log_text)
    bar = b"Training Progress:  10%|#         | 3/30 [00:01<00:09]\rTraining Progress:  13%|#         | 4/30"
    log.write_bytes(log_text + bar)
    (drawing,) = ingest_paths(con, [log], run_name="r")
    assert drawing.status == "replaced"
    log.write_bytes(log_text + bar + b"\n" + BAD_LINE.encode())
    (done,) = ingest_paths(con, [log], run_name="r")
    assert done.status == "replaced"  # the last read ended inside a line: read whole again
    log.write_bytes(log_text + bar + b"\n" + BAD_LINE.encode() * 2)
    (grown,) = ingest_paths(con, [log], run_name="r")
    assert grown.status == "appended"
    rows = store_rows(con)
    con.close()
    assert rows == one_shot(tmp_path / "once.duckdb", log, log_text + bar + b"\n" + BAD_LINE.encode() * 2)


@pytest.mark.parametrize("kind", ["cr-only", "byte-order-mark", "trl"])
def test_a_grown_log_read_from_a_rewritten_copy_or_as_one_block_is_read_whole(tmp_path, log_text, kind):
    """A rewritten copy's bytes are not the file's, and a TRL log whose RL stage follows dicts read before
    without RL keys (which then become an SFT stage): neither is read from where the last read ended."""
    if kind == "cr-only":
        text, end = log_text.replace(b"\n", b"\r"), b"\r"
    elif kind == "byte-order-mark":
        text, end = b"\xef\xbb\xbf" + log_text, b"\n"
    else:
        text, end = (Path(__file__).parent / "fixtures" / "trl" / "grpo_unsloth_console.log").read_bytes(), b"\n"
    log, con = ingested(tmp_path, text[: text.rfind(end, 0, len(text) // 2) + 1])
    log.write_bytes(text)
    (grown,) = ingest_paths(con, [log], run_name="r")
    assert grown.status == "replaced"
    rows = store_rows(con)
    con.close()
    once = one_shot(tmp_path / "once.duckdb", log, text)
    assert rows == once


CONSOLE_FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("*/*/*.log")) + sorted(
    (Path(__file__).parent / "fixtures" / "openrlhf").glob("*.log"))


@pytest.mark.parametrize("fixture", CONSOLE_FIXTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_console_fixture_grown_line_by_line_ends_as_one_ingest(tmp_path, fixture):
    """Restarts, checkpoint loads, dirty and rejected lines, progress bars: fed a few lines at a time."""
    text = fixture.read_bytes()
    lines = text.splitlines(keepends=True)
    log = tmp_path / "run" / fixture.name
    log.parent.mkdir()
    con = open_store(tmp_path / "grown.duckdb")
    step = max(1, len(lines) // 6)
    for end in [*range(step, len(lines), step), len(lines)]:
        log.write_bytes(b"".join(lines[:end]) + (lines[end][: len(lines[end]) // 2] if end < len(lines) else b""))
        ingest_paths(con, [log], run_name="r", complete_lines=True)
    log.write_bytes(text)
    ingest_paths(con, [log], run_name="r", complete_lines=True)
    rows = store_rows(con)
    con.close()
    assert rows == one_shot(tmp_path / "once.duckdb", log, text)


def test_a_grown_file_is_hashed_on_from_the_digest_kept_for_its_prefix(tmp_path):
    from polytrace_cli.ingest import files

    log = tmp_path / "a.log"
    log.write_bytes(b"step:1 - a:1\n" * 1000)
    first = files.hash_range(log)
    log.write_bytes(b"step:1 - a:1\n" * 1500)
    grown = files.hash_range(log, prefix=first.size, prefix_lines=first.lines, prefix_sha=first.sha)
    assert (grown.sha, grown.size, grown.lines) == files.hash_and_count(log)
    log.write_bytes(b"step:2 - a:1\n" * 1500)  # not grown: rewritten; without the stored sha nothing is reused
    rewritten = files.hash_range(log, prefix=first.size, prefix_lines=first.lines)
    assert (rewritten.sha, rewritten.size) == files.hash_and_count(log)[:2]


def grown_once(tmp_path: Path, first: bytes, final: bytes, name: str = "train.log",
               **options) -> tuple[str, dict, dict]:
    """`first` ingested, then the log grown to `final` and ingested again (a new process's read: nothing
    hashed before is kept in memory): (the second read's status, its store's rows, one ingest's rows)."""
    from polytrace_cli.ingest import files

    log = tmp_path / "run" / name
    log.parent.mkdir(exist_ok=True)
    log.write_bytes(first)
    con = open_store(tmp_path / "grown.duckdb")
    ingest_paths(con, [log], run_name="r", **options)
    files._HASHED.clear()
    log.write_bytes(final)
    (report,) = ingest_paths(con, [log], run_name="r", **options)
    rows = store_rows(con)
    con.close()
    return report.status, rows, one_shot(tmp_path / "once.duckdb", log, final)


def test_a_growth_between_two_lines_of_one_step_goes_on_with_that_step(tmp_path, log_text):
    """A step printed as two lines (its pairs split, as a validation line beside a training line) with
    the log cut between them: the appended line belongs to the step and segment already stored."""
    lines = log_text.splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if b"step:5 - " in line)
    head, pairs = lines[index].rstrip(b"\n").split(b" - ", 1)
    pairs = pairs.split(b" - ")
    half = len(pairs) // 2
    lines[index:index + 1] = [head + b" - " + b" - ".join(pairs[:half]) + b"\n",
                              head + b" - " + b" - ".join(pairs[half:]) + b"\n"]
    text = b"".join(lines)
    cut = len(b"".join(lines[:index + 1]))
    status, rows, once = grown_once(tmp_path, text[:cut], text)
    assert status == "appended"
    assert rows == once
    step_five = {(segment, line) for segment, step, _, _, _, line in rows["step_metrics"] if step == 5}
    assert {line for _, line in step_five} == {index + 1, index + 2} and len({seg for seg, _ in step_five}) == 1


@pytest.mark.parametrize("after", [b"Load from checkpoint folder", b"step:15 - val-core", b"step:16 - "])
def test_a_growth_after_a_restart_ends_as_one_ingest(tmp_path, log_text, after):
    """Cut right after the line saying the job loaded its checkpoint, after the restarted job's first
    validation line (a step printed again), and after its first training step."""
    start = log_text.index(after, log_text.index(b"Load from checkpoint folder"))
    cut = log_text.index(b"\n", start) + 1
    status, rows, once = grown_once(tmp_path, log_text[:cut], log_text)
    assert status == "appended"
    assert rows == once
    assert any(flag == "restart" for _, _, flag, _, _ in rows["step_flags"])


def test_a_growth_of_a_validation_line_alone_is_appended_and_ends_as_one_ingest(tmp_path, log_text):
    """The restarted job's validation line (no step total on it) arrives alone: the file still logs a
    step total, as a whole read says, so the growth is read as appended, not the whole log again."""
    start = log_text.index(b"step:15 - val-core", log_text.index(b"Load from checkpoint folder"))
    end = log_text.index(b"\n", start) + 1
    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    con = open_store(tmp_path / "grown.duckdb")
    statuses = []
    for cut in (start, end, len(log_text)):
        log.write_bytes(log_text[:cut])
        (report,) = ingest_paths(con, [log], run_name="r", complete_lines=True)
        statuses.append(report.status)
    rows = store_rows(con)
    con.close()
    assert statuses == ["ingested", "appended", "appended"]
    assert rows == one_shot(tmp_path / "once.duckdb", log, log_text)


def test_a_log_grown_twice_is_hashed_from_the_state_kept_for_its_prefix(tmp_path, log_text):
    """The store keeps the sha256 state after a log's last whole 64-byte block; the next read of the grown
    log hashes only the bytes after it, in any process. Its prefix is not read again: a byte changed
    there (before the last block read, which is checked) leaves the sha256 of the bytes as first read."""
    import hashlib
    import json

    from polytrace_cli.ingest import files

    noise = b"".join(b"WARNING: padding line %d keeps the log's start out of its last block\n" % i
                     for i in range(3000))
    text = noise + log_text
    cuts = [len(noise) + log_text.rfind(b"\n", 0, len(log_text) * share // 4) + 1 for share in (2, 3)] + [len(text)]
    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    con = open_store(tmp_path / "grown.duckdb")
    statuses = []
    for cut in cuts:
        files._HASHED.clear()  # as in a new process
        log.write_bytes(text[:cut])
        (report,) = ingest_paths(con, [log], run_name="r")
        statuses.append(report.status)
        sha, size, state = con.execute("SELECT sha256, bytes, resume_state FROM files").fetchall()[0]
        assert (sha, size) == (hashlib.sha256(text[:cut]).hexdigest(), cut)
        assert json.loads(state)["sha_state"]["bytes"] == cut - cut % 64
    assert statuses == ["ingested", "appended", "appended"]
    assert store_rows(con) == one_shot(tmp_path / "once.duckdb", log, text)
    changed = bytearray(text)
    changed[10] = ord("X")  # inside the padding, far before the last 64 KB read
    files._HASHED.clear()
    log.write_bytes(bytes(changed) + BAD_LINE.encode())
    (report,) = ingest_paths(con, [log], run_name="r")
    sha = con.execute("SELECT sha256 FROM files WHERE path = ?", [str(log.resolve())]).fetchall()[0][0]
    con.close()
    assert report.status == "appended"
    assert sha == hashlib.sha256(text + BAD_LINE.encode()).hexdigest() != hashlib.sha256(log.read_bytes()).hexdigest()



# verl's file logger: one JSON object per step, appended as the job runs.
JSONL_BAD_LINES = ['{"step": 7.5, "data": {"critic/score/mean": 0.5}}\n', '{"step": 8, "data": {"critic/sc\n']


@pytest.fixture(scope="module")
def jsonl_log() -> bytes:
    """The generator's verl-jsonl log of SPEC and MODEL (a validation at step 0 and every 10 steps, the
    resumed job's validation line at step 15), restarted into the same file after step 20 (its steps
    16.. written again: a segment each), with two bad lines and a step whose data is empty between steps."""
    lines = jsonl_text(step_table(LENGTHS, SPEC, MODEL), SPEC, MODEL).splitlines(keepends=True)
    step_20 = next(i for i, line in enumerate(lines) if line.startswith('{"step": 20,'))
    resumed = next(i for i, line in enumerate(lines) if line.startswith('{"step": 16,'))
    lines = lines[:step_20 + 1] + lines[resumed - 1:]
    lines[10:10] = JSONL_BAD_LINES
    lines.insert(30, '{"step": 21, "data": {}}\n')  # then step 21's pairs: one step
    return "".join(lines).encode()


def grown_in_cuts(con: duckdb.DuckDBPyConnection, log: Path, text: bytes, cuts: list[int], fmt: str) -> list[str]:
    """`text` written at `log` up to each cut in turn and ingested as a log being written (its complete
    lines only), each read of format `fmt`: the reads' statuses."""
    statuses = []
    for cut in cuts:
        log.write_bytes(text[:cut])
        (report,) = ingest_paths(con, [log], run_name="r", complete_lines=True)
        assert report.format == fmt
        statuses.append(report.status)
        assert con.execute("SELECT bytes FROM files").fetchall()[0][0] == text[:cut].rfind(b"\n") + 1
    return statuses


def test_a_verl_jsonl_log_grown_at_random_cuts_ends_as_one_ingest(tmp_path, jsonl_log):
    """Cuts inside lines (read once complete), at the empty step, around the restart: after the first
    complete line every growth is read from where the last read ended."""
    log = tmp_path / "run" / "metrics.jsonl"
    log.parent.mkdir(parents=True)
    con = open_store(tmp_path / "grown.duckdb")
    ends = [i + 1 for i, byte in enumerate(jsonl_log) if byte == ord("\n")]
    cuts = sorted({*random.Random(5).sample(range(1, len(jsonl_log)), 8), ends[29], ends[30], ends[31],
                   len(jsonl_log)})
    statuses = grown_in_cuts(con, log, jsonl_log, cuts, "verl-jsonl")
    after = statuses[next(i for i, cut in enumerate(cuts) if cut > ends[0]) + 1:]
    assert set(after) <= {"appended", "unchanged"} and after.count("appended") >= 6, statuses
    rows = store_rows(con)
    con.close()
    assert rows == one_shot(tmp_path / "once.duckdb", log, jsonl_log)
    assert [(line, code) for line, _, _, code in rows["ingest_errors"]] == [(11, "type-error"), (12, "invalid-json")]
    restarts = [(step, line) for _, step, flag, _, line in rows["step_flags"] if flag == "restart"]
    assert restarts == [(15, jsonl_log[:jsonl_log.rindex(b'{"step": 15, "data": {"val')].count(b"\n") + 1)]


@pytest.mark.parametrize("cut_after", ['{"step": 20,', '{"step": 15, "data": {"val', '{"step": 21, "data": {}}'])
def test_a_verl_jsonl_growth_after_a_restart_or_an_empty_step_ends_as_one_ingest(tmp_path, jsonl_log, cut_after):
    """Cut before the restarted job's first line, after it (a step lower than the last: a new segment)
    and after a step that stored no pair (its step and segment go on from the read's state)."""
    find = jsonl_log.rindex if "val" in cut_after else jsonl_log.index
    cut = jsonl_log.index(b"\n", find(cut_after.encode())) + 1
    log = tmp_path / "run" / "metrics.jsonl"
    log.parent.mkdir()
    log.write_bytes(jsonl_log[:cut])
    con = open_store(tmp_path / "grown.duckdb")
    ingest_paths(con, [log], run_name="r")
    log.write_bytes(jsonl_log)
    (report,) = ingest_paths(con, [log], run_name="r")
    assert report.status == "appended" and report.notes[0].startswith(f"read from byte {cut:,}")
    rows = store_rows(con)
    con.close()
    assert rows == one_shot(tmp_path / "once.duckdb", log, jsonl_log)


def test_a_bad_line_in_a_verl_jsonl_growth_is_rejected_with_its_line_in_the_file(tmp_path, jsonl_log):
    lines = jsonl_log.splitlines(keepends=True)
    first = b"".join(lines[:40])
    grown = first + lines[40] + b'{"step": 31, "data": [1, 2]}\n' + b"".join(lines[41:])
    log = tmp_path / "run" / "metrics.jsonl"
    log.parent.mkdir()
    log.write_bytes(first)
    con = open_store(tmp_path / "grown.duckdb")
    ingest_paths(con, [log], run_name="r")
    log.write_bytes(grown)
    (report,) = ingest_paths(con, [log], run_name="r")
    assert (report.status, report.rejected, report.lines) == ("appended", 1, len(lines) - 40 + 1)
    errors = con.execute("SELECT line_no, reason FROM ingest_errors ORDER BY line_no").fetchall()
    assert errors[-1] == (42, "field data: expected an object")
    rows = store_rows(con)
    con.close()
    assert rows == one_shot(tmp_path / "once.duckdb", log, grown)


# TRL's console log: the Trainer's metric dicts under a progress bar redrawn by carriage returns.
TRL_BAD_LINE = "{'loss': 0.5, 'reward': [, 'epoch': 0.5}\n"


def newline_lines(text):
    """The lines of `text` (str or bytes) with their newlines; a carriage return (a bar redrawn) ends none."""
    end = "\n" if isinstance(text, str) else b"\n"
    parts = text.split(end)
    return [part + end for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


@pytest.fixture(scope="module", params=["bar-and-dict", "dict-below-its-bar"])
def trl_log(tmp_path_factory, request) -> bytes:
    return trl_text(tmp_path_factory.mktemp("trl"), request.param)


def trl_text(folder: Path, variant: str) -> bytes:
    """A GRPO run's console log of 80 steps (`test_trl_end_to_end.write_trl_log`), the job restarted
    into the same log from its step-50 checkpoint after step 60 (a new bar from 50: a new stage and
    segment), and a dict that does not parse after step 30. As written, or with each dict on the line
    below its bar and without `step_time` (the bar's elapsed time gives the step time)."""
    from test_trl_end_to_end import write_trl_log

    path = folder / "written.log"
    write_trl_log(path)
    lines = newline_lines(path.read_bytes().decode())
    lines = lines[:61] + lines[51:]  # lines[n] holds step n's dict, drawn after the bar at n - 1
    lines.insert(31, TRL_BAD_LINE)
    text = "".join(lines)
    if variant == "dict-below-its-bar":
        text = re.sub(r"\r {40}\r\{", "\n{", re.sub(r"'step_time': [0-9.]+, ", "", text))
    return text.encode()


def test_a_trl_log_grown_at_random_cuts_ends_as_one_ingest(tmp_path, trl_log):
    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    con = open_store(tmp_path / "grown.duckdb")
    ends = dict_ends(trl_log)
    cuts = sorted({*random.Random(7).sample(range(ends[0], len(trl_log)), 10), ends[0], ends[29], ends[30],
                   ends[59], ends[60], len(trl_log)})
    statuses = grown_in_cuts(con, log, trl_log, cuts, "trl-console")
    # A read ending at a stage's first dict leaves a token count whose per-step count the next one decides.
    whole = {index + 1 for index, cut in enumerate(cuts) if cut in (ends[0], ends[60])}
    assert [status for index, status in enumerate(statuses) if index in whole] == ["replaced", "replaced"]
    after = [status for index, status in enumerate(statuses[1:], start=1) if index not in whole]
    assert set(after) <= {"appended", "unchanged"} and after.count("appended") >= 8, statuses
    rows = store_rows(con)
    con.close()
    assert rows == one_shot(tmp_path / "once.duckdb", log, trl_log)
    bad_line = trl_log[:trl_log.index(TRL_BAD_LINE.encode())].count(b"\n") + 1
    assert [(line, code) for line, _, _, code in rows["ingest_errors"]] == [(bad_line, "unparsable-line")]
    assert [(segment, step) for segment, step, flag, _, _ in rows["step_flags"] if flag == "restart"] == [(1, 51)]
    per_step = {(segment, step) for segment, step, key, *_ in rows["step_metrics"] if key == "num_tokens/per_step"}
    assert len(per_step) == 60 + 30 - 1  # every logged step but the restarted stage's first


def dict_ends(text: bytes) -> list[int]:
    """The byte after each metrics dict's line (the dicts that log `num_tokens`), in order."""
    return [match.end() for match in re.finditer(rb"[^\n]*'num_tokens'[^\n]*\n", text)]


@pytest.mark.parametrize("cut", [(1, "after"), (2, "after"), (60, "after"), (61, "before"), (61, "after")])
def test_a_trl_log_grown_once_from_a_stage_boundary_ends_as_one_ingest(tmp_path, trl_log, cut):
    """Cut after the first dict (its stage's only token count: read whole, the second decides its per-step
    count), the second, the last before the restart, before and after the restarted stage's first (before
    it: after its bar, when the bar has a line of its own)."""
    number, where = cut
    end = dict_ends(trl_log)[number - 1]
    if where == "before":
        end = trl_log.rindex(b"\n", 0, end - 1) + 1
    status, rows, once = grown_once(tmp_path, trl_log[:end], trl_log)
    assert status == ("replaced" if cut in [(1, "after"), (61, "after")] else "appended")
    assert rows == once


def test_a_trl_log_grown_after_its_end_of_training_dict_goes_on_in_a_new_stage(tmp_path, trl_log):
    """A second training in the same log after the first one's end-of-training dict: a new stage."""
    summary = b"{'train_runtime': 400.5, 'train_samples_per_second': 1.5, 'train_loss': 0.001, 'epoch': 0.75}\n"
    end = dict_ends(trl_log)[59]
    first = trl_log[:end] + summary
    status, rows, once = grown_once(tmp_path, first, first + trl_log[end:])
    assert status == "appended"
    assert rows == once


TRL_FIXTURES = sorted((Path(__file__).parent / "fixtures" / "trl").glob("*.log"))


@pytest.mark.parametrize("fixture", TRL_FIXTURES, ids=lambda p: p.name)
def test_every_trl_fixture_grown_line_by_line_ends_as_one_ingest(tmp_path, fixture):
    """An SFT stage before the RL one, string values, no progress bar: fed one line at a time."""
    text = fixture.read_bytes()
    lines = newline_lines(text)
    log = tmp_path / "run" / fixture.name
    log.parent.mkdir()
    con = open_store(tmp_path / "grown.duckdb")
    for end in range(1, len(lines) + 1):
        log.write_bytes(b"".join(lines[:end]))
        ingest_paths(con, [log], run_name="r", complete_lines=True)
    rows = store_rows(con)
    con.close()
    once = one_shot(tmp_path / "once.duckdb", log, text)
    assert rows == once


def test_a_verl_jsonl_log_of_a_resumed_job_grown_keeps_one_resumed_flag(tmp_path, jsonl_log):
    """A log whose first step is above 1 (a job resumed into a new file): flagged `resumed` once, by the
    first read; the appended lines add no flag of their own."""
    lines = newline_lines(jsonl_log)
    start = next(index for index, line in enumerate(lines) if line.startswith(b'{"step": 5,'))
    text, first = b"".join(lines[start:]), b"".join(lines[start:start + 3])
    status, rows, once = grown_once(tmp_path, first, text, name="metrics.jsonl")
    assert status == "appended"
    assert rows == once
    assert [(step, flag) for _, step, flag, _, _ in rows["step_flags"] if flag == "resumed"] == [(5, "resumed")]


def _run_meta(con: duckdb.DuckDBPyConnection) -> dict:
    return json.loads(con.execute("SELECT meta FROM runs").fetchall()[0][0])


def test_a_log_written_over_keeps_no_fact_only_its_earlier_text_gave(tmp_path, log_text):
    """The job's command line and config (its settings) printed in the first text only: once the log is
    written over with its step lines alone, the run's meta is that of one ingest of the new text, not the settings
    read before."""
    rewritten = b"".join(line for line in log_text.splitlines(keepends=True) if b" step:" in line)
    log, con = ingested(tmp_path, log_text)
    before = _run_meta(con)
    log.write_bytes(rewritten)
    (report,) = ingest_paths(con, [log], run_name="r")
    assert report.status == "truncated"  # shorter than it was: read again whole
    after = _run_meta(con)
    con.close()
    (tmp_path / "once").mkdir()
    once = one_shot(tmp_path / "once.duckdb", tmp_path / "once" / "train.log", rewritten)
    assert set(before) - set(after), "the command line gave the run facts of its own"
    assert after == json.loads(once["runs"][0][2])


def test_a_run_of_two_files_folds_their_facts_in_path_order_whatever_order_they_were_read(tmp_path, log_text):
    """Two logs of one run, the first read again after it changed: the run's meta is the fold of a.log's
    new facts and b.log's, in their paths' order, as reading the two final files in another order gives."""
    other = b"".join(line for line in log_text.splitlines(keepends=True) if b" step:" in line)  # no settings
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "a.log").write_bytes(log_text)
    (folder / "b.log").write_bytes(other)
    con = open_store(tmp_path / "s.duckdb")
    ingest_paths(con, [folder / "a.log"], run_name="r", format_name="verl-console")
    ingest_paths(con, [folder / "b.log"], run_name="r", format_name="verl-console")
    (folder / "a.log").write_bytes(other)
    ingest_paths(con, [folder / "a.log"], run_name="r", format_name="verl-console")
    again = _run_meta(con)
    rows = con.execute("SELECT count(*) FILTER (WHERE file_id IS NULL), count(*) FROM file_run_meta").fetchall()
    con.close()
    fresh = open_store(tmp_path / "fresh.duckdb")
    ingest_paths(fresh, [folder / "b.log"], run_name="r", format_name="verl-console")
    ingest_paths(fresh, [folder / "a.log"], run_name="r", format_name="verl-console")
    assert again == _run_meta(fresh)
    fresh.close()
    assert rows == [(0, 2)]  # one row per file read, none from before the table


@pytest.mark.parametrize("reopened", [False, True], ids=["store kept open", "store opened again"])
def test_a_growth_that_changes_the_runs_decisions_ends_as_one_ingest(tmp_path, reopened):
    """A verl 0.8 run (its step time leaves testing out) validating from step 10: before any validation
    whether the step time counts testing cannot be told and the basis is 'logged'; the growth that
    brings the validation steps decides both ('logged without overheads'), as one ingest does, whether
    the store stayed open between the reads (as `watch` holds it) or was opened again (a new command)."""
    model = StepTimeModel(validate_every=10, validate_before_train=False, step_includes_overheads=False)
    text = console_text(step_table(LENGTHS, SPEC, model), SPEC, model).encode()
    cut = text.index(b"\n", text.index(b"step:6 - ")) + 1
    log = tmp_path / "grown" / "run" / "train.log"
    log.parent.mkdir(parents=True)
    db = tmp_path / "grown.duckdb"
    con = open_store(db)
    records = []
    for part in (text[:cut], text):
        log.write_bytes(part)
        (report,) = ingest_paths(con, [log], run_name="r", complete_lines=True)
        records.append((report.status, *con.execute(
            "SELECT step_time_basis, includes_testing FROM run_semantics").fetchall()[0]))
        if reopened:
            con.close()
            con = open_store(db)
    assert records == [("ingested", "logged", None), ("appended", "logged without overheads", False)]
    rows = store_rows(con)
    con.close()
    assert rows == one_shot(tmp_path / "once.duckdb", log, text)


def _perf_line(step: int, pairs: str) -> bytes:
    return f"step:{step} - {pairs}\n".encode()


def perf_log(first_gpus: int, then_gpus: int) -> list[bytes]:
    """Lines of a verl console log whose perf metrics give `first_gpus` GPUs on steps 1-5 and
    `then_gpus` on steps 6-11; step 10 prints its tokens on one line and its throughput and time on
    the next."""
    def full(step: int, gpus: int) -> bytes:
        return _perf_line(step, f"perf/total_num_tokens:{gpus * 1000} - perf/throughput:100 - perf/time_per_step:10"
                                f" - timing_s/step:10")

    lines = [full(step, first_gpus) for step in range(1, 6)] + [full(step, then_gpus) for step in range(6, 10)]
    return lines + [_perf_line(10, f"perf/total_num_tokens:{then_gpus * 1000} - timing_s/gen:1"),
                    _perf_line(10, "perf/throughput:100 - perf/time_per_step:10 - timing_s/step:10"),
                    full(11, then_gpus)]


def test_the_gpu_count_follows_a_grown_log_as_one_ingest_gives_it(tmp_path):
    """The GPU count is the median over steps of tokens / (throughput × seconds): 8 on steps 1-5, 16 on
    later ones. The log grows between step 10's two lines: its estimate needs both (without it, the
    median of steps 1-11 would be 12)."""
    lines = perf_log(8, 16)
    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    con = open_store(tmp_path / "grown.duckdb")
    seen = []
    for end in (5, 10, 12):
        log.write_bytes(b"".join(lines[:end]))
        (report,) = ingest_paths(con, [log], run_name="r", format_name="verl-console", complete_lines=True)
        meta = con.execute("SELECT meta FROM runs").fetchall()[0][0]
        seen.append((report.status, json.loads(meta)["n_gpus"]))
    assert seen == [("ingested", 8), ("appended", 8), ("appended", 16)]
    rows = store_rows(con)
    con.close()
    con = open_store(tmp_path / "once.duckdb")
    ingest_paths(con, [log], run_name="r", format_name="verl-console")
    assert store_rows(con) == rows
    con.close()


def test_two_logs_of_a_run_grown_in_turns_each_get_their_own_gpu_count(tmp_path):
    """Two logs of one run, read in turns as they grow with the store kept open, and each read again in
    a store opened anew: the same GPU count per file (the second log's read does not take the first's
    kept values)."""
    logs = {tmp_path / "run" / "a.log": perf_log(8, 16), tmp_path / "run" / "b.log": perf_log(4, 32)}
    (tmp_path / "run").mkdir()
    con = open_store(tmp_path / "s.duckdb")
    for end in (5, 10, 12):
        for log, lines in logs.items():
            log.write_bytes(b"".join(lines[:end]))
            ingest_paths(con, [log], run_name="r", format_name="verl-console", complete_lines=True)
    counts = {path: json.loads(state)["meta"]["n_gpus"] for path, state in con.execute(
        "SELECT path, resume_state FROM files ORDER BY path").fetchall()}
    con.close()
    assert list(counts.values()) == [16, 32]
    con = open_store(tmp_path / "once.duckdb")
    ingest_paths(con, list(logs), run_name="r", format_name="verl-console")
    assert {path: json.loads(state)["meta"]["n_gpus"] for path, state in con.execute(
        "SELECT path, resume_state FROM files ORDER BY path").fetchall()} == counts
    con.close()


def test_what_a_grown_read_keeps_for_the_next_is_no_table_of_the_store(tmp_path, log_text):
    """The run's steps and the file's perf values kept in temporary tables for the next read are not
    rows of the store: removing the run in the same session names only the store's tables."""
    from polytrace_cli.facade import Store

    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    half = log_text[: log_text.rfind(b"\n", 0, len(log_text) // 2) + 1]
    with Store.open(tmp_path / "s.duckdb") as store:
        for text in (half, log_text):
            log.write_bytes(text)
            store.ingest([log], run="r")
        kept = {name for (name,) in store.connection.execute(
            "SELECT table_name FROM duckdb_tables() WHERE temporary").fetchall()}
        assert kept  # something is kept for the next read
        stored = {name for (name,) in store.connection.execute(
            "SELECT table_name FROM duckdb_tables() WHERE NOT temporary").fetchall()}
        (removed,) = store.remove("r")
    assert removed.rows and set(removed.rows) <= stored


def _printed_lines(steps: range, value: str) -> bytes:
    """verl console lines of 50 pairs each, every value printed as `value`."""
    return b"".join(f"step:{step} - {' - '.join(f'm/k{i}:{value}' for i in range(50))}\n".encode() for step in steps)


@pytest.mark.parametrize("first_steps, status", [(101, "appended"), (3, "replaced")])
def test_the_printed_values_read_for_the_verl_version_are_the_files_first_in_every_read(tmp_path, first_steps, status):
    """verl's version class is read from the printed text of the file's first PRINTED_SAMPLE_SIZE values
    (5,000; 50 a line here). A log whose earlier lines gave them all (100 lines of `.3f` values) and
    then grows with repr values keeps its class, as one read of the whole log decides it, and its
    growth is appended; a log whose earlier lines gave fewer (2 lines) has the growth's values
    decide the class with them: the class changes and the log is read again whole."""
    from polytrace_cli.ingest.formats.verl.console import PRINTED_SAMPLE_SIZE

    assert PRINTED_SAMPLE_SIZE == 100 * 50
    first = _printed_lines(range(1, first_steps), "0.125")
    final = first + _printed_lines(range(first_steps, first_steps + 5), "np.float64(0.1234567)")
    log = tmp_path / "grown" / "run" / "train.log"
    log.parent.mkdir(parents=True)
    con = open_store(tmp_path / "grown.duckdb")
    reports = []
    for text in (first, final):
        log.write_bytes(text)
        (report,) = ingest_paths(con, [log], run_name="r", complete_lines=True)
        reports.append(report.status)
    version = con.execute("SELECT format_version FROM files").fetchall()[0][0]
    rows = store_rows(con)
    con.close()
    assert reports == ["ingested", status]
    assert version == ("verl<=0.4 (.3f values)" if status == "appended" else "verl>=0.5 (repr values)")
    assert rows == one_shot(tmp_path / "once.duckdb", log, final)


@pytest.mark.parametrize("cuts, statuses", [
    # A crash printed in the part rotated away; the new log read again whole after it grew.
    ((12, 48, 51), ["ingested", "appended", "truncated", "ingested", "replaced"]),
    # The same log with the growth after the rotation appended.
    ((17, 50, 66), ["ingested", "appended", "truncated", "ingested", "appended"]),
])
def test_a_rotated_log_ingested_as_it_grows_ends_as_one_ingest_of_its_files(tmp_path, log_text, cuts, statuses):
    """The log is read, grows, is rotated (train.log -> train.log.1, a new train.log) and grows again, each
    state ingested into one store: the whole store (every table, the run's facts and its semantics record
    included) is then that of one ingest of the two final files. A run's facts fold over its files in
    the order of their paths, a rotated log before the log it was rotated from, not in the order a
    history of reads happened to write them: the crash printed in train.log.1 is over, since the run
    went on in train.log."""
    from conftest import whole_store

    lines = log_text.splitlines(keepends=True)
    a, b, c, d = (b"".join(lines[i:j]) for i, j in zip((0, *cuts), (*cuts, len(lines))))
    assert b"SIGTERM" in a + b and b"SIGTERM" not in c + d
    folder = tmp_path / "logs"
    folder.mkdir()
    log = folder / "train.log"
    con = open_store(tmp_path / "grown.duckdb")
    seen = []
    for text, rotate in ((a, False), (a + b, False), (c, True), (c + d, False)):
        if rotate:
            log.rename(folder / "train.log.1")
        log.write_bytes(text)
        seen += [report.status for report in ingest_paths(con, [folder], run_name="r") if report.status != "unchanged"]
    grown = whole_store(con)
    con.close()
    fresh = open_store(tmp_path / "once.duckdb")
    ingest_paths(fresh, [folder], run_name="r")
    once = whole_store(fresh)
    meta = json.loads(fresh.execute("SELECT meta FROM runs").fetchall()[0][0])
    fresh.close()
    assert seen == statuses
    assert {table for table in once if grown[table] != once[table]} == set()
    assert grown == once
    assert meta["crash"] is False


@pytest.mark.parametrize("kind, cuts", [("console", (3, 25, 32)), ("jsonl", (7, 9, 12))])
def test_a_rotated_log_s_files_each_hold_the_run_s_step_time_decision(tmp_path, kind, cuts):
    """Grown, rotated and grown again (the cuts of two seeded trials of `crash_harness.py --rotations`):
    whether the step time counts testing and checkpoints is decided over every step the run holds,
    and each file's row of run facts (and the meta kept in its `resume_state`) holds that decision,
    not the one over the steps stored when that file was last read (train.log.1 read with only
    train.log's first part stored could not tell about checkpoints). The generator's step time
    includes both timers (`StepTimeModel.step_includes_overheads`): every row says True, and the
    whole store is that of one ingest of the two final files."""
    from conftest import whole_store

    steps = step_table(LENGTHS, SPEC, MODEL)
    assert MODEL.step_includes_overheads
    name, text = {"console": ("train.log", console_text(steps, SPEC, MODEL)),
                  "jsonl": ("train.jsonl", jsonl_text(steps, SPEC, MODEL))}[kind]
    lines = text.encode().splitlines(keepends=True)
    a, b, c, d = (b"".join(lines[i:j]) for i, j in zip((0, *cuts), (*cuts, len(lines))))
    folder = tmp_path / "logs"
    folder.mkdir()
    log = folder / name
    keys = ("step_time_includes_testing", "step_time_includes_checkpoint")

    def facts(con) -> list:
        rows = con.execute("SELECT f.path, m.meta, f.resume_state FROM file_run_meta m JOIN files f USING (file_id)"
                           " ORDER BY f.path").fetchall()
        run = json.loads(con.execute("SELECT meta FROM runs").fetchall()[0][0])
        return [(Path(path).name, [json.loads(meta).get(key) for key in keys],
                 [json.loads(state)["meta"].get(key) for key in keys]) for path, meta, state in rows] \
            + [("run", [run.get(key) for key in keys])]

    con = open_store(tmp_path / "grown.duckdb")
    for part, rotate in ((a, False), (a + b, False), (c, True), (c + d, False)):
        if rotate:
            log.rename(folder / f"{name}.1")
        log.write_bytes(part)
        ingest_paths(con, [folder], run_name="r")
    grown, grown_facts = whole_store(con), facts(con)
    con.close()
    fresh = open_store(tmp_path / "once.duckdb")
    ingest_paths(fresh, [folder], run_name="r")
    once = whole_store(fresh)
    fresh.close()
    assert grown_facts == [(name, [True, True], [True, True]), (f"{name}.1", [True, True], [True, True]),
                           ("run", [True, True])]
    assert {table for table in once if grown[table] != once[table]} == set()
    assert grown == once


def test_the_facts_of_a_run_s_files_fold_in_path_order_a_rotated_log_first(tmp_path, log_text):
    """Three logs of one run read in another order than their paths' (the current log first, then the
    one rotated away twice, then once): the run's facts are those the files give folded as
    train.log.2, train.log.1, train.log, the order one ingest of their folder gives them."""
    settings = b"".join(line for line in log_text.splitlines(keepends=True)[:12])
    folder = tmp_path / "logs"
    folder.mkdir()
    for name, experiment in (("train.log", b"current"), ("train.log.1", b"once"), ("train.log.2", b"twice")):
        (folder / name).write_bytes(settings.replace(b"trainer.experiment_name=synthetic-math",
                                                     b"trainer.experiment_name=" + experiment))
    con = open_store(tmp_path / "s.duckdb")
    for name in ("train.log", "train.log.2", "train.log.1"):
        ingest_paths(con, [folder / name], run_name="r", format_name="verl-console")
    meta = json.loads(con.execute("SELECT meta FROM runs").fetchall()[0][0])
    con.close()
    assert meta["experiment_name"] == "current"


@pytest.mark.parametrize("start, cut", [(149, 295), (261, 449), (296, 434)])
def test_a_trl_log_starting_mid_run_grown_ends_as_one_ingest(tmp_path, start, cut):
    """A TRL log whose first lines are the middle of a run (what a rotation leaves in the new log: a bar
    already at step 30 or more, no logging interval printed), read as a log being written and then grown:
    the whole store is that of one read of the final text. Its dicts numbered by their order (the bar's
    counts cannot number them) stay flagged `step_estimated` in the growth, as one read flags them; the
    bar counts the first read keeps for the next are the latest ones, as one read keeps them.
    Cuts at (trl_text's) `splitlines` lines, carriage returns included."""
    from conftest import whole_store

    lines = trl_text(tmp_path, "bar-and-dict").splitlines(keepends=True)
    first, grown = b"".join(lines[start:cut]), b"".join(lines[start:])
    log = tmp_path / "logs" / "train.log"
    log.parent.mkdir()
    con = open_store(tmp_path / "grown.duckdb")
    statuses = []
    for text in (first, grown):
        log.write_bytes(text)
        statuses += [r.status for r in ingest_paths(con, [log], run_name="r", complete_lines=True)]
    rows = whole_store(con)
    con.close()
    once = open_store(tmp_path / "once.duckdb")
    ingest_paths(once, [log], run_name="r", complete_lines=True)
    expected = whole_store(once)
    once.close()
    assert statuses == ["ingested", "appended"]
    assert {table for table in expected if rows[table] != expected[table]} == set()
    assert rows == expected
