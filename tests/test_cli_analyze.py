"""`polytrace analyze` and `polytrace compare` end to end on a real DuckDB file."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from polytrace_cli.analyze.registry import all_analyses
from polytrace_cli.cli import app
from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.store import open_store
from tests.conftest import need_real_data
from tests.test_analyze_lengths import add_run, add_samples


@pytest.fixture
def two_runs(db_path, fresh_store):
    con = open_store(fresh_store(db_path))
    a = add_run(con, "a", meta={"max_response_len": 10})
    add_samples(con, a, step=0, prompts=[1, 2, 3, 4], responses=[2, 4, 6, 10], dp_rank=0)
    add_samples(con, a, step=1, prompts=[1, 2, 3, 4], responses=[4, 6, 8, 10], dp_rank=0)
    b = add_run(con, "b", meta={"max_response_len": 10})
    add_samples(con, b, step=0, prompts=[1, 2, 3, 4], responses=[1, 2, 3, 10], dp_rank=0)
    add_samples(con, b, step=1, prompts=[1, 2, 3, 4], responses=[2, 2, 2, 2], dp_rank=0)
    con.close()
    return db_path


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_json_has_every_analysis_with_stable_columns(two_runs):
    result = invoke("analyze", "--db", two_runs, "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert list(document) == list(all_analyses())
    response = next(r for r in document["lengths"] if r["run"] == "a" and r["kind"] == "response")
    assert response["mean_tokens"] == pytest.approx(50 / 8)
    assert response["clip_ratio"] == pytest.approx(2 / 8)
    assert {r["run"] for r in document["longtail"]} == {"a", "b"}


def test_only_and_steps(two_runs):
    result = invoke("analyze", "a", "--db", two_runs, "--only", "lengths,drift", "--steps", "1:1", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert list(document) == ["lengths", "drift"]
    response = next(r for r in document["lengths"] if r["kind"] == "response")
    assert response["mean_tokens"] == pytest.approx(7.0) and response["steps"] == 1
    assert {r["run"] for r in document["lengths"]} == {"a"}


def test_csv_has_an_analysis_column(two_runs):
    result = invoke("analyze", "--db", two_runs, "--csv", "--only", "lengths,longtail")
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert {r["analysis"] for r in rows} == {"lengths", "longtail"}
    idle = next(r for r in rows if r["analysis"] == "longtail" and r["run"] == "b")
    # b: step 0 idle 1 − 16/40 = 0.6, step 1 idle 0 → mean 0.3
    assert float(idle["mean_slot_idle"]) == pytest.approx(0.3)
    assert idle["kind"] == ""


def test_tables_for_people_and_empty_analyses_explained(two_runs):
    result = invoke("analyze", "--db", two_runs, "--only", "lengths,tools")
    assert result.exit_code == 0, result.output
    assert "lengths:" in result.stdout and "tools: no rows" in result.stdout


def test_rows_without_numbers_are_named_with_their_basis_not_shown_as_dashes(two_runs):
    narrow = invoke("analyze", "--db", two_runs, "--only", "stages,lengths")
    assert narrow.exit_code == 0, narrow.output
    stages_part = narrow.stdout[narrow.stdout.index("stages:"):narrow.stdout.index("lengths:")]
    assert "no values for: a (no_step_metrics), b (no_step_metrics)" in stages_part
    assert "┃" not in stages_part  # no table of dashes
    lengths_part = narrow.stdout[narrow.stdout.index("lengths:"):]
    assert "┃" in lengths_part and "no values for" not in lengths_part
    wide = invoke("analyze", "--db", two_runs, "--only", "stages", "--wide")
    assert "no_step_metrics" in wide.stdout and "no values for" not in wide.stdout
    as_json = json.loads(invoke("analyze", "--db", two_runs, "--only", "stages", "--json").stdout)
    assert {row["run"] for row in as_json["stages"]} == {"a", "b"}


@pytest.mark.parametrize("args, message", [
    (["analyze", "nosuch"], "no run named nosuch"),
    (["analyze", "--only", "lengths,bogus"], "unknown analysis bogus"),
    (["analyze", "--steps", "x:y"], "--steps"),
    (["compare", "a", "nosuch"], "no run named nosuch"),
    (["compare", "a", "a"], "two different runs"),
])
def test_user_errors_are_one_line(two_runs, args, message):
    result = invoke(*args, "--db", two_runs)
    assert result.exit_code != 0
    assert message in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def _modules_after(args: list[str]) -> set[str]:
    """The heavy libraries a fresh `polytrace ARGS` process has loaded when it exits."""
    probe = ("import runpy, sys\n"
             f"sys.argv = ['polytrace', *{args!r}]\n"
             "try:\n    runpy.run_module('polytrace_cli.cli', run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             "print('loaded:', *(m for m in ('polars', 'pyarrow', 'numpy', 'scipy') if m in sys.modules),"
             " file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(done.stderr.strip().splitlines()[-1].split()[1:])


def test_lengths_and_an_unknown_run_load_only_what_they_need(two_runs):
    # The lengths summary comes back as a few Python rows (no Arrow) and needs no scipy; an unknown
    # run fails before polars loads.
    assert _modules_after(["analyze", "--only", "lengths", "--db", str(two_runs)]) == {"polars"}
    assert _modules_after(["analyze", "nosuch", "--db", str(two_runs)]) == set()


def test_compare_deltas(two_runs):
    result = invoke("compare", "a", "b", "--db", two_runs, "--only", "lengths,longtail", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    mean = next(r for r in rows if r["analysis"] == "lengths" and r["metric"] == "mean_tokens"
                and r["key"] == "kind=response")
    assert (mean["a"], mean["b"]) == (pytest.approx(6.25), pytest.approx(3.0))
    assert mean["delta"] == pytest.approx(-3.25) and mean["relative_delta"] == pytest.approx(-3.25 / 6.25)
    idle = next(r for r in rows if r["analysis"] == "longtail" and r["metric"] == "mean_slot_idle")
    # a: step 0 1 − 22/40, step 1 1 − 28/40 → 0.375; b: 0.3
    assert idle["key"] is None and idle["delta"] == pytest.approx(0.3 - 0.375)
    table = invoke("compare", "a", "b", "--db", two_runs, "--only", "drift")
    # Two steps per run: drift withholds the trend (fewer than drift.MIN_TREND_STEPS), so only its means compare.
    assert table.exit_code == 0 and "mean_tokens" in table.stdout and "slope_tokens_per_step" not in table.stdout


def test_analyze_real_traces(db_path):
    con = open_store(db_path)
    ingest_paths(con, [need_real_data("polytrace")])
    con.close()
    result = invoke("analyze", "--db", db_path, "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    rllm = next(r for r in document["lengths"] if r["run"] == "rllm" and r["kind"] == "response")
    assert rllm["cap_tokens"] == 16000 and rllm["clip_ratio"] > 0
    assert {r["run"] for r in document["fit"]} == {"rllm", "verl", "search_r1"}


def test_real_traces_and_a_console_log_steps_csv_and_compare(db_path):
    fixture = Path(__file__).parent / "fixtures" / "verl" / "console_v03"
    con = open_store(db_path)
    ingest_paths(con, [need_real_data("polytrace")])
    ingest_paths(con, [fixture], run_name="console")
    con.close()
    document = json.loads(invoke("analyze", "--db", db_path, "--only", "lengths,longtail,imbalance,tools,filtering",
                                 "--json").stdout)
    # The console log has step aggregates only: what they allow, pooled numbers marked as estimates.
    console = next(r for r in document["lengths"] if r["run"] == "console")
    assert (console["basis"], console["estimate"], console["p99_tokens"]) == ("step_aggregates", True, None)
    assert next(r for r in document["longtail"] if r["run"] == "console")["estimate"] is True
    assert not [r for r in document["imbalance"] if r["run"] == "console"]  # no per-rank loads, no global_seqlen
    # The three named facts of the real traces.
    rllm = next(r for r in document["lengths"] if r["run"] == "rllm" and r["kind"] == "response")
    assert rllm["cap_tokens"] == 16000 and rllm["clip_ratio"] > 0
    search = next(r for r in document["tools"] if r["run"] == "search_r1" and r["tool"] == "all")
    assert search["cache_hit_ratio"] > 0 and search["p99_s"] > 0
    assert next(r for r in document["filtering"] if r["run"] == "verl")["batches"] == 6

    rows = list(csv.DictReader(io.StringIO(invoke("analyze", "rllm", "verl", "--db", db_path, "--only", "imbalance",
                                                  "--steps", "1:3", "--csv").stdout)))
    assert {r["run"] for r in rows} == {"rllm", "verl"} and {r["steps"] for r in rows} == {"3"}

    compared = json.loads(invoke("compare", "rllm", "verl", "--db", db_path, "--only", "imbalance", "--json").stdout)
    by_metric = {r["metric"]: r for r in compared}
    imbalance = {r["run"]: r for r in document["imbalance"]}
    lam = by_metric["mean_lambda"]
    assert (lam["rllm"], lam["verl"]) == (pytest.approx(imbalance["rllm"]["mean_lambda"]),
                                          pytest.approx(imbalance["verl"]["mean_lambda"]))
    assert lam["delta"] == pytest.approx(lam["verl"] - lam["rllm"])
    assert lam["relative_delta"] == pytest.approx(lam["delta"] / lam["rllm"])


@pytest.fixture
def with_validation(db_path, fresh_store):
    """Run 'tv': training responses [100, 200] at step 1, validation responses [10, 20, 30] at step 2;
    run 'plain': training responses [5, 7] alone."""
    con = open_store(fresh_store(db_path))
    tv = add_run(con, "tv")
    add_samples(con, tv, step=1, prompts=[50, 50], responses=[100, 200], dp_rank=0)
    add_samples(con, tv, step=2, prompts=[40, 40, 40], responses=[10, 20, 30], dp_rank=0, validate=True)
    plain = add_run(con, "plain")
    add_samples(con, plain, step=1, prompts=[3, 3], responses=[5, 7], dp_rank=0)
    con.close()
    return db_path


def test_the_validation_split_answers_on_the_validation_samples(with_validation):
    from polytrace_cli.facade import Store
    from tests.test_json_schemas import assert_valid

    result = invoke("analyze", "tv", "--db", with_validation, "--only", "lengths", "--split", "validation", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert_valid(document, "analyze")
    response = next(r for r in document["lengths"] if r["kind"] == "response")
    # validation responses 10, 20, 30: mean 20, sample std 10, p50 20, max 30, one step
    assert (response["count"], response["mean_tokens"], response["std_tokens"]) == (3, 20.0, pytest.approx(10.0))
    assert (response["p50_tokens"], response["max_tokens"], response["steps"]) == (20.0, 30.0, 1)
    assert {row["split"] for row in document["lengths"]} == {"validation"}
    as_csv = invoke("analyze", "tv", "--db", with_validation, "--only", "lengths", "--split", "validation", "--csv")
    assert as_csv.exit_code == 0 and "split" in as_csv.stdout.splitlines()[0] and "validation" in as_csv.stdout
    # the default split is training: responses 100, 200 as before
    training = json.loads(invoke("analyze", "tv", "--db", with_validation, "--only", "lengths", "--json").stdout)
    response = next(r for r in training["lengths"] if r["kind"] == "response")
    assert (response["count"], response["mean_tokens"], response["max_tokens"]) == (2, 150.0, 200.0)
    with Store.open(with_validation, read_only=True) as store:
        frame = store.analyze("lengths", runs="tv", split="validation")
    assert frame.filter(frame["kind"] == "response")["mean_tokens"].to_list() == [20.0]


def test_the_validation_split_says_what_it_leaves_out(with_validation):
    # two runs, one without validation samples; lengths and stages asked: stages reads step metrics
    result = invoke("analyze", "--db", with_validation, "--only", "lengths,stages", "--split", "validation")
    assert result.exit_code == 0, result.output
    assert "run plain has no validation samples (samples with validate true): left out" in result.stdout
    assert "stages: does not apply to the validation split" in result.stdout
    assert "tails (on the validation samples)" in result.stdout  # the table says which samples it holds
    document = json.loads(invoke("analyze", "--db", with_validation, "--only", "lengths,stages",
                                 "--split", "validation", "--json").stdout)
    assert list(document) == ["lengths"] and {r["run"] for r in document["lengths"]} == {"tv"}
    # nothing at all to analyze: one line and a non-zero exit
    alone = invoke("analyze", "plain", "--db", with_validation, "--only", "lengths", "--split", "validation")
    assert alone.exit_code != 0
    assert alone.output.strip().splitlines() == [
        "error: no validation samples (samples with validate true) in run plain"]
    stages = invoke("analyze", "tv", "--db", with_validation, "--only", "stages", "--split", "validation")
    assert stages.exit_code != 0 and "stages reads step metrics" in stages.output
    assert "it does not apply to the validation split" in stages.output
    assert invoke("analyze", "--db", with_validation, "--split", "test").exit_code != 0
