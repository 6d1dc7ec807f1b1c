"""PolyTrace traces: golden counts against a direct count of the JSON, idempotence, replacement."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.ingest.ledger import derive_run
from tests.conftest import need_real_data


def _count(con, table: str, path: Path) -> int:
    return con.execute(
        f"SELECT count(*) FROM {table} JOIN files USING (file_id) WHERE files.path = ?", [str(path.resolve())]
    ).fetchall()[0][0]


def _expected_rows(path: Path) -> dict[str, int]:
    """Rows each table should receive from one trace file, counted straight from its JSON."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    name = path.name
    if name.startswith("packed_lengths"):
        return {"samples": sum(len(r["output"]) for r in records)}
    if name.startswith("reward_timings"):
        return {"rank_timings": len(records)}
    if name.startswith("dapo_filter"):
        return {"filter_batches": len(records)}
    if name.startswith("multiturn_workload"):
        return {"samples": len(records), "turns": sum(len(r["turns"]) for r in records),
                "tool_calls": sum(len(r["tool_calls"]) for r in records)}
    raise AssertionError(f"unexpected file {name}")


@pytest.mark.realdata
def test_every_real_trace_file_stores_exactly_its_records(store):
    root = need_real_data("polytrace")
    reports = ingest_paths(store, [root])
    files = sorted(p for p in root.rglob("*.jsonl"))
    assert len([r for r in reports if r.status == "ingested"]) == len(files)
    for path in files:
        for table, expected in _expected_rows(path).items():
            assert _count(store, table, path) == expected, (path.name, table)
        lines = sum(1 for line in path.read_text().splitlines() if line.strip())
        stored, ignored, rejected = store.execute(
            "SELECT stored, ignored, rejected FROM files WHERE path = ?", [str(path.resolve())]
        ).fetchall()[0]
        assert (stored, ignored, rejected) == (lines, 0, 0)


@pytest.mark.realdata
def test_real_traces_form_one_run_per_source_with_metadata(store):
    root = need_real_data("polytrace")
    ingest_paths(store, [root])
    runs = dict(store.execute("SELECT name, meta FROM runs").fetchall())
    assert set(runs) == {"verl", "rllm", "search_r1"}
    assert json.loads(runs["verl"])["n_sampling"] == 8
    assert json.loads(runs["search_r1"])["max_response_len"] == 3000


@pytest.mark.realdata
def test_reingest_of_unchanged_files_adds_nothing(store):
    root = need_real_data("polytrace")
    ingest_paths(store, [root])
    before = store.execute("SELECT count(*) FROM samples").fetchall()[0][0]
    again = ingest_paths(store, [root])
    assert {r.status for r in again} == {"unchanged"}
    assert store.execute("SELECT count(*) FROM samples").fetchall()[0][0] == before


@pytest.mark.realdata
def test_changed_file_replaces_exactly_its_own_rows(store, tmp_path):
    source = need_real_data("polytrace", "rllm", "profile", "packed_length_log", "20260616_024512")
    run_dir = tmp_path / "rllm_copy"
    shutil.copytree(source, run_dir)
    ingest_paths(store, [run_dir])
    total = store.execute("SELECT count(*) FROM samples").fetchall()[0][0]
    target = run_dir / "packed_lengths_step_0.jsonl"
    lines = target.read_text().splitlines()
    target.write_text("\n".join(lines[:-1]) + "\n")  # drop one prompt (8 responses)
    reports = ingest_paths(store, [run_dir])
    assert [r.status for r in reports if r.path.endswith("packed_lengths_step_0.jsonl")] == ["replaced"]
    assert store.execute("SELECT count(*) FROM samples").fetchall()[0][0] == total - 8
    assert store.execute("SELECT count(*) FROM files").fetchall()[0][0] == 10


def test_run_names_skip_generic_and_timestamp_folders(tmp_path):
    trace = tmp_path / "verl" / "profile" / "packed_length_log" / "20260614_023133" / "packed_lengths_step_0.jsonl"
    trace.parent.mkdir(parents=True)
    trace.touch()
    name, root = derive_run(trace)
    assert name == "verl"
    assert root == trace.parent.resolve()
    wandb_table = tmp_path / "wandb" / "run-20250101_000000-abc" / "files" / "media" / "table" / "t.table.json"
    wandb_table.parent.mkdir(parents=True)
    assert derive_run(wandb_table)[0] == "run-20250101_000000-abc"


