"""A console log read a block of lines at a time stores exactly what reading it whole stores."""

from __future__ import annotations

import codecs
import shutil
from pathlib import Path

import pytest

from conftest import copy_store, store_snapshot
from polytrace_cli.ingest.console import reading
from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.store import open_store

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CONSOLE_LOGS = sorted(p for p in FIXTURES.rglob("*.log"))


def _contents(con) -> dict[str, list[tuple]]:
    return store_snapshot(con, "format, format_version, lines, stored, ignored, rejected, rows")


def _ingest(tmp_path: Path, log: Path, name: str, fmt: str | None, empty_store: Path) -> dict[str, list[tuple]]:
    folder = tmp_path / name / "run"
    folder.mkdir(parents=True)
    shutil.copy(log, folder / log.name)
    con = open_store(copy_store(empty_store, tmp_path / name / "s.duckdb"))
    try:
        reports = ingest_paths(con, [folder / log.name], format_name=fmt)
        assert all(not r.failed for r in reports)
        return _contents(con)
    finally:
        con.close()


def _damaged_logs(folder: Path) -> list[Path]:
    """verl logs with what a block boundary could split differently: a byte-order mark, a byte that is
    not UTF-8 far from a line holding a real replacement character, NUL bytes, CRLF line ends, a last
    line without newline, a restart, and a file of carriage returns alone."""
    folder.mkdir()
    metric = "step:{} - timing_s/step:1.5 - actor/pg_loss:np.float64(0.25) - response_length/mean:100.0"
    lines = [metric.format(step) for step in range(1, 40)]
    lines[5] = "Error: a warning with a real \ufffd replacement character"
    lines[12] = metric.format(3)  # a restart
    data = codecs.BOM_UTF8 + "\n".join(lines).encode()
    data = data.replace(b"step:30 ", b"step:30\xff ").replace(b"step:20 ", b"step:20 \x00")
    logs = {"damaged.log": data, "crlf.log": "\r\n".join(lines).encode(),
            "cr_only.log": "\r".join(lines).encode() + b"\r"}
    for name, content in logs.items():
        (folder / name).write_bytes(content)
    return [folder / name for name in logs]


DAMAGED_LOGS = ("damaged.log", "crlf.log", "cr_only.log")


@pytest.mark.parametrize("log_name", [str(p.relative_to(FIXTURES)) for p in CONSOLE_LOGS] + list(DAMAGED_LOGS))
def test_every_console_fixture_stores_the_same_read_in_small_blocks(tmp_path, monkeypatch, empty_store_file,
                                                                     log_name):
    """Blocks cut every fixture in several places, in lines and between them: eight blocks a fixture
    (at least 64 bytes each), and 64-byte blocks through the damaged logs, whose byte-order mark, bad
    bytes, NUL bytes and CRLF pairs a cut must not split differently."""
    damaged = log_name in DAMAGED_LOGS
    log = _damaged_logs(tmp_path / "damaged")[DAMAGED_LOGS.index(log_name)] if damaged else FIXTURES / log_name
    fmt = ("openrlhf-console" if "openrlhf" in str(log) else "trl-console" if log.parent.name == "trl"
           else "verl-console")
    whole = _ingest(tmp_path, log, "whole", fmt, empty_store_file)
    block_bytes = 64 if damaged else max(64, log.stat().st_size // 8)
    monkeypatch.setattr(reading, "CONSOLE_BLOCK_BYTES", block_bytes)
    blocks = _ingest(tmp_path, log, "blocks", fmt, empty_store_file)
    monkeypatch.setattr(reading, "CONSOLE_BLOCK_BYTES", 8 << 20)
    assert repr(blocks) == repr(whole), log.name  # as text: a stored NaN equals itself
    assert whole["files"][0][2] > 0


def test_the_block_fixtures_are_many():
    assert len(CONSOLE_LOGS) + len(DAMAGED_LOGS) >= 10


def test_blocks_hold_the_lines_of_the_whole_file_numbered_on(tmp_path):
    path = tmp_path / "x.log"
    path.write_bytes(codecs.BOM_UTF8 + b"a\nbb\r\n\nccc\xff\nd\x00\nlast")
    whole = reading.read_console_lines(path)
    parts = list(reading.read_console_blocks(path, block_bytes=3))
    assert len(parts) > 2
    import polars as pl

    joined = pl.concat([part.select(whole.columns) if set(whole.columns) <= set(part.columns)
                        else part.with_columns(encoding=pl.lit(None, pl.String)).select(whole.columns)
                        for part in parts])
    assert joined.to_dicts() == whole.to_dicts()
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    assert [part.height for part in reading.read_console_blocks(empty)] == [0]
