"""Damaged and unusual input files with known truth: how many of their lines hold a good record.

Each case writes its files into a folder and says what a correct ingest does with them: how
many lines are stored (the good ones, which no bad line or bad file may cost) and which files
must be stored rather than skipped. `crash_harness` in benchmarks/ runs many seeded variants; the
bounded test runs one of each. The sandbox attempts (`SANDBOX_ATTEMPTS`) are stores, lakes and `query`
texts that try to read or write files outside the store: none may show the secret they aim at or
write a file (`crash_harness --sandbox`).
"""

from __future__ import annotations

import importlib.util
import json
import random
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Case:
    name: str
    paths: list[Path]          # what `polytrace ingest` is given
    stored: int                # lines that must be stored, over every file
    must_read: list[Path]      # files that must not be skipped


def _verl_jsonl_line(step: int, rng: random.Random) -> str:
    return json.dumps({"step": step, "data": {"timing_s/step": round(rng.uniform(5, 60), 3),
                                              "timing_s/gen": round(rng.uniform(1, 30), 3)}})


def _verl_console_line(step: int, rng: random.Random) -> str:
    return (f"step:{step} - timing_s/gen:{rng.uniform(1, 30):.3f} - timing_s/step:{rng.uniform(30, 60):.3f}"
            f" - response_length/mean:{rng.uniform(100, 900):.1f}")


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def verl_jsonl_with_bad_first_line(folder: Path, rng: random.Random, steps: int = 12) -> Case:
    """A verl JSONL walked in a folder whose first line is not a record (a warning, a traceback, NUL
    bytes, a step of 1e400, a line nested too deep)."""
    first = rng.choice([
        b"WARNING: something about CUDA\n",
        b"Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: no\n",
        b"\x00" * rng.randint(1, 4000) + b"\n",
        b'{"step": 1e400, "data": {"timing_s/step": 1.0}}\n',
        b'{"step": 0, "data": ' + b"[" * 200_000 + b"]" * 200_000 + b"}\n",
    ])
    good = "".join(_verl_jsonl_line(step, rng) + "\n" for step in range(1, steps + 1)).encode()
    path = _write(folder / "run" / "metrics.jsonl", first + good)
    return Case("verl-jsonl bad first line", [folder / "run"], steps, [path])


def verl_jsonl_bad_middle(folder: Path, rng: random.Random, steps: int = 12) -> Case:
    """A verl JSONL named on the command line with one bad line among good ones: a line nested too
    deep for a recursive parser, 400-digit numbers, 1e400, a line cut short."""
    bad = rng.choice([
        b'{"step": 99, "data": {"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}",
        b'{"step": 99, "data": {"x": 1' + b"0" * 400 + b"}}",
        b'{"step": 99, "data": {"x": -1e400}}',
        b'{"step": 99, "data": {"x": 1',
    ])
    lines = [_verl_jsonl_line(step, rng).encode() for step in range(1, steps + 1)]
    lines.insert(rng.randint(1, len(lines)), bad)
    path = _write(folder / "named" / "metrics.jsonl", b"\n".join(lines) + b"\n")
    return Case("verl-jsonl bad middle line", [path], steps, [path])


def jsonl_cr_only(folder: Path, rng: random.Random, steps: int = 10) -> Case:
    """A verl JSONL whose lines end in CR alone (old Mac line ends)."""
    text = "\r".join(_verl_jsonl_line(step, rng) for step in range(1, steps + 1)) + "\r"
    path = _write(folder / "cr" / "metrics.jsonl", text.encode())
    return Case("verl-jsonl CR-only line ends", [path], steps, [path])


def console_after_long_startup(folder: Path, rng: random.Random, steps: int = 15) -> Case:
    """A wandb run's output.log whose first metric line comes after more than 64 KB of start-up output."""
    noise_lines = rng.randint(1200, 3000)
    noise = "".join(f"(WorkerDict pid={rng.randint(1000, 9999)}) loading shard {i} of the model weights ...\n"
                    for i in range(noise_lines))
    metrics = "".join(_verl_console_line(step, rng) + "\n" for step in range(1, steps + 1))
    path = _write(folder / "wandb" / "run-20250101_000000-abc" / "files" / "output.log", (noise + metrics).encode())
    return Case("console after long start-up", [folder / "wandb"], steps, [path])