def test_two_timestamped_runs_under_one_folder_stay_apart(store, tmp_path):
    for stamp, lengths in (("20260101_000000", "[1, 2]"), ("20260102_000000", "[3, 4]")):
        folder = tmp_path / "exp" / stamp
        folder.mkdir(parents=True)
        (folder / "packed_lengths_step_0.jsonl").write_text(
            f'{{"step": 0, "rank": 0, "dp_rank": 0, "tp_rank": 0, "local_index": 0, "input": 5, "output": {lengths}, '
            '"n_sampling": 2, "validate": false}\n'
        )
    ingest_paths(store, [tmp_path / "exp"])
    names = sorted(r[0] for r in store.execute("SELECT name FROM runs").fetchall())
    assert names == ["exp", "exp-20260102_000000"]


def test_packed_line_becomes_one_sample_per_response(store, tmp_path):
    trace = tmp_path / "run" / "packed_lengths_step_3.jsonl"
    trace.parent.mkdir()
    trace.write_text(
        '{"step": 3, "rank": 4, "dp_rank": 1, "tp_rank": 0, "local_index": 7, "input": 120, "output": [10, 20, 30], '
        '"n_sampling": 3, "validate": true}\n'
    )
    ingest_paths(store, [trace])
    rows = store.execute(
        "SELECT step, rank, dp_rank, prompt_idx, sample_idx, prompt_len, response_len, validate FROM samples ORDER BY sample_idx"
    ).fetchall()
    assert rows == [(3, 4, 1, 7, 0, 120, 10, True), (3, 4, 1, 7, 1, 120, 20, True), (3, 4, 1, 7, 2, 120, 30, True)]


def test_per_rank_multiturn_file_takes_rank_from_name_and_ids_from_batch_fields(store, tmp_path):
    trace = tmp_path / "mt" / "multiturn_workload_step_2_rank_3.jsonl"
    trace.parent.mkdir()
    record = {
        "step": 2, "prompt_len": 50, "max_response_len": 100, "finish_reason": "length", "final_response_len": 100,
        "turn_count": 2, "tool_call_count": 1, "validate": False, "batch_data_id": 9, "rollout_offset": 1,
        "turns": [{"turn": 0, "prompt_tokens": 50, "cached_tokens": 0, "completion_tokens": 30, "finish_reason": "tool_calls",
                   "tool_call_count": 1, "engine_latency_s": 1.5},
                  {"turn": 1, "prompt_tokens": 120, "cached_tokens": 80, "completion_tokens": 30, "finish_reason": "length",
                   "tool_call_count": 0, "engine_latency_s": 2.5}],
        "tool_calls": [{"turn": 0, "tool_name": "search", "query_count": 2, "latency_s": 0.25, "response_token_len": 40,
                        "status": "success"}],
    }
    trace.write_text(json.dumps(record) + "\n")
    ingest_paths(store, [trace])
    assert store.execute("SELECT rank, prompt_idx, sample_idx, response_len, truncated, turns, tool_calls FROM samples").fetchall() == [
        (3, 9, 1, 100, True, 2, 1)]
    assert store.execute("SELECT turn, cached_tokens, engine_latency_s FROM turns ORDER BY turn").fetchall() == [
        (0, 0, 1.5), (1, 80, 2.5)]
    assert store.execute("SELECT tool_name, latency_s, query_count, response_tokens FROM tool_calls").fetchall() == [
        ("search", 0.25, 2, 40)]


def test_renamed_traces_are_recognised_by_their_content(store, tmp_path):
    folder = tmp_path / "renamed"
    folder.mkdir()
    (folder / "lengths.jsonl").write_text(
        '{"step": 0, "rank": 0, "dp_rank": 0, "tp_rank": 0, "local_index": 0, "input": 5, "output": [1, 2], '
        '"n_sampling": 2, "validate": false}\n'
    )
    (folder / "rewards.jsonl").write_text(
        '{"step": 0, "rank": 0, "tp_rank": 0, "dp_rank": 0, "batch_size": 2, "reward_time_s": 1.5, '
        '"response_sum": 3, "response_mean": 1.5, "response_max": 2, "validate": false}\n'
    )
    formats = {Path(r.path).name: r.format for r in ingest_paths(store, [folder])}
    assert formats == {"lengths.jsonl": "polytrace-packed", "rewards.jsonl": "polytrace-reward"}
