"""End-to-end runs of `polytrace fit`, `export`, `replay-check`, `fidelity` and `synth --from-run`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import copy_store
from polytrace_cli.cli import app
from polytrace_cli.ingest.sniffing import get_ingester

runner = CliRunner()


def _invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def packed_run_once(tmp_path_factory):
    """A run of 3 steps × 16 prompts × 4 responses on 2 DP ranks, lognormal lengths, ingested as 'lab'
    into a store built once for the module."""
    rng = np.random.default_rng(11)
    tmp_path = tmp_path_factory.mktemp("packed-run")
    db_path = tmp_path / "store.duckdb"
    folder = tmp_path / "lab"
    folder.mkdir()
    for step in range(3):
        lines = []
        for group in range(16):
            outputs = [int(x) for x in np.minimum(rng.lognormal(np.log(800), 0.6, 4), 2048)]
            lines.append(json.dumps({"step": step, "rank": group % 2, "dp_rank": group % 2, "tp_rank": 0,
                                     "local_index": group // 2, "input": int(rng.lognormal(np.log(150), 0.3)),
                                     "output": outputs, "n_sampling": 4, "validate": False}))
        (folder / f"packed_lengths_step_{step}.jsonl").write_text("\n".join(lines) + "\n")
    result = _invoke("ingest", folder, "--db", db_path, "--run", "lab")
    assert result.exit_code == 0, result.output
    return db_path


@pytest.fixture
def packed_run(packed_run_once, db_path):
    """A copy of the 'lab' store for one test."""
    return copy_store(packed_run_once, db_path)


def test_export_writes_both_formats_and_reingests(packed_run, tmp_path):
    out = tmp_path / "out"
    result = _invoke("export", "lab", "--out", out, "--format", "packed", "--format", "polytrace-json", "--db", packed_run)
    assert result.exit_code == 0, result.output
    assert "3 steps, 192 samples" in result.output
    assert sorted(p.name for p in out.iterdir()) == ["lab.json", *(f"packed_lengths_step_{s}.jsonl" for s in range(3))]
    again = _invoke("ingest", out, "--db", packed_run, "--run", "copy", "--json")
    assert again.exit_code == 0, again.output
    counts = _invoke("query", "SELECT name, count(*) AS n FROM samples JOIN runs USING (run_id) GROUP BY 1 ORDER BY 1",
                     "--db", packed_run, "--json")
    # The copy holds both exports: 192 samples from the packed files and 192 from the dataset JSON.
    assert json.loads(counts.output) == [{"name": "copy", "n": 384}, {"name": "lab", "n": 192}]


def test_export_errors_are_one_line(packed_run, tmp_path):
    result = _invoke("export", "nope", "--out", tmp_path / "o", "--db", packed_run)
    assert result.exit_code == 2
    assert "no run named nope" in result.output and "Traceback" not in result.output
    result = _invoke("export", "lab", "--out", tmp_path / "o", "--format", "parquet", "--db", packed_run)
    assert result.exit_code == 2 and "unknown export format parquet" in result.output


def _params(path, scale):
    path.write_text(json.dumps({
        "format": "polytrace-params/1", "task": "lab", "max_response_len": 2048,
        "prompt": {"family": "lognorm", "params": {"s": 0.3, "loc": 0.0, "scale": 150.0}},
        "response": {"family": "lognorm", "params": {"s": 0.6, "loc": 0.0, "scale": scale}},
    }))
    return path


def test_fidelity_with_params_file(packed_run, tmp_path):
    result = _invoke("fidelity", "lab", "--params", _params(tmp_path / "p.json", 800.0), "--db", packed_run, "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [(r["sampler"], r["draw"], r["kind"]) for r in rows] == [
        ("parametric", "workload", "prompt"), ("parametric", "workload", "response"),
        ("parametric", "model", "prompt"), ("parametric", "model", "response")]
    response = rows[3]
    assert response["n_run"] == 192 and response["n_synth"] == 1920
    assert response["clip_run"] == pytest.approx(np.mean(_lab_responses(packed_run) >= 2048))
    far = _invoke("fidelity", "lab", "--params", _params(tmp_path / "q.json", 3000.0), "--db", packed_run, "--json")
    far_response = json.loads(far.output)[3]
    # A median of 3000 lies above the 2048 cap: the synthetic p50 is the cap, about 2.5 × the run's ~800.
    assert far_response["p50_synth"] == 2048 and far_response["p50_error"] > 1.0 and far_response["pass"] is False
    table = _invoke("fidelity", "lab", "--params", tmp_path / "p.json", "--db", packed_run)
    assert table.exit_code == 0 and "too few lengths" in table.output


def _lab_responses(db_path):
    result = _invoke("query", "SELECT response_len FROM samples", "--db", db_path, "--json")
    return np.array([r["response_len"] for r in json.loads(result.output)])


def test_fidelity_rejects_bad_options(packed_run, tmp_path):
    result = _invoke("fidelity", "lab", "--sampler", "magic", "--db", packed_run)
    assert result.exit_code == 2 and "--sampler takes" in result.output
    result = _invoke("fidelity", "lab", "--params", tmp_path / "none.json", "--db", packed_run)
    assert result.exit_code == 2 and "no parameters file" in result.output


def _console_log(path, gen_factor, reward_factor, steps):
    lines = ["(TaskRunner pid=1) loading model"]
    for step in steps:
        lines.append(f"step:{step} - timing_s/gen:{100 * gen_factor:.3f} - timing_s/reward:{20 * reward_factor:.3f}"
                     f" - timing_s/old_log_prob:10.000 - timing_s/ref:8.000 - timing_s/adv:0.500"
                     f" - timing_s/update_actor:40.000 - timing_s/step:180.000")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def test_replay_check_reports_stage_accuracy(tmp_path):
    if get_ingester("verl-console") is None:
        pytest.skip("verl console ingester not available")
    formal = _console_log(tmp_path / "formal" / "out.log", 1.0, 1.0, range(1, 7))
    bench = _console_log(tmp_path / "bench" / "out.log", 1.10, 0.95, range(1, 6))
    result = _invoke("replay-check", "--benchmark", bench, "--formal", formal, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    accuracy = {s["stage"]: s["accuracy_pct"] for s in report["stages"]}
    assert accuracy["gen"] == pytest.approx(90.0) and accuracy["reward"] == pytest.approx(95.0)
    assert accuracy["step"] == pytest.approx(100.0)
    assert report["accuracy_pct"] == pytest.approx(685 / 7)
    assert report["only_formal"] == [6] and report["paired_steps"] == [1, 2, 3, 4, 5]
    table = _invoke("replay-check", "--benchmark", bench, "--formal", formal)
    assert "accuracy: 97.9%" in table.output and "only in formal: 6" in table.output


def test_replay_check_missing_log_is_one_line(tmp_path):
    result = _invoke("replay-check", "--benchmark", tmp_path / "nope.log", "--formal", tmp_path / "nope2.log")
    assert result.exit_code == 2
    assert "no such log file or folder" in result.output and "Traceback" not in result.output


def test_fit_writes_params_and_prints_candidates(packed_run, tmp_path):
    pytest.importorskip("polytrace_cli.analyze.fit")
    out = tmp_path / "lab.params.json"
    result = _invoke("fit", "lab", "--task", "code", "--output", out, "--db", packed_run)
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    assert document["format"] == "polytrace-params/1" and document["task"] == "code"
    assert document["response"]["family"] in result.output and "*" in result.output


def test_fit_without_scikit_learn_says_so_and_synth_falls_back_to_marginals(packed_run, tmp_path, monkeypatch):
    pytest.importorskip("polytrace_cli.analyze.fit")
    import sys

    monkeypatch.setitem(sys.modules, "sklearn.mixture", None)
    out = tmp_path / "lab.params.json"
    result = _invoke("fit", "lab", "--output", out, "--db", packed_run)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "note: scikit-learn is not installed (pip install 'polytrace[fit]')" in text
    document = json.loads(out.read_text())
    assert document["joint"] is None and document["notes"]
    assert all(c["family"] != "gaussian_mixture" for c in document["candidates"]["response"])
    synth = _invoke("synth", "--params", out, "--task", "t", "--out", tmp_path / "w", "--num-steps", 2)
    assert synth.exit_code == 0, synth.output
    assert len(list((tmp_path / "w").glob("packed_lengths_step_*.jsonl"))) == 2


def test_synth_from_run_takes_the_run_shape_and_overrides(packed_run, tmp_path):
    pytest.importorskip("polytrace_cli.analyze.fit")
    out = tmp_path / "synth"
    result = _invoke("synth", "--from-run", "lab", "--out", out, "--db", packed_run, "--seed", 3)
    assert result.exit_code == 0, result.output
    packed = sorted(out.glob("packed_lengths_step_*.jsonl"))
    assert len(packed) == 3  # the run's steps
    lines = [json.loads(x) for x in packed[0].read_text().splitlines()]
    # 16 prompts of 4 responses over 2 DP ranks, as in the run; no response above the run's longest.
    assert len(lines) == 16 and {x["dp_rank"] for x in lines} == {0, 1}
    assert all(len(x["output"]) == 4 for x in lines)
    smaller = _invoke("synth", "--from-run", "lab", "--out", tmp_path / "s2", "--num-steps", 2, "--n", 2, "--db", packed_run)
    assert smaller.exit_code == 0, smaller.output
    assert len(list((tmp_path / "s2").glob("packed_lengths_step_*.jsonl"))) == 2
    assert all(len(json.loads(x)["output"]) == 2
               for x in (tmp_path / "s2" / "packed_lengths_step_0.jsonl").read_text().splitlines())


def test_synth_option_conflicts_are_one_line(packed_run, tmp_path):
    result = _invoke("synth", "--from-run", "lab", "--params", tmp_path / "p.json", "--out", tmp_path / "o")
    assert result.exit_code == 2 and "either --params or --from-run" in result.output
    result = _invoke("synth", "--out", tmp_path / "o")
    assert result.exit_code == 2 and "--task is needed" in result.output
    result = _invoke("synth", "--from-run", "nope", "--out", tmp_path / "o", "--db", packed_run)
    assert result.exit_code == 2 and "no run named nope" in result.output


@pytest.mark.parametrize("text, message", [("[1, 2]", "its JSON is not an object"), ("{", "is not a JSON parameters file"),
                                           (None, "no parameters file at")])
def test_synth_with_a_bad_parameters_file_is_one_line(tmp_path, text, message):
    params = tmp_path / "params.json"
    if text is not None:
        params.write_text(text)
    result = runner.invoke(app, ["synth", "--params", str(params), "--task", "math", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert message in result.output and len(result.output.strip().splitlines()) == 1