def wandb_csv_damaged(folder: Path, rng: random.Random, rows: int = 16) -> Case:
    """A wandb CSV export with one damaged row (NUL, bad UTF-8, a stray quote, a cut last line) or
    CR-only line ends; every good row must be stored."""
    lines = ['"Step","run - timing_s/step","run - timing_s/gen"']
    lines += [f'"{step}","{rng.uniform(30, 60):.3f}","{rng.uniform(1, 30):.3f}"' for step in range(1, rows + 1)]
    encoded = [line.encode() for line in lines]
    damage = rng.choice(["nul", "utf8", "quote", "cut", "cr"])
    good = rows
    ending = b"\n"
    if damage == "nul":
        encoded.insert(rng.randint(1, len(encoded)), b'"99","4\x002","1"')
    elif damage == "utf8":
        encoded.insert(rng.randint(1, len(encoded)), b'"99","4\xff2","1"')
    elif damage == "quote":
        encoded.insert(rng.randint(1, len(encoded)), b'"99","4"2","1"')
    elif damage == "cut":
        encoded.append(b'"99","4')
        ending = b""
    else:
        ending = b"\r"
    data = (b"\r" if damage == "cr" else b"\n").join(encoded) + ending
    path = _write(folder / "export" / f"wandb_{damage}.csv", data)
    return Case(f"wandb csv {damage}", [path], good, [path])


def wandb_table_bad_byte(folder: Path, rng: random.Random, rows: int = 6) -> Case:
    """A wandb table with one byte that is not UTF-8 in a generation, or a UTF-8 byte order mark."""
    data = [[step, f"prompt {step}", f"answer {step}", 1.0] for step in range(1, rows + 1)]
    text = json.dumps({"columns": ["step", "input", "output", "score"], "data": data}).encode()
    bad_byte = rng.random() < 0.5
    if bad_byte:  # one row holds the byte: that row alone is rejected
        text = text.replace(b"answer 3", b"answer \xff3")
    else:
        text = b"\xef\xbb\xbf" + text
    path = _write(folder / "files" / "media" / "table" / "val" / "generations_6_0a1b.table.json", text)
    return Case("wandb table bad byte" if bad_byte else "wandb table BOM", [path], rows - bad_byte, [path])


def wandb_summary_bom(folder: Path, rng: random.Random) -> Case:
    """wandb-summary.json written with a UTF-8 byte order mark."""
    document = {"_step": 10, "_runtime": 123.5, "timing_s/step": 41.0}
    path = _write(folder / "files" / "wandb-summary.json", b"\xef\xbb\xbf" + json.dumps(document).encode())
    return Case("wandb-summary BOM", [path], len(document), [path])


def verl_jsonl_after_other_lines(folder: Path, rng: random.Random, steps: int = 8) -> Case:
    """A small verl JSONL walked in a folder whose records come after 30 KB or more of other lines
    (hundreds of warnings), all within the first sniffed block."""
    noise = "".join(f"WARNING: retrying the reward call {i} of the batch ...\n" for i in range(rng.randint(600, 1100)))
    good = "".join(_verl_jsonl_line(step, rng) + "\n" for step in range(1, steps + 1))
    path = _write(folder / "run" / "metrics.jsonl", (noise + good).encode())
    return Case("verl-jsonl after 30 KB of other lines", [folder / "run"], steps, [path])


def rollout_dump_first_line_warning(folder: Path, rng: random.Random, samples: int = 6) -> Case:
    """A verl rollout dump `{step}.jsonl` whose first line is a warning printed into it."""
    first = rng.choice(["UserWarning: the tokenizer has no pad token\n", "\n\n", "Traceback (most recent call last):\n"])
    lines = "".join(json.dumps({"input": f"prompt {i // 2}", "output": "answer " * rng.randint(1, 20), "score": 1.0,
                                "step": 3}) + "\n" for i in range(samples))
    path = _write(folder / "rollout" / "3.jsonl", (first + lines).encode())
    return Case("rollout dump first line a warning", [folder / "rollout"], samples, [path])


