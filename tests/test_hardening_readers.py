"""Record and store formats fail per record, never per file, and never skip a file that holds records.

Every input is written at test time, small. MLflow SQLite stores are written with MLflow's own table
and column names (mlflow/store/tracking/dbmodels/models.py, mlflow 3.17.2: `metrics.value` a double,
`step` and `timestamp` BIGINT, `is_nan` a flag; `sqlalchemy_store.sanitize_metric_value` writes NaN as
0 with is_nan = 1 and ±inf as ±1.7976931348623157e308, so an infinity in `value` is no MLflow value).
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from polytrace_cli.ingest.driver import ingest_paths

MLFLOW_SCHEMA = """
CREATE TABLE experiments (experiment_id INTEGER PRIMARY KEY, name VARCHAR(256));
CREATE TABLE runs (run_uuid VARCHAR(32) PRIMARY KEY, name VARCHAR(250), status VARCHAR(9), start_time BIGINT,
                   end_time BIGINT, lifecycle_stage VARCHAR(20), experiment_id INTEGER);
CREATE TABLE metrics (key VARCHAR(250), value FLOAT NOT NULL, timestamp BIGINT, run_uuid VARCHAR(32),
                      step BIGINT DEFAULT 0 NOT NULL, is_nan BOOLEAN NOT NULL);
CREATE TABLE params (key VARCHAR(250), value VARCHAR(8000), run_uuid VARCHAR(32));
CREATE TABLE tags (key VARCHAR(250), value VARCHAR(8000), run_uuid VARCHAR(32));
"""


def write_mlflow_db(path: Path, metrics: list[tuple], runs: tuple[str, ...] = ("r1",)) -> Path:
    """An MLflow SQLite store holding `runs` and the metrics rows (key, value, step, run_uuid, is_nan)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as con:
        con.executescript(MLFLOW_SCHEMA)
        con.executemany("INSERT INTO runs VALUES (?, ?, 'FINISHED', ?, NULL, 'active', 0)",
                        [(uuid, f"name-{uuid}", 1000 + index) for index, uuid in enumerate(runs)])
        con.executemany("INSERT INTO metrics VALUES (?, ?, 1700000000000, ?, ?, ?)",
                        [(key, value, run, step, nan) for key, value, step, run, nan in metrics])
        con.execute("INSERT INTO params VALUES ('trainer.nnodes', '1', 'r1')")
    con.close()
    return path


def _good_rows(steps: int = 4) -> list[tuple]:
    return [("timing_s/step", 10.0 + step, step, "r1", 0) for step in range(1, steps + 1)]


def _errors(con) -> list[tuple]:
    return con.execute("SELECT line_no, code FROM ingest_errors ORDER BY line_no").fetchall()


def test_an_mlflow_db_in_a_folder_named_with_uri_characters_is_read_and_nothing_is_created(store, tmp_path):
    logs = tmp_path / "logs"
    db = write_mlflow_db(logs / "runs#1%2F..%2F..%2Fescape?x=1" / "mlflow.db", _good_rows())
    before = sorted(p.relative_to(logs) for p in logs.rglob("*"))
    [report] = ingest_paths(store, [logs])
    assert (report.format, report.status, report.stored) == ("mlflow-sqlite", "ingested", 5)
    assert sorted(p.relative_to(logs) for p in logs.rglob("*")) == before
    assert not (logs / "runs").exists() and not (tmp_path / "escape").exists()
    assert store.execute("SELECT count(*) FROM step_metrics").fetchall() == [(4,)]
    assert db.is_file()


