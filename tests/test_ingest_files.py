"""Finding and hashing input files, and the CLI importing no heavy library before a command runs."""

from __future__ import annotations

import hashlib
import subprocess
import sys

from polytrace_cli.ingest.files import FileHashes, hash_and_count, walk


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
        "print(type(sys.modules['polars']).__name__, 'pydantic' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "_LazyModule False"