def small_log_with_a_damaged_long_line(folder: Path, rng: random.Random, steps: int = 10) -> Case:
    """A small verl console log holding one long line with a damaged byte (a NUL or a byte that is
    not UTF-8) in the middle: more than half of its bytes, but the file is text."""
    lines = [_verl_console_line(step, rng) for step in range(1, steps + 1)]
    damaged = ("(TaskRunner pid=1) " + "x" * rng.randint(20_000, 40_000)).encode()
    at = rng.randint(100, len(damaged) - 100)
    damaged = damaged[:at] + rng.choice([b"\x00", b"\xff", b"\x00" * 8]) + damaged[at:]
    encoded = [line.encode() for line in lines]
    encoded.insert(rng.randint(1, len(encoded) - 1), damaged)
    path = _write(folder / "job" / "train.log", b"\n".join(encoded) + b"\n")
    return Case("small log with a damaged long line", [folder / "job"], steps, [path])


def mlflow_metric_bom_or_cr(folder: Path, rng: random.Random, steps: int = 6) -> Case:
    """An MLflow file-store metric file written with a byte order mark or CR-only line ends."""
    run = folder / "mlruns" / "0" / "abc123"
    _write(run / "meta.yaml", b"run_id: abc123\nexperiment_id: '0'\nrun_name: grpo\n")
    lines = [f"{1700000000000 + step} {rng.uniform(5, 60):.4f} {step}" for step in range(1, steps + 1)]
    data = ("\r".join(lines) + "\r").encode() if rng.random() < 0.5 else b"\xef\xbb\xbf" + "\n".join(lines).encode()
    path = _write(run / "metrics" / "timing_s" / "step", data)
    # meta.yaml is one stored entry of its own.
    return Case("mlflow metric file BOM or CR", [folder / "mlruns"], steps + 1, [path])


def wandb_csv_header_not_first(folder: Path, rng: random.Random, rows: int = 8) -> Case:
    """A wandb CSV export walked in a folder whose first lines are a note, not its header."""
    note = rng.choice(['exported from the wandb UI\n\n', '# project: rl\n', '\n'])
    body = '"Step","run - timing_s/step"\n' + "".join(f'"{s}","{rng.uniform(30, 60):.3f}"\n' for s in range(1, rows + 1))
    path = _write(folder / "exports" / "wandb.csv", (note + body).encode())
    return Case("wandb csv header not first", [folder / "exports"], rows, [path])


def trainer_state_bad_entry(folder: Path, rng: random.Random, steps: int = 8) -> Case:
    """A trainer_state.json with one hostile log_history entry: a 400-digit value, 1e400, a step of
    1e400 or NaN, or a value nested 100,000 deep."""
    entries = [json.dumps({"loss": round(rng.uniform(0, 1), 4), "grad_norm": round(rng.uniform(0, 5), 4), "step": s})
               for s in range(1, steps + 1)]
    bad = rng.choice(['{"loss": 1' + "0" * 400 + ', "step": 99}', '{"loss": 1e400, "step": 99}', '{"loss": 1, "step": 1e400}',
                      '{"loss": 1, "step": NaN}', '{"loss": ' + "[" * 100_000 + "]" * 100_000 + ', "step": 99}'])
    entries.insert(rng.randint(0, len(entries)), bad)
    text = '{"global_step": %d, "log_history": [%s]}' % (steps, ", ".join(entries))
    path = _write(folder / "output" / "trainer_state.json", text.encode())
    return Case("trainer_state bad entry", [folder / "output"], steps, [path])


