"""Finding and hashing input files, and the CLI importing no heavy library before a command runs."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from polytrace_cli.ingest.files import LINK_OUTSIDE, LISTED_TWICE, FileHashes, hash_and_count, walk


def test_hash_size_and_lines_by_hand(tmp_path):
    cases = {"a": b"x\ny\n", "b": b"x\ny", "c": b"", "d": b"\n\n\n"}
    expected_lines = {"a": 2, "b": 2, "c": 0, "d": 3}
    for name, data in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        assert hash_and_count(path, chunk_size=2) == (hashlib.sha256(data).hexdigest(), len(data), expected_lines[name])


def test_walk_sorts_skips_hidden_and_store_files_and_names_problems(tmp_path):
    (tmp_path / "run" / ".cache").mkdir(parents=True)
    for name in ("b.log", "a.jsonl", "polytrace.duckdb", ".hidden", ".cache/x.log"):
        (tmp_path / "run" / name).write_text("x\n")
    found = list(walk([tmp_path / "run", tmp_path / "missing"]))
    assert [(p.name, explicit, problem) for p, explicit, problem in found] == [
        ("a.jsonl", False, None), ("b.log", False, None), ("missing", True, "no such file or directory"),
    ]


def test_walk_gives_files_in_folders_resolved_and_does_not_follow_linked_folders(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "inner").mkdir(parents=True)
    (elsewhere / "target.jsonl").write_text("x\n")
    (elsewhere / "inner" / "deep.jsonl").write_text("x\n")
    run = tmp_path / "run"
    (run / "sub").mkdir(parents=True)
    (run / "sub" / "b.jsonl").write_text("x\n")
    (run / "a.jsonl").symlink_to(elsewhere / "target.jsonl")
    (run / "linked").symlink_to(elsewhere / "inner", target_is_directory=True)
    (run / "c.jsonl").symlink_to(run / "sub" / "b.jsonl")
    given = tmp_path / "." / "run"
    found = [(path, problem) for path, _, problem in walk([given])]
    # A link out of the folder is not followed (skipped by its rule, under its own name); a link to a
    # file inside is that file, listed once.
    assert found == [(run.resolve() / "a.jsonl", LINK_OUTSIDE), ((run / "sub" / "b.jsonl").resolve(), None),
                     ((run / "sub" / "b.jsonl").resolve(), LISTED_TWICE)]


def test_prefetched_hash_is_computed_once_and_shared(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_bytes(b'{"a": 1}\n' * 1000)
    with FileHashes() as hashes:
        hashes.prefetch([path])
        first = hashes.future(path)
        assert hashes.future(tmp_path / "." / "trace.jsonl") is first
        assert hashes.result(path) == hash_and_count(path)


def test_cli_start_imports_neither_duckdb_nor_polars():
    probe = ("import sys, polytrace_cli.cli; "
             "print(sorted(m for m in ('duckdb', 'polars', 'pyarrow', 'scipy', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_ingesting_a_packed_trace_loads_neither_polars_nor_pydantic(tmp_path):
    trace = tmp_path / "run" / "packed_lengths_step_0.jsonl"
    trace.parent.mkdir()
    trace.write_text('{"step": 0, "rank": 0, "dp_rank": 0, "tp_rank": 0, "local_index": 0, "input": 5, '
                     '"output": [1, 2], "n_sampling": 2, "validate": false}\n')
    probe = (
        "import sys\n"
        "from polytrace_cli.cli import main\n"
        f"sys.argv = ['polytrace', 'ingest', {str(trace)!r}, '--db', {str(tmp_path / 's.duckdb')!r}]\n"
        "try:\n    main()\nexcept SystemExit as done:\n    assert not done.code, done.code\n"
        "print(type(sys.modules['polars']).__name__, 'pydantic' in sys.modules, 'numpy' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "_LazyModule False False"


# --- compressed logs, unusual names, failures -------------------------------------------------

import bz2  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import lzma  # noqa: E402
import os  # noqa: E402

import pytest  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from polytrace_cli.cli import app  # noqa: E402
from polytrace_cli.ingest.driver import ingest_paths  # noqa: E402

REWARD_LINES = b"".join(b'{"step": %d, "rank": 0, "reward_time_s": 1.5}\n' % step for step in (1, 2, 3)) + b"\n"


def _zstd(data: bytes) -> bytes:
    zstandard = pytest.importorskip("zstandard")
    # Two frames: a reader must go on after the first.
    return zstandard.ZstdCompressor().compress(data[:40]) + zstandard.ZstdCompressor().compress(data[40:])


COMPRESSORS = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress, ".zst": _zstd}


@pytest.mark.parametrize("suffix", sorted(COMPRESSORS))
@pytest.mark.parametrize("named", [True, False])
def test_compressed_logs_are_read_as_the_text_they_hold(store, tmp_path, suffix, named):
    folder = tmp_path / "run"
    folder.mkdir()
    path = folder / f"reward_timings_step_1.jsonl{suffix}"
    packed = COMPRESSORS[suffix](REWARD_LINES)
    path.write_bytes(packed)
    [report] = ingest_paths(store, [path if named else folder])
    assert (report.status, report.format, report.lines, report.stored, report.ignored) == (
        "ingested", "polytrace-reward", 4, 3, 1)
    assert store.execute("SELECT path, sha256, bytes, lines FROM files").fetchall() == [
        (str(path.resolve()), hashlib.sha256(packed).hexdigest(), len(packed), 4)]
    assert store.execute("SELECT step FROM rank_timings ORDER BY step").fetchall() == [(1,), (2,), (3,)]
    assert [r.status for r in ingest_paths(store, [path])] == ["unchanged"]


def test_a_damaged_archive_is_one_corrupt_file_error_and_the_others_go_on(store, tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "reward_timings_step_1.jsonl.gz").write_bytes(gzip.compress(REWARD_LINES)[:25])
    (folder / "reward_timings_step_2.jsonl.xz").write_bytes(b"not xz at all")
    (folder / "reward_timings_step_3.jsonl").write_bytes(REWARD_LINES)
    reports = {r.path.rsplit("/", 1)[-1]: r for r in ingest_paths(store, [folder])}
    assert reports["reward_timings_step_3.jsonl"].status == "ingested"
    assert {reports[n].status for n in ("reward_timings_step_1.jsonl.gz", "reward_timings_step_2.jsonl.xz")} == {
        "rejected"}
    codes = store.execute("SELECT f.path, e.code, e.line_no FROM ingest_errors e JOIN files f USING (file_id)"
                          " ORDER BY f.path").fetchall()
    assert [(p.rsplit("/", 1)[-1], code, line) for p, code, line in codes] == [
        ("reward_timings_step_1.jsonl.gz", "corrupt-file", None),
        ("reward_timings_step_2.jsonl.xz", "corrupt-file", None)]


def test_zst_without_zstandard_is_a_one_line_error(tmp_path):
    path = tmp_path / "run" / "reward_timings_step_1.jsonl.zst"
    path.parent.mkdir()
    path.write_bytes(b"\x28\xb5\x2f\xfd whatever")
    good = tmp_path / "run" / "reward_timings_step_2.jsonl"
    good.write_bytes(REWARD_LINES)
    probe = ("import sys; sys.modules['zstandard'] = None; from polytrace_cli.cli import main; "
             f"sys.argv = ['polytrace', 'ingest', {str(path)!r}, {str(good)!r}, '--db', {str(tmp_path / 's.duckdb')!r}];"
             " main()")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 1
    assert "needs the zstandard package: pip install 'polytrace[zstd]'" in done.stderr
    assert "Traceback" not in done.stderr and "1 file(s) could not be ingested" in done.stderr


def test_file_names_that_are_not_utf8_are_stored_and_printed(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    odd = os.fsdecode(os.fsencode(folder) + b"/reward_timings_step_\xff.jsonl")
    with open(odd, "wb") as handle:
        handle.write(REWARD_LINES)
    db = tmp_path / "s.duckdb"
    result = subprocess.run([sys.executable, "-m", "polytrace_cli.cli", "ingest", odd, "--db", str(db), "--json"],
                            capture_output=True, text=True, env={**os.environ, "PYTHONIOENCODING": "utf-8"})
    assert result.returncode == 0, result.stderr
    [report] = json.loads(result.stdout)
    assert report["path"].endswith("reward_timings_step_\\xff.jsonl") and report["stored"] == 3
    table = CliRunner().invoke(app, ["query", "select path from files", "--db", str(db), "--csv"])
    assert table.stdout.strip().endswith("reward_timings_step_\\xff.jsonl")


def test_nothing_that_failed_creates_a_run(store, tmp_path):
    only_bad = tmp_path / "broken"
    only_bad.mkdir()
    (only_bad / "reward_timings_step_1.jsonl.gz").write_bytes(b"\x1f\x8b damaged")
    (only_bad / "samples.table.json").write_text("{not json")
    reports = ingest_paths(store, [only_bad / "reward_timings_step_1.jsonl.gz", only_bad / "samples.table.json"])
    assert [r.status for r in reports] == ["rejected", "rejected"]
    assert all("not stored" in " ".join(r.notes) for r in reports)
    assert store.execute("SELECT count(*) FROM runs").fetchall() == [(0,)]
    assert store.execute("SELECT count(*) FROM files").fetchall() == [(0,)]


def test_an_unreadable_named_file_is_reported_and_the_others_are_ingested(tmp_path):
    unreadable = "/proc/self/mem"  # a regular file whose read fails with an I/O error
    try:
        with open(unreadable, "rb") as handle:
            handle.read(1)
        pytest.skip("this system lets /proc/self/mem be read")
    except OSError:
        pass
    good = tmp_path / "run" / "reward_timings_step_1.jsonl"
    good.parent.mkdir()
    good.write_bytes(REWARD_LINES)
    db = tmp_path / "s.duckdb"
    result = CliRunner().invoke(app, ["ingest", unreadable, str(good), "--db", str(db), "--json"])
    assert result.exit_code == 1
    reports = {r["path"]: r for r in json.loads(result.stdout)}
    assert reports[unreadable]["status"] == "error" and reports[unreadable]["message"].startswith("cannot read")
    assert reports[str(good)]["status"] == "ingested" and reports[str(good)]["stored"] == 3
