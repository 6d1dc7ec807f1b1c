"""Export to PolyTrace traces: exact documents on tiny runs, and round trips through ingest."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from polytrace_cli.workload.export import export_run
from polytrace_cli.errors import PolytraceError
from polytrace_cli.ingest.driver import ingest_paths
from tests.conftest import need_real_data

SAMPLE_KEY = "step, dp_rank, prompt_idx, sample_idx, prompt_len, response_len"


def _packed_line(step, dp, local, prompt, outputs, validate=False):
    return json.dumps({"step": step, "rank": dp * 2, "dp_rank": dp, "tp_rank": 0, "local_index": local,
                       "input": prompt, "output": outputs, "n_sampling": len(outputs), "validate": validate})


def _write_packed_run(folder, lines_by_step):
    folder.mkdir(parents=True)
    for step, lines in lines_by_step.items():
        (folder / f"packed_lengths_step_{step}.jsonl").write_text("\n".join(lines) + "\n")


def _multiset(con, run, columns=SAMPLE_KEY, table="samples"):
    rows = con.execute(f"SELECT {columns} FROM {table} JOIN runs USING (run_id) WHERE name = ?", [run]).fetchall()
    return Counter(rows)


@pytest.fixture
def tiny_run(store, tmp_path):
    """Two steps, two DP ranks, groups of 2 responses; step 1 has uneven groups (3 and 1)."""
    _write_packed_run(tmp_path / "tiny", {
        0: [_packed_line(0, 0, 0, 10, [100, 101]), _packed_line(0, 0, 1, 11, [110, 111]),
            _packed_line(0, 1, 0, 20, [200, 201])],
        1: [_packed_line(1, 0, 0, 30, [300, 301, 302]), _packed_line(1, 1, 0, 40, [400])],
    })
    ingest_paths(store, [tmp_path / "tiny"], run_name="tiny")
    return store


def test_dataset_json_document_for_even_and_uneven_groups(tiny_run, tmp_path):
    result = export_run(tiny_run, "tiny", tmp_path / "out", ["polytrace-json"])
    document = json.loads((tmp_path / "out" / "tiny.json").read_text())
    # Step 0: every group has 2 responses, so one prompt length per group (output[j] <-> input[j // 2]).
    assert document["0"] == {"input": [10, 11, 20], "output": [100, 101, 110, 111, 200, 201]}
    # Step 1: groups of 3 and 1 do not pair by a common k, so one prompt length per response.
    assert document["1"] == {"input": [30, 30, 30, 40], "output": [300, 301, 302, 400]}
    assert list(document) == ["0", "1"]
    assert (result.steps, result.samples, result.multiturn) == (2, 10, False)


def test_dataset_json_round_trip_keeps_lengths(tiny_run, tmp_path):
    export_run(tiny_run, "tiny", tmp_path / "out", ["polytrace-json"])
    reports = ingest_paths(tiny_run, [tmp_path / "out"], run_name="again")
    assert [r.format for r in reports] == ["polytrace-dataset"] and reports[0].rejected == 0
    columns = "step, prompt_len, response_len"
    assert _multiset(tiny_run, "again", columns) == _multiset(tiny_run, "tiny", columns)


def test_packed_lines_and_exact_round_trip(tiny_run, tmp_path):
    result = export_run(tiny_run, "tiny", tmp_path / "out", ["packed"])
    assert [p.name for p in result.files] == ["packed_lengths_step_0.jsonl", "packed_lengths_step_1.jsonl"]
    lines = [json.loads(x) for x in (tmp_path / "out" / "packed_lengths_step_1.jsonl").read_text().splitlines()]
    assert lines == [
        {"step": 1, "rank": 0, "dp_rank": 0, "tp_rank": 0, "local_index": 0, "input": 30, "output": [300, 301, 302],
         "n_sampling": 3, "validate": False},
        {"step": 1, "rank": 2, "dp_rank": 1, "tp_rank": 0, "local_index": 0, "input": 40, "output": [400],
         "n_sampling": 1, "validate": False},
    ]
    ingest_paths(tiny_run, [tmp_path / "out"], run_name="again")
    assert _multiset(tiny_run, "again") == _multiset(tiny_run, "tiny")
    assert sum(_multiset(tiny_run, "again").values()) == 10


def test_multiturn_run_exports_per_turn_lists(store, tmp_path):
    folder = tmp_path / "mt"
    folder.mkdir()

    def trajectory(group, sample, completions):
        turns = [{"turn": t, "prompt_tokens": 50 + 100 * t + group, "completion_tokens": c}
                 for t, c in enumerate(completions)]
        return json.dumps({"step": 3, "prompt_len": 50 + group, "max_response_len": 500, "turns": turns,
                           "tool_calls": [], "finish_reason": "stop", "final_response_len": sum(completions),
                           "prompt_group_id": group, "sample_id": sample})

    # Trajectories with 1, 3 and 2 turns: the export puts the 3-turn one first, then the 2-turn one.
    (folder / "multiturn_workload_step_3.jsonl").write_text(
        "\n".join([trajectory(0, 0, [7]), trajectory(0, 1, [8, 9, 10]), trajectory(1, 0, [11, 12])]) + "\n")
    ingest_paths(store, [folder], run_name="mt")
    result = export_run(store, "mt", tmp_path / "out", ["polytrace-json"])
    document = json.loads((tmp_path / "out" / "mt.json").read_text())
    assert document == {"3": [
        {"input": [50, 51, 50], "output": [8, 11, 7]},
        {"input": [150, 151], "output": [9, 12]},
        {"input": [250], "output": [10]},
    ]}
    assert result.multiturn and result.samples == 3
    ingest_paths(store, [tmp_path / "out"], run_name="again")
    columns = "step, turn, prompt_tokens, completion_tokens"
    assert _multiset(store, "again", columns, "turns") == _multiset(store, "mt", columns, "turns")


def test_unknown_run_and_format_are_user_errors(tiny_run, tmp_path):
    with pytest.raises(PolytraceError, match="no run named nope"):
        export_run(tiny_run, "nope", tmp_path / "out", ["packed"])
    with pytest.raises(PolytraceError, match="unknown export format csv"):
        export_run(tiny_run, "tiny", tmp_path / "out", ["csv"])


@pytest.mark.parametrize("task", ["verl", "rllm"])
def test_real_packed_traces_round_trip_exactly(store, tmp_path, task):
    source = need_real_data("polytrace", task)
    ingest_paths(store, [source], run_name=task)
    export_run(store, task, tmp_path / "out", ["packed", "polytrace-json"])
    ingest_paths(store, [tmp_path / "out" / f"{task}.json"], run_name="from-json")
    ingest_paths(store, sorted((tmp_path / "out").glob("packed_lengths_step_*.jsonl")), run_name="from-packed")
    original = _multiset(store, task)
    # Direct count on the source files: every response of every line is one sample.
    expected = sum(len(json.loads(line)["output"]) for path in source.rglob("packed_lengths_step_*.jsonl")
                   for line in path.read_text().splitlines() if line.strip())
    assert sum(original.values()) == expected
    assert _multiset(store, "from-packed") == original
    lengths = "step, prompt_len, response_len"
    assert _multiset(store, "from-json", lengths) == _multiset(store, task, lengths)


def test_real_multiturn_trace_round_trips_its_turns(store, tmp_path):
    source = need_real_data("polytrace", "search_r1")
    ingest_paths(store, [source], run_name="search")
    export_run(store, "search", tmp_path / "out", ["polytrace-json"])
    ingest_paths(store, [tmp_path / "out"], run_name="again")
    columns = "step, turn, prompt_tokens, completion_tokens"
    assert _multiset(store, "again", columns, "turns") == _multiset(store, "search", columns, "turns")