def mlflow_db_bad_rows(folder: Path, rng: random.Random, steps: int = 6) -> Case:
    """An MLflow SQLite store in a folder named with URI characters, with bad metrics rows (a text
    value, an infinite value, a step of 2.5, a run missing from `runs`) among good ones."""
    import sqlite3

    path = folder / rng.choice(["runs#1", "a%2F..%2Fb", "q?mode=rwc"]) / "mlflow.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as con:
        con.executescript(
            "CREATE TABLE runs (run_uuid TEXT PRIMARY KEY, name TEXT, status TEXT, start_time BIGINT, end_time BIGINT,"
            " lifecycle_stage TEXT, experiment_id INTEGER);"
            "CREATE TABLE metrics (key TEXT, value FLOAT NOT NULL, timestamp BIGINT, run_uuid TEXT, step BIGINT NOT NULL,"
            " is_nan BOOLEAN NOT NULL);"
            "CREATE TABLE params (key TEXT, value TEXT, run_uuid TEXT); CREATE TABLE tags (key TEXT, value TEXT, run_uuid TEXT);"
            "INSERT INTO runs VALUES ('r1', 'grpo', 'FINISHED', 1, NULL, 'active', 0);")
        rows = [("timing_s/step", rng.uniform(5, 60), step, "r1") for step in range(1, steps + 1)]
        rows.insert(rng.randint(0, len(rows)), rng.choice([("timing_s/step", "fast", 99, "r1"),
                                                           ("timing_s/step", float("inf"), 99, "r1"),
                                                           ("timing_s/step", 1.0, 2.5, "r1"),
                                                           ("timing_s/step", 1.0, 99, "gone")]))
        con.executemany("INSERT INTO metrics VALUES (?, ?, 0, ?, ?, 0)", [(k, v, r, s) for k, v, s, r in rows])
    con.close()
    return Case("mlflow db bad rows", [folder], steps, [path])


# --- record logs: wandb's LevelDB-style framing, written out here as its writer lays it down

WANDB_BLOCK = 32 * 1024
WANDB_FILE_HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def record_piece(kind: int, piece: bytes) -> bytes:
    """One piece of a record behind its 7-byte header: CRC-32 of the type byte then the data, length, type."""
    return struct.pack("<IHB", zlib.crc32(piece, zlib.crc32(bytes([kind]))), len(piece), kind) + piece


def wandb_record_log(bodies: list[bytes]) -> bytes:
    """A wandb record log holding `bodies`, framed as LevelDB's log writer (which wandb's follows) frames
    them: a block tail shorter than a header is zero padding; a record that does not fit its block is
    split into first, middle and last pieces; with exactly a header's room left, the first piece is empty."""
    out = bytearray(WANDB_FILE_HEADER)
    for body in bodies:
        left, first = body, True
        while True:
            room = WANDB_BLOCK - len(out) % WANDB_BLOCK
            if room < 7:
                out += bytes(room)
                continue
            piece, left = left[:room - 7], left[room - 7:]
            kind = (FULL if not left else FIRST) if first else (LAST if not left else MIDDLE)
            out += record_piece(kind, piece)
            first = False
            if not left:
                break
    return bytes(out)


def wandb_history(step, values: dict[str, str]) -> bytes:
    """A wandb `Record` holding one history row: `_step` and each value as the JSON text given."""
    from wandb.proto import wandb_internal_pb2 as pb

    items = [pb.HistoryItem(key="_step", value_json=str(step))]
    items += [pb.HistoryItem(key=key, value_json=text) for key, text in values.items()]
    return pb.Record(history=pb.HistoryRecord(item=items)).SerializeToString()


HOSTILE_WANDB_VALUES = {
    "400 digits": ({"_step": "7"}, {"timing_s/step": "1" + "0" * 400}, "out-of-range"),
    "1e400": ({"_step": "7"}, {"timing_s/step": "1e400"}, "out-of-range"),
    "step 1e400": ({"_step": "1e400"}, {"timing_s/step": "3.5"}, "out-of-range"),
    "step NaN": ({"_step": "NaN"}, {"timing_s/step": "3.5"}, "type-error"),
    "deep": ({"_step": "7"}, {"timing_s/step": "[" * 100_000 + "]" * 100_000}, "invalid-json"),
}