@pytest.mark.parametrize("damage", ["truncated", "scrambled pages"])
def test_a_damaged_mlflow_db_is_an_error_with_its_reason_never_a_skip(store, tmp_path, damage):
    db = write_mlflow_db(tmp_path / "run" / "mlflow.db", _good_rows(40))
    data = bytearray(db.read_bytes())
    if damage == "truncated":
        data = data[:len(data) // 2 + 100]
    else:
        data[100:len(data)] = bytes(b ^ 0x5A for b in data[100:])
    db.write_bytes(bytes(data))
    [report] = ingest_paths(store, [tmp_path / "run"])
    assert report.status == "rejected" and report.failed, report
    assert "damaged SQLite database" in report.message


def test_bad_mlflow_metrics_rows_are_rejected_one_by_one(store, tmp_path):
    rows = _good_rows(4) + [
        ("timing_s/step", 20.5, 5, "r1", 0),         # rowid 5: good
        ("timing_s/step", "fast", 6, "r1", 0),       # 6: text value
        ("timing_s/step", float("inf"), 7, "r1", 0),  # 7: 1e999 is stored by SQLite as +inf
        ("timing_s/step", 3.0, 2.5, "r1", 0),         # 8: a step that is not whole
        ("timing_s/step", 3.0, 2**40, "r1", 0),       # 9: a step beyond INTEGER
        ("timing_s/step", 3.0, 9, "ghost", 0),        # 10: a run the runs table does not hold
        ("critic/rewards/mean", 0.0, 1, "r1", 1),     # 11: MLflow's NaN
    ]
    db = write_mlflow_db(tmp_path / "run" / "mlflow.db", rows)
    [report] = ingest_paths(store, [db])
    assert report.status == "ingested", report
    assert _errors(store) == [(6, "type-error"), (7, "out-of-range"), (8, "type-error"), (9, "out-of-range"),
                              (10, "constraint-error")]
    assert (report.lines, report.stored, report.rejected) == (12, 7, 5)
    stored = store.execute("SELECT step, value FROM step_metrics WHERE key = 'timing_s/step' ORDER BY step").fetchall()
    assert stored == [(1, 11.0), (2, 12.0), (3, 13.0), (4, 14.0), (5, 20.5)]
    assert store.execute("SELECT isnan(value) FROM step_metrics WHERE key = 'critic/rewards/mean'").fetchall() \
        == [(True,)]
    assert store.execute("SELECT count(*) FROM step_metrics WHERE isinf(value)").fetchall() == [(0,)]


def _mlflow_run_folder(root: Path) -> Path:
    run = root / "mlruns" / "0" / "abc123"
    (run / "metrics" / "timing_s").mkdir(parents=True)
    (run / "meta.yaml").write_text("run_id: abc123\nexperiment_id: '0'\nrun_name: grpo\n")
    return run


@pytest.mark.parametrize("layout", ["bom", "cr"])
def test_mlflow_metric_files_with_a_byte_order_mark_or_cr_line_ends_are_read(store, tmp_path, layout):
    run = _mlflow_run_folder(tmp_path)
    lines = [f"17000000000{step} {10.5 + step} {step}" for step in range(1, 5)]
    data = ("\r".join(lines) + "\r").encode() if layout == "cr" else b"\xef\xbb\xbf" + "\n".join(lines).encode() + b"\n"
    (run / "metrics" / "timing_s" / "step").write_bytes(data)
    reports = {Path(r.path).name: r for r in ingest_paths(store, [tmp_path / "mlruns"])}
    report = reports["step"]
    assert (report.format, report.status, report.stored, report.rejected) == ("mlflow-metric", "ingested", 4, 0)
    assert store.execute("SELECT step, value FROM step_metrics ORDER BY step").fetchall() == [
        (step, 10.5 + step) for step in range(1, 5)]


# --- wandb offline record logs (records built with wandb's own protobuf definitions, framed as its writer does)

def _wandb_log(tmp_path: Path, bodies: list[bytes]) -> Path:
    from hostile_inputs import wandb_record_log

    path = tmp_path / "wandb" / "offline-run-20250101_000000-abc" / "run-abc.wandb"
    path.parent.mkdir(parents=True)
    path.write_bytes(wandb_record_log(bodies))
    return path


@pytest.mark.parametrize("name", ["400 digits", "1e400", "step 1e400", "step NaN", "deep"])
def test_a_hostile_wandb_history_record_is_that_records_error(store, tmp_path, name):
    pytest.importorskip("wandb")
    from hostile_inputs import HOSTILE_WANDB_VALUES, wandb_history

    step, values, code = HOSTILE_WANDB_VALUES[name]
    bodies = [wandb_history(s, {"timing_s/step": str(10.5 + s)}) for s in (1, 2)]
    bodies += [wandb_history(step["_step"], values), wandb_history(3, {"timing_s/step": "13.5"})]
    [report] = ingest_paths(store, [_wandb_log(tmp_path, bodies)])
    assert report.status == "ingested", report
    assert _errors(store) == [(3, code)]
    assert (report.lines, report.stored, report.rejected) == (4, 3, 1)
    assert store.execute("SELECT step, value FROM step_metrics ORDER BY step").fetchall() == [
        (1, 11.5), (2, 12.5), (3, 13.5)]


def test_a_bad_length_in_a_wandb_log_costs_only_the_rest_of_its_block(store, tmp_path):
    pytest.importorskip("wandb")
    import struct

    from hostile_inputs import FULL, WANDB_BLOCK, record_pieces, wandb_history

    bodies = [wandb_history(s, {"timing_s/step": str(float(s)), "note": json.dumps("x" * 2000)}) for s in range(1, 41)]
    path = _wandb_log(tmp_path, bodies)
    data = bytearray(path.read_bytes())
    pieces = list(record_pieces(bytes(data)))
    at = next(offset for offset, kind, _ in pieces if kind == FULL and offset > WANDB_BLOCK)
    block_end = (at // WANDB_BLOCK + 1) * WANDB_BLOCK
    # Records 1..k end before `at`; those starting in at..block_end (and the piece of one split across
    # the block end) are lost; every record starting in a later block is kept.
    starts = [offset for offset, kind, _ in pieces if kind in (1, 2)]
    lost = [index + 1 for index, offset in enumerate(starts) if at <= offset < block_end]
    struct.pack_into("<H", data, at + 4, 60_000)
    path.write_bytes(bytes(data))
    [report] = ingest_paths(store, [path])
    kept = [step for step in range(1, 41) if step not in lost]
    assert store.execute("SELECT DISTINCT step FROM step_metrics ORDER BY step").fetchall() == [(s,) for s in kept]
    assert _errors(store) == [(lost[0], "corrupt-file")]
    assert (report.lines, report.stored, report.rejected) == (len(kept) + 1, len(kept), 1)
    assert kept[-1] == 40 and 0 < len(lost) <= WANDB_BLOCK // 2000 + 1  # what follows the block is read


# --- trainer_state.json (transformers' Trainer.state: `log_history` entries with a `step`) and TRL's console

def _entry(step: int | str, **values) -> str:
    return "{" + ", ".join(f'"{k}": {v}' for k, v in {"loss": "0.5", **values, "step": step}.items()) + "}"


@pytest.mark.parametrize("bad, code", [
    (_entry(3, grad_norm="1" + "0" * 400), "out-of-range"),
    (_entry(3, grad_norm="1e400"), "out-of-range"),
    (_entry(3, grad_norm='"1e400"'), "out-of-range"),
    (_entry("1e400"), "out-of-range"),
    (_entry("NaN"), "type-error"),
    (_entry(3, completions="[" * 100_000 + "]" * 100_000), "invalid-json"),
], ids=["400-digits", "1e400", "string-1e400", "step-1e400", "step-nan", "deep"])
def test_a_hostile_trainer_state_entry_is_that_entrys_error(store, tmp_path, bad, code):
    entries = [_entry(1, grad_norm="1.5"), _entry(2, grad_norm="2.5"), bad, _entry(4, grad_norm="4.5")]
    path = tmp_path / "out" / "trainer_state.json"
    path.parent.mkdir()
    path.write_text('{"global_step": 4, "log_history": [' + ", ".join(entries) + '], "max_steps": 4}')
    [report] = ingest_paths(store, [path])
    assert report.status == "ingested", report
    assert _errors(store) == [(3, code)]
    assert (report.lines, report.stored, report.rejected) == (4, 3, 1)
    assert store.execute("SELECT step, value FROM step_metrics WHERE key = 'grad_norm' ORDER BY step").fetchall() \
        == [(1, 1.5), (2, 2.5), (4, 4.5)]
    assert json.loads(store.execute("SELECT meta FROM runs").fetchall()[0][0])["max_steps"] == 4


def test_a_trl_string_value_beyond_a_double_rejects_its_line(store, tmp_path):
    path = tmp_path / "train.log"
    path.write_text("{'loss': 0.5, 'grad_norm': '1e400', 'learning_rate': 1e-06, 'epoch': 0.1}\n"
                    "{'loss': 0.5, 'grad_norm': 1.5, 'learning_rate': 1e-06, 'epoch': 0.2}\n"
                    "{'loss': 0.5, 'grad_norm': '-1e400', 'x': [1, 2], 'learning_rate': 1e-06, 'epoch': 0.3}\n"
                    "{'loss': 0.5, 'grad_norm': 'inf', 'learning_rate': 1e-06, 'epoch': 0.4}\n")
    [report] = ingest_paths(store, [path], format_name="trl-console")
    assert _errors(store) == [(1, "out-of-range"), (3, "out-of-range")]
    assert store.execute("SELECT line_no, value FROM step_metrics WHERE key = 'grad_norm' ORDER BY line_no").fetchall() \
        == [(2, 1.5), (4, float("inf"))]  # a printed 'inf' is the writer's own spelling


# --- wandb CSV exports

def test_a_wandb_csv_cell_beyond_a_double_rejects_its_row(store, tmp_path):
    path = tmp_path / "export.csv"
    path.write_text('"Step","r - a","r - b"\n"1","1e400","2"\n"2","3","-1e400"\n"3","inf","5"\n"4","1.5","2.5"\n')
    [report] = ingest_paths(store, [path])
    assert _errors(store) == [(2, "out-of-range"), (3, "out-of-range")]
    assert (report.lines, report.stored, report.rejected) == (5, 2, 2)
    assert store.execute("SELECT step, key, value FROM step_metrics ORDER BY step, key").fetchall() == [
        (3, "a", float("inf")), (3, "b", 5.0), (4, "a", 1.5), (4, "b", 2.5)]  # a written inf stays


@pytest.mark.parametrize("before", [b"exported from the wandb UI\n\n", b"# run export\n"], ids=["note", "comment"])
def test_a_wandb_csv_whose_first_line_is_not_its_header_is_read(store, tmp_path, before):
    path = tmp_path / "logs" / "export.csv"
    path.parent.mkdir()
    path.write_bytes(before + b'"Step","r - a"\n"1","1.5"\n"2","2.5"\n')
    [report] = ingest_paths(store, [tmp_path / "logs"])
    skipped = before.count(b"\n")
    assert (report.format, report.lines, report.stored, report.ignored) == ("wandb-csv", 3 + skipped, 2, 1 + skipped)
    assert store.execute("SELECT step, value, line_no FROM step_metrics ORDER BY step").fetchall() == [
        (1, 1.5, 2 + skipped), (2, 2.5, 3 + skipped)]


@pytest.mark.parametrize("damage", [b"", b'\n"3","4"2"'], ids=["clean", "with-a-bad-row"])
def test_a_nul_block_in_a_wandb_csv_header_never_reaches_the_key_names(store, tmp_path, damage):
    path = tmp_path / "export.csv"
    path.write_bytes(b'"Step","r - a' + bytes(16) + b'","r - b"\n"1","1.5","2"\n"2","3","4"' + damage + b"\n")
    [report] = ingest_paths(store, [path])
    assert report.status == "ingested", report
    assert store.execute("SELECT DISTINCT key FROM step_metrics").fetchall() == [("b",)]
    assert any("NUL bytes" in note for note in report.notes)


# --- compressed input: streamed, its expansion capped

def test_a_compressed_file_expanding_past_the_cap_is_a_one_line_error_and_costs_no_other_file(store, tmp_path,
                                                                                              monkeypatch):
    zstandard = pytest.importorskip("zstandard")
    from polytrace_cli.ingest import files

    monkeypatch.setattr(files, "EXPANSION_FREE_BYTES", 1 << 20)
    monkeypatch.setattr(files, "EXPANSION_MAX_RATIO", 50)
    run = tmp_path / "run"
    run.mkdir()
    # 8 MiB of one repeated line: a few KB compressed, past 50 times its size and the 1 MiB allowed.
    (run / "train.log.zst").write_bytes(zstandard.ZstdCompressor().compress((b"0" * 1023 + b"\n") * 8192))
    (run / "metrics.jsonl.gz").write_bytes(__import__("gzip").compress(
        "".join(json.dumps({"step": s, "data": {"timing_s/step": float(s)}}) + "\n" for s in (1, 2)).encode()))
    reports = {Path(r.path).name: r for r in ingest_paths(store, [run])}
    bomb = reports["train.log.zst"]
    assert bomb.status == "error" and "expands past 1,048,576 bytes" in bomb.message, bomb
    assert reports["metrics.jsonl.gz"].status == "ingested" and reports["metrics.jsonl.gz"].stored == 2


def test_a_zstd_file_cut_inside_a_frame_is_corrupt(store, tmp_path):
    zstandard = pytest.importorskip("zstandard")
    data = zstandard.ZstdCompressor().compress(
        "".join(json.dumps({"step": s, "data": {"timing_s/step": float(s)}}) + "\n" for s in range(1, 200)).encode())
    path = tmp_path / "metrics.jsonl.zst"
    path.write_bytes(data[:-9])
    [report] = ingest_paths(store, [path])
    assert report.status == "rejected" and "the last frame is cut short" in report.message


# --- the PolyTrace dataset JSON: one document, judged step entry by step entry

def test_a_bad_dataset_entry_is_that_entrys_error(store, tmp_path):
    entries = [f'"{step}": {{"input": [5, 6], "output": [7, 8, 9, 10]}}' for step in range(1, 5)]
    entries.insert(2, '"9": {"input": [1], "output": ' + "[" * 100_000 + "]" * 100_000 + "}")
    path = tmp_path / "dataset" / "math.json"
    path.parent.mkdir()
    data = ("{" + ", ".join(entries) + "}").encode().replace(b'"4": {"input": [5, 6]', b'"4": {"input": [5, 6], "x": "\xff"')
    path.write_bytes(data)
    [report] = ingest_paths(store, [path])
    assert report.status == "ingested", report
    assert _errors(store) == [(3, "invalid-json"), (5, "encoding-error")]
    assert (report.lines, report.stored, report.rejected) == (5, 3, 2)
    assert store.execute("SELECT step, count(*) FROM samples GROUP BY step ORDER BY step").fetchall() == [
        (1, 4), (2, 4), (3, 4)]


@pytest.mark.parametrize("fixture", ["trackio/gsm8k-grpo.db", "traces/nsys/worker_process_4242.sqlite"])
def test_every_sqlite_reader_takes_a_folder_named_with_uri_characters_as_a_name(store, tmp_path, fixture):
    """The Trackio and Nsight Systems readers open SQLite files as MLflow's does: the path is percent-encoded
    into the `file:` URI, so `#`, `?` and `%2F..` in a folder name neither cut the path short nor open or
    create another file."""
    import shutil

    source = Path(__file__).parent / "fixtures" / fixture
    plain = tmp_path / "plain" / source.name
    plain.parent.mkdir()
    shutil.copyfile(source, plain)
    odd = tmp_path / "logs" / "runs#1%2F..%2F..%2Fescape?x=1" / source.name
    odd.parent.mkdir(parents=True)
    shutil.copyfile(source, odd)
    (tmp_path / "logs" / "runs").mkdir()  # what an unescaped `#` would cut the path to: must stay empty
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    [expected] = ingest_paths(store, [plain], run_name="plain")
    [report] = ingest_paths(store, [odd], run_name="odd")
    assert report.status == "ingested" and report.format == expected.format and report.stored == expected.stored > 0
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if "store" not in p.name) == \
        [p for p in before if "store" not in p.name]
    assert not (tmp_path / "escape").exists()