def wandb_offline_bad_record(folder: Path, rng: random.Random, steps: int = 12) -> Case:
    """A wandb offline log with one hostile history record among good ones (a 400-digit value, 1e400,
    a `_step` of 1e400 or NaN, a value nested 100,000 deep), and, half the time, a record header whose
    length runs past its block: only the rest of that block may be lost."""
    name = rng.choice(sorted(HOSTILE_WANDB_VALUES))
    step_item, values, _ = HOSTILE_WANDB_VALUES[name]
    bodies = [wandb_history(step, {"timing_s/step": f"{rng.uniform(5, 60):.3f}", "note": json.dumps("x" * 3000)})
              for step in range(1, steps + 1)]
    bodies.insert(rng.randint(1, len(bodies)), wandb_history(step_item["_step"], values))
    data = bytearray(wandb_record_log(bodies))
    stored = steps
    if rng.random() < 0.5:  # spoil the length of the first full record past the first block
        at = next(offset for offset, kind, _ in record_pieces(bytes(data)) if kind == FULL and offset > WANDB_BLOCK)
        block_end = (at // WANDB_BLOCK + 1) * WANDB_BLOCK
        stored -= sum(not any(marker in data[offset + 7:offset + 7 + length] for marker in HOSTILE_MARKERS)
                      for offset, kind, length in record_pieces(bytes(data)) if kind in (FULL, FIRST)
                      and at <= offset < block_end)
        struct.pack_into("<H", data, at + 4, 60_000)
    path = _write(folder / "wandb" / "offline-run-20250101_000000-abc" / "run-abc.wandb", bytes(data))
    return Case(f"wandb offline {name}", [folder / "wandb"], stored, [path])


# Bytes only the hostile record of `wandb_offline_bad_record` holds.
HOSTILE_MARKERS = (b"1e400", b"NaN", b"0" * 400, b"[" * 100)


def record_pieces(data: bytes):
    """(offset, type, length) of each piece of a well-framed wandb record log, padding passed over."""
    offset = len(WANDB_FILE_HEADER)
    while offset + 7 <= len(data):
        room = WANDB_BLOCK - offset % WANDB_BLOCK
        if room < 7:
            offset += room
            continue
        _, length, kind = struct.unpack_from("<IHB", data, offset)
        yield offset, kind, length
        offset += 7 + length


CASES: list[Callable[[Path, random.Random], Case]] = [
    verl_jsonl_with_bad_first_line, verl_jsonl_bad_middle, jsonl_cr_only, console_after_long_startup,
    wandb_csv_damaged, wandb_table_bad_byte, wandb_summary_bom, verl_jsonl_after_other_lines,
    rollout_dump_first_line_warning, small_log_with_a_damaged_long_line, mlflow_metric_bom_or_cr,
    wandb_csv_header_not_first, trainer_state_bad_entry, mlflow_db_bad_rows,
]


def tensorboard_bad_record(folder: Path, rng: random.Random, steps: int = 12) -> Case:
    """A TensorBoard event file with one damaged record among good ones: a length of 2^62 whose own
    CRC is right, a flipped data byte, or a malformed tensor; the records after it must be kept."""
    import numpy as np
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
    from tensorboard.util import tensor_util

    def record(data: bytes) -> bytes:
        length = struct.pack("<Q", len(data))
        return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))

    def scalar_event(step: int, value: float) -> bytes:
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag="timing_s/step", simple_value=value)])
        return event_pb2.Event(step=step, wall_time=1e9 + step, summary=summary).SerializeToString()

    records = [record(event_pb2.Event(wall_time=1e9, file_version="brain.Event:2").SerializeToString())]
    records += [record(scalar_event(step, rng.uniform(5, 60))) for step in range(1, steps + 1)]
    damage = rng.choice(["length", "flip", "tensor"])
    at = rng.randint(2, len(records) - 1)
    if damage == "length":
        length = struct.pack("<Q", 2**62)
        records[at] = length + struct.pack("<I", masked_crc32c(length)) + records[at][12:]
    elif damage == "flip":
        spoiled = bytearray(records[at])
        spoiled[14] ^= 0xFF
        records[at] = bytes(spoiled)
    else:
        tensor = tensor_util.make_tensor_proto(np.float32(1.0))
        tensor.ClearField("float_val")
        tensor.tensor_content = b"\x01\x02\x03"
        bad = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag="timing_s/step", tensor=tensor)])
        records[at] = record(event_pb2.Event(step=99, summary=bad).SerializeToString())
    path = _write(folder / "run" / "tensorboard_log" / "events.out.tfevents.1700000000.host", b"".join(records))
    return Case(f"tensorboard {damage}", [folder / "run"], steps - 1, [path])


# The optional readers' cases run where their package is installed.
if importlib.util.find_spec("wandb") is not None:
    CASES.append(wandb_offline_bad_record)
if importlib.util.find_spec("tensorboard") is not None:
    CASES.append(tensorboard_bad_record)


# --- sandbox attempts: stores, lakes and `query` texts that try to read or write outside the store

@dataclass
class Attempt:
    name: str
    args: list[str]            # polytrace's arguments (the store or lake given with --db)
    secret: str                # text of the files outside that no output may show
    watched: list[Path]        # folders nothing may be written into
    refused: bool              # must end with a one-line error (else any exit, the secret unshown)


def outside_files(folder: Path, rng: random.Random) -> tuple[Path, str]:
    """(a folder beside the store, its secret): the secret written as text, CSV, JSON, Parquet, a
    DuckDB table and a file name, for an attempt to read."""
    import duckdb

    secret = f"polytrace-secret-{rng.getrandbits(64):016x}"
    outside = folder / "outside"
    outside.mkdir(parents=True)
    (outside / "secret.txt").write_text(secret + "\n")
    (outside / "secret.csv").write_text(f"a\n{secret}\n")
    (outside / "secret.json").write_text(json.dumps({"a": secret}) + "\n")
    (outside / f"{secret}.name").write_text("x\n")
    con = duckdb.connect(str(outside / "other.duckdb"))
    try:
        con.execute("CREATE TABLE t AS SELECT ? AS a", [secret])
        con.execute(f"COPY t TO '{outside / 'secret.parquet'}' (FORMAT parquet)")
    finally:
        con.close()
    return outside, secret


def _reader(outside: Path, rng: random.Random) -> str:
    """A FROM clause reading the outside folder's secret."""
    return rng.choice([
        f"read_text('{outside}/secret.txt')", f"read_blob('{outside}/secret.txt')",
        f"read_csv('{outside}/secret.csv')", f"read_json('{outside}/secret.json')",
        f"read_parquet('{outside}/secret.parquet')", f"glob('{outside}/*')", f"'{outside}/secret.csv'",
        f"read_csv('{outside}/../outside/secret.csv')",
    ])


def crafted_store(store: Path, copy: Path, statements: list[str]) -> Path:
    """A copy of the polytrace store `store` at `copy`, with `statements` run on it."""
    import shutil

    import duckdb

    copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(store, copy)
    con = duckdb.connect(str(copy))
    try:
        for statement in statements:
            con.execute(statement)
    finally:
        con.close()
    return copy


_READING_COMMANDS = (["runs", "--json"], ["errors", "--json"], ["steps", "alpha", "--json"], ["rename", "alpha", "beta"])


def store_table_as_view(folder: Path, rng: random.Random, store: Path) -> Attempt:
    """A store whose table of polytrace's is replaced by a view over a file outside: refused."""
    outside, secret = outside_files(folder, rng)
    table = rng.choice(["ingest_errors", "runs", "files", "step_metrics", "ignored_lines"])
    sent = crafted_store(store, folder / "store" / "sent.duckdb", [f"DROP TABLE {table}",
                                          f"CREATE VIEW {table} AS SELECT * FROM {_reader(outside, rng)}"])
    command = rng.choice([*_READING_COMMANDS, ["query", f"select * from {table}", "--json"]])
    return Attempt(f"table {table} as a view over a file", [*command, "--db", str(sent)], secret,
                   [outside], refused=True)


def store_own_view_replaced(folder: Path, rng: random.Random, store: Path) -> Attempt:
    """A store whose own view (samples, steps, named_step_metrics) reads a file outside: polytrace reads
    through its own definition (or refuses); the secret is never shown."""
    outside, secret = outside_files(folder, rng)
    view = rng.choice(["samples", "steps", "named_step_metrics"])
    sent = crafted_store(store, folder / "store" / "sent.duckdb", [f"DROP VIEW {view}",
                                          f"CREATE VIEW {view} AS SELECT * FROM {_reader(outside, rng)}"])
    command = rng.choice([*_READING_COMMANDS, ["query", f"select * from {view}", "--json"]])
    return Attempt(f"own view {view} over a file", [*command, "--db", str(sent)], secret, [outside],
                   refused=False)


def store_foreign_view(folder: Path, rng: random.Random, store: Path) -> Attempt:
    """A store holding a view of its own (in the main schema or another) over a file outside: refused."""
    outside, secret = outside_files(folder, rng)
    schema = rng.choice(["", "elsewhere."])
    statements = ["CREATE SCHEMA elsewhere"] if schema else []
    sent = crafted_store(store, folder / "store" / "sent.duckdb", [*statements,
                                          f"CREATE VIEW {schema}leak AS SELECT * FROM {_reader(outside, rng)}"])
    command = rng.choice([*_READING_COMMANDS, ["query", f"select * from {schema}leak", "--json"]])
    return Attempt("a view of its own over a file", [*command, "--db", str(sent)], secret, [outside],
                   refused=True)


def store_macro_shadowing(folder: Path, rng: random.Random, store: Path) -> Attempt:
    """A store holding a macro named like a built-in (a scalar one changing numbers, a table one reading
    a file outside): refused."""
    outside, secret = outside_files(folder, rng)
    macro = rng.choice([
        "CREATE MACRO coalesce(a, b) AS 42", "CREATE MACRO round(a, b) AS 42", "CREATE MACRO abs(a) AS -1",
        "CREATE MACRO lower(a) AS 'x'", "CREATE MACRO greatest(a, b) AS 0",
        f"CREATE MACRO range(n) AS TABLE SELECT * FROM {_reader(outside, rng)}",
        f"CREATE MACRO unnest_all(n) AS TABLE SELECT * FROM {_reader(outside, rng)}",
    ])
    sent = crafted_store(store, folder / "store" / "sent.duckdb", [macro])
    command = rng.choice([*_READING_COMMANDS, ["query", "select count(*) as n from range(3)", "--json"]])
    return Attempt(f"macro {macro.split()[2].split('(')[0]}", [*command, "--db", str(sent)], secret,
                   [outside], refused=True)


def query_outside(folder: Path, rng: random.Random, store: Path) -> Attempt:
    """`query` on a sound store with SQL that reads, writes or attaches a file outside, loads an
    extension or unlocks the configuration: refused."""
    outside, secret = outside_files(folder, rng)
    sql = rng.choice([
        f"select * from {_reader(outside, rng)}",
        f"select (select count(*) from {_reader(outside, rng)}) as n",
        f"select * from runs, {_reader(outside, rng)}",
        f"select * from sniff_csv('{outside}/secret.csv')",
        f"copy (select name from runs) to '{outside}/copied.csv'",
        f"attach '{outside}/other.duckdb' as other",
        f"select * from '{outside}/other.duckdb'",
        f"export database '{outside}/exported'",
        "install httpfs", "load parquet",
        "set enable_external_access = true", "reset lock_configuration", "set allowed_directories = ['/']",
        f"select 1 as one; select * from {_reader(outside, rng)}",
        "create table kept as select 1 as one",
        f"pragma import_database('{outside}')",
    ])
    return Attempt("query outside", ["query", sql, "--db", str(store), "--json"], secret, [outside], refused=True)


def _lake_of(store: Path, folder: Path) -> Path:
    from polytrace_cli.ingest.registry import declared_metric_names
    from polytrace_cli.store import open_store
    from polytrace_cli.store.lake import write_lake

    lake = folder / "lake"
    con = open_store(store, read_only=True, metric_names=declared_metric_names)
    try:
        write_lake(con, lake)
    finally:
        con.close()
    return lake


def lake_pointing_outside(folder: Path, rng: random.Random, store: Path) -> Attempt:
    """A lake whose manifest lists a file outside it (by `..`, by an absolute path, through a link in
    the lake), a view polytrace does not define or a column type that is SQL, or a sound lake
    queried for a file outside: refused."""
    outside, secret = outside_files(folder, rng)
    lake = _lake_of(store, folder)
    manifest_path = lake / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    damage = rng.choice(["dotdot", "absolute", "link", "view", "type", "query"])
    entry = next(file for file in manifest["files"] if file["table"] == "runs")
    if damage == "dotdot":
        entry["path"] = "runs/../../outside/secret.parquet"
    elif damage == "absolute":
        entry["path"] = str(outside / "secret.parquet")
    elif damage == "link":
        listed = lake / entry["path"]
        listed.unlink()
        listed.symlink_to(outside / "secret.parquet")
    elif damage == "view":
        manifest["views"]["leak"] = f"CREATE VIEW leak AS SELECT * FROM {_reader(outside, rng)}"
    elif damage == "type":
        name, _ = manifest["tables"]["runs"]["columns"][0]
        manifest["tables"]["runs"]["columns"][0] = [
            name, f"VARCHAR) AS x, (SELECT string_agg(content) FROM read_text('{outside}/secret.txt')) AS y --"]
    manifest_path.write_text(json.dumps(manifest))
    sql = f"select * from {_reader(outside, rng)}" if damage == "query" else "select * from runs"
    command = rng.choice([["query", sql], ["runs"], ["errors"]]) if damage != "query" else ["query", sql]
    return Attempt(f"lake {damage}", [*command, "--db", str(lake), "--json"], secret, [outside], refused=True)


def query_past_limits(folder: Path, rng: random.Random, store: Path) -> Attempt:
    """`query` with no end (a recursive CTE, a cross join of large ranges) or a result larger than its
    memory limit: stopped by its limit with one line (the harness counts one not stopped as an escape)."""
    outside, secret = outside_files(folder, rng)
    sql, limit = rng.choice([
        ("with recursive r(n) as (select 1 union all select n + 1 from r) select count(*) as n from r",
         ["--time-limit", "0.3"]),
        ("select count(*) as n from range(100000000) a, range(100000000) b", ["--time-limit", "0.3"]),
        ("select sum(a.range * b.range) as n from range(1000000) a cross join range(1000000) b",
         ["--time-limit", "0.3"]),
        ("select list(range) as l from range(50000000)", ["--memory-limit", "64MB"]),
        ("select string_agg(repeat('x', 1000), '') as s from range(10000000)", ["--memory-limit", "64MB"]),
    ])
    return Attempt("query past its limits", ["query", sql, *limit, "--db", str(store), "--json"], secret, [outside],
                   refused=True)


SANDBOX_ATTEMPTS: list[Callable[[Path, random.Random, Path], Attempt]] = [
    store_table_as_view, store_own_view_replaced, store_foreign_view, store_macro_shadowing, query_outside,
    lake_pointing_outside, query_past_limits,
]


def folder_state(folders: list[Path]) -> list[tuple[str, int, int]]:
    """(path, size, modification time) of every file under `folders`: what an attempt may not change."""
    return sorted((str(path), path.lstat().st_size, path.lstat().st_mtime_ns)
                  for folder in folders for path in folder.rglob("*"))


def judge_attempt(attempt: Attempt, exit_code: int | None, output: str, before: list) -> dict:
    """What an attempt's command did: a traceback printed; an escape (the secret shown, a file written
    under a watched folder, or the command not ended: `exit_code` None); accepted (an attempt to be
    refused that exited 0). `before`: `folder_state(attempt.watched)` before the command ran."""
    return {"attempt": attempt.name, "args": attempt.args[:2], "exit": exit_code,
            "traceback": "Traceback" in output,
            "escaped": attempt.secret in output or folder_state(attempt.watched) != before or exit_code is None,
            "accepted": attempt.refused and exit_code == 0}
