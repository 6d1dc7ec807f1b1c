"""Each run's semantics, settled once at ingest, and every view reading them: one fixture per case
(tests/fixtures/semantics, verl-style logs and PolyTrace traces written for these cases), checked
through the command line as a user sees it, then the consistency of one quantity across commands."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from polytrace_cli.semantics.record import length_collapse
from polytrace_cli.cli import app
from polytrace_cli.facade import Store
from tests.conftest import need_real_data

runner = CliRunner()
FIXTURES = Path(__file__).parent / "fixtures"
CASES = FIXTURES / "semantics"


def _ok(*args) -> str:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.stdout


def _json(*args):
    return json.loads(_ok(*args, "--json"))


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    """One store holding every case, each ingested as its own run."""
    path = tmp_path_factory.mktemp("semantics") / "store.duckdb"
    for run, source in (("balanced", CASES / "balance_on"), ("v08", FIXTURES / "verl" / "console_v08"),
                        ("v01", CASES / "v01_derived"), ("cut", CASES / "truncated"),
                        ("responses", CASES / "responses"), ("noranks", CASES / "no_ranks"),
                        ("collapse", CASES / "collapse_crash"), ("partial", CASES / "partial"),
                        ("multiturn", CASES / "multiturn"), ("valtable", CASES / "validation_table" / "files")):
        _ok("ingest", source, "--run", run, "--db", path)
    # verl 0.8 (timing_s/step without testing and checkpoint) with the batch balanced, from the generator
    logs = path.parent / "gen08"
    _ok("synth", "--task", "math", "--format", "verl-console", "--verl-version", "0.8", "--validate-every", 10,
        "--checkpoint-every", 15, "--balance-batch", "--num-steps", 40, "--batch", 32, "--n", 4, "--dp-ranks", 4,
        "--seed", 3, "--truth", logs / "truth.csv", "--out", logs)
    _ok("ingest", logs / "train.log", "--run", "gen08", "--db", path)
    return path


@pytest.fixture(scope="module")
def summary(db) -> dict:
    """summary.json of one report over the runs the tests read it for."""
    out = db.parent / "reports"
    _ok("report", "gen08", "v01", "collapse", "--out", out, "--name", "all", "--db", db)
    return json.loads((out / "all" / "summary.json").read_text())


def _record(db: Path, run: str) -> dict:
    runs = {row["run"]: row for row in _json("runs", "--db", db)}
    return runs[run]["semantics"]


def _check(db: Path, run: str, *limits) -> dict:
    result = runner.invoke(app, ["check", run, *map(str, limits), "--json", "--db", str(db)])
    return json.loads(result.stdout)["checks"][0]


# Case 1: DP imbalance. verl balanced the batch: the busiest rank after balancing sets the time.

def test_balancing_is_read_from_the_overrides_and_gates_the_lambda_that_sets_time(db):
    record = _record(db, "balanced")
    assert record["balance_batch"] == "on" and "trainer.balance_batch" in record["balance_batch_source"]
    assert record["lambda_basis"] == "rank_tokens_balanced_max"
    step = _json("steps", "balanced", "--steps", "1", "--db", db)[0]
    # step 1: mean 21,000 tokens (20,000 + 500 · (7 % 5)), max 1.10×, balanced_max int(21,000 × 1.0015)
    assert step["lambda_tokens"] == pytest.approx(int(21000 * 1.0015) / 21000)
    assert step["lambda_tokens_before_balancing"] == pytest.approx(int(21000 * 1.10) / 21000)
    gate = _check(db, "balanced", "--max-imbalance", "1.05")
    assert gate["status"] == "pass" and gate["measured"] < 1.003


def test_balancing_off_gates_the_lambda_before_balancing(tmp_path):
    text = (CASES / "balance_on" / "train.log").read_text().replace("balance_batch=True", "balance_batch=False")
    (tmp_path / "train.log").write_text(text)
    db = tmp_path / "s.duckdb"
    _ok("ingest", tmp_path / "train.log", "--run", "off", "--db", db)
    assert _record(db, "off")["lambda_basis"] == "rank_tokens_max"
    gate = _check(db, "off", "--max-imbalance", "1.05")
    assert gate["status"] == "FAIL" and gate["measured"] == pytest.approx(1.10, abs=1e-4)


# Case 2: step time by version.

def test_overheads_left_out_of_the_logged_step_time_are_added_back_everywhere(db):
    record = _record(db, "v08")
    assert record["step_time_basis"] == "logged without overheads" and record["includes_testing"] is False
    steps = {row["step"]: row for row in _json("steps", "v08", "--db", db)}
    # step 5 logs timing_s/step 179 and timing_s/testing 290 outside it
    assert steps[5]["logged_step_s"] == 179 and steps[5]["step_s"] == 469
    stage = next(r for r in _json("analyze", "v08", "--only", "stages", "--db", db)["stages"] if r["stage"] == "step")
    assert stage["max_s"] == 474 and stage["mean_s"] == pytest.approx(2435 / 10)
    assert _check(db, "v08", "--max-step-cv", "1")["measured"] == pytest.approx(stage["cv"])
    assert _json("whatif", "v08", "--policy", "no-validation", "--db", db)["actual_s"] == 2435


def test_generated_overheads_and_balancing_match_the_generators_truth(db):
    truth = pl.read_csv(db.parent / "gen08" / "truth.csv")
    steps = pl.DataFrame(_json("steps", "gen08", "--db", db)).filter(pl.col("step") > 0)
    wall = truth["step_s"] + truth["testing_s"].fill_null(0) + truth["save_checkpoint_s"].fill_null(0)
    assert steps["step_s"].to_list() == pytest.approx(wall.to_list(), rel=1e-6)
    balanced = truth["balanced_max_rank_tokens"] / truth["mean_rank_tokens"]
    assert steps["lambda_tokens"].to_list() == pytest.approx(balanced.to_list(), rel=1e-3)


def test_a_log_without_a_step_total_has_its_step_time_derived_from_the_stage_timers(db):
    record = _record(db, "v01")
    assert record["step_time_basis"] == "derived from stage timers"
    step = _json("steps", "v01", "--steps", "1", "--db", db)[0]
    # timing/gen 32 + ref 2 + values 3 + adv 0.5 + update_critic 6 + update_actor 9
    assert step["step_time_basis"] == "derived from stage timers" and step["step_s"] == pytest.approx(52.5)
    assert step["logged_step_s"] is None
    assert _check(db, "v01", "--max-step-cv", "1")["status"] == "pass"
    notes = _json("explain", "v01", "--db", db)["notes"]
    assert any("derived from stage timers" in note for note in notes)
    backtest = _json("whatif", "v01", "--backtest", "--db", db)
    assert backtest["step"]["steps"] > 0 and backtest["overall"]["accuracy"] is not None


# Case 3: lines cut at 4,096 characters.

def test_cut_lines_are_said_and_no_validation_is_not_claimed_absent(db):
    assert _record(db, "cut")["truncated_steps"] == [4, 8, 12]
    assert any("cut short" in note for note in _json("explain", "cut", "--db", db)["notes"])
    whatif = _json("whatif", "cut", "--policy", "no-validation", "--db", db)
    scenario = whatif["scenarios"][0]
    assert scenario["predicted_s"] is None and "cut short" in scenario["note"]
    assert "the run logs no validation" not in scenario["note"]
    assert any("cut short" in note for note in whatif["notes"])


# Case 4: validation samples are their own split.

def test_validation_samples_do_not_replace_the_training_lengths(db):
    record = _record(db, "valtable")
    assert record["validation_samples"] == 2 and record["training_samples"] == 0
    lengths = _json("analyze", "valtable", "--only", "lengths", "--db", db)["lengths"]
    response = next(r for r in lengths if r["kind"] == "response")
    assert response["basis"] == "step_aggregates" and response["steps"] == 6
    assert _check(db, "valtable", "--max-clip-ratio", "0.5")["measured"] == pytest.approx(0.035)


# Case 5: responses per step from the printed config.

def test_responses_per_step_follow_from_the_config_and_length_policies_run(db):
    record = _record(db, "responses")
    assert record["responses_per_step"] == 32 * 8 and record["responses_per_step_source"] == "train_batch_size × rollout.n"
    scenario = _json("whatif", "responses", "--policy", "max-response-len=2048", "--db", db)["scenarios"][0]
    assert scenario["predicted_s"] is not None and scenario["saving_s"] > 0


# Case 6: numbers without data.

def test_no_per_rank_data_shows_no_busiest_over_mean(db):
    step = _json("explain", "noranks", "--step", "3", "--db", db)
    assert step["steps"][0]["busiest_rank_tokens"] is None
    assert any("no per-rank data" in note for note in step["notes"])
    assert "1.00" not in _ok("explain", "noranks", "--step", "3", "--db", db)


def test_a_length_collapse_and_a_crash_are_findings(db, summary):
    record = _record(db, "collapse")
    assert record["collapse_step"] == 13 and record["collapse_length"] == 1.0
    assert record["crash"].startswith("torch.OutOfMemoryError: CUDA out of memory")
    causes = [finding["cause"] for finding in summary["findings"] if finding["run"] == "collapse"]
    assert causes[:2] == ["length-collapse", "crash"]
    assert summary["semantics"]["collapse"]["collapse_step"] == 13


def test_a_step_short_of_responses_is_flagged_partial(db):
    assert _record(db, "partial")["partial_steps"] == [3]
    assert [row["partial"] for row in _json("steps", "partial", "--db", db)] == [False, False, False, True]


def test_length_collapse_rule():
    steps = list(range(1, 21))
    assert length_collapse(steps, [900.0] * 12 + [1.0] * 8) == (13, 1.0, 900.0)
    assert length_collapse(steps, [900.0] * 12 + [60.0] * 8) is None  # 60 is 6.7% of 900, above 5%
    assert length_collapse(steps, [900.0] * 18 + [1.0] * 2) is None  # two steps are not a collapse
    # the typical length is the median of the steps before: 45 ≤ 5% of 900 even after a slow decline
    assert length_collapse(steps, [900.0] * 10 + [500.0, 300.0] + [45.0] * 8) == (13, 45.0, 900.0)


def _collapse_by_definition(steps: list[int], means: list[float]) -> tuple[int, float, float] | None:
    """The rule read literally: the first k (3 in, 3 before the end) whose later means all stay at or
    below 5% of the median of the means before k."""
    for k in range(3, len(means) - 2):
        typical = statistics.median(means[:k])
        if typical > 0 and max(means[k:]) <= 0.05 * typical:
            return steps[k], sum(means[k:]) / (len(means) - k), typical
    return None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.floats(0, 1000), st.sampled_from([0.0, 1.0, 20.0, 900.0]),
                          st.floats(0, 2)), min_size=0, max_size=40))
def test_length_collapse_is_the_rule_read_literally(means):
    # sampled values repeat (ties at the median), small ones make late steps that collapse
    steps = list(range(1, len(means) + 1))
    assert length_collapse(steps, means) == _collapse_by_definition(steps, means)


def test_findings_on_a_run_that_collapsed_for_most_of_its_steps_give_no_ratio_to_its_median(tmp_path):
    # the collapse fixture's 12 steps before the collapse, then its last collapsed step repeated to step 40:
    # the median workload is the collapsed one (1 token), so "typical longest" would read 1
    lines = (CASES / "collapse_crash" / "train.log").read_text().splitlines()
    steps = [line for line in lines if " step:" in line]
    before = [line for line in steps if int(line.split(" step:")[1].split(" ")[0]) < 13]
    collapsed = [steps[-1].replace(" step:20 ", f" step:{step} ") for step in range(13, 41)]
    log = tmp_path / "logs" / "train.log"
    log.parent.mkdir()
    log.write_text("\n".join([lines[0], *before, *collapsed]) + "\n")
    db = tmp_path / "store.duckdb"
    _ok("ingest", log.parent, "--run", "long-collapse", "--db", db)
    findings = {f["cause"]: f["text"] for f in _json("explain", "long-collapse", "--db", db)["findings"]}
    assert "long_tail" in findings
    assert "the run's responses collapsed from step 13" in findings["long_tail"]
    assert not any("typical" in text or "×" in text for text in findings.values())


def test_the_token_volume_sentence_names_the_collapse_instead_of_a_ratio():
    from polytrace_cli.diagnose.findings import _sentence

    at = pl.DataFrame({"response_tokens": [3000.0, 1500.0], "segment": [0, 0]})
    rows = pl.DataFrame({"stage": ["gen"], "seconds": [30.0]})
    typical = {"response_tokens": 2.0}
    plain = _sentence("token_volume", 30.0, [3, 4], at, rows, typical, "busiest_rank_tokens")
    assert "up to 1500.0× the typical response tokens" in plain
    collapsed = _sentence("token_volume", 30.0, [3, 4], at, rows, typical, "busiest_rank_tokens", collapse_step=13)
    assert collapsed == ("batches with more tokens than usual (up to 3,000 response tokens, the run's responses "
                         "collapsed from step 13) slowed 2 steps by 30 s")


# Case 7: per-step tool latency and prefix-cache hits.

def test_multi_turn_steps_carry_tool_latency_and_cache_hits(db):
    rows = {row["step"]: row for row in _json("steps", "multiturn", "--db", db)}
    # step 0: latencies 0.1, 0.2, 0.3, 0.4 s; turns of 200 (0 cached) and 400 (100 cached) prompt tokens
    assert rows[0]["tool_latency_mean_s"] == pytest.approx(0.25)
    assert rows[0]["tool_latency_p99_s"] == pytest.approx(0.1 + 0.99 * 0.3)
    assert rows[0]["prefix_cache_hit_ratio"] == pytest.approx(100 / 600)
    assert rows[1]["tool_latency_mean_s"] == pytest.approx(2.5) and rows[1]["prefix_cache_hit_ratio"] == 0.5


# One meaning per number: the same quantity from every command.

@pytest.mark.parametrize("run", ["gen08", "v01"])
def test_the_same_quantity_reads_the_same_in_every_view(db, summary, run):
    steps = _json("steps", run, "--db", db)
    timed = [row for row in steps if row["step_s"] is not None]
    stage = next(r for r in _json("analyze", run, "--only", "stages", "--db", db)["stages"] if r["stage"] == "step")
    training = [row["step_s"] for row in timed]
    assert stage["max_s"] == pytest.approx(max(training)) and stage["mean_s"] == pytest.approx(np.mean(training))
    assert _check(db, run, "--max-step-cv", "5")["measured"] == pytest.approx(stage["cv"])
    whatif = _json("whatif", run, "--policy", "no-validation", "--db", db)
    assert whatif["actual_s"] == pytest.approx(sum(training))
    explained = _json("explain", run, "--step", timed[-1]["step"], "--db", db)["steps"][0]
    assert explained["seconds"] == pytest.approx(timed[-1]["step_s"])
    document = summary
    reported = next(r for r in document["analyses"]["stages"] if r["run"] == run and r["stage"] == "step")
    assert reported["cv"] == pytest.approx(stage["cv"]) and reported["max_s"] == pytest.approx(stage["max_s"])
    lambdas = [row["lambda_tokens"] for row in steps if row["lambda_tokens"] is not None]
    if lambdas:
        imbalance = _json("analyze", run, "--only", "imbalance", "--db", db)["imbalance"][0]
        assert imbalance["mean_lambda"] == pytest.approx(np.mean(lambdas))
        assert _check(db, run, "--max-imbalance", "5")["measured"] == pytest.approx(np.mean(lambdas))
        t1 = next(row for row in document["table_T1"] if row["run"] == run)
        assert t1["lambda"] == pytest.approx(np.mean(lambdas))
        assert t1["step_time_cv"] == pytest.approx(stage["cv"])
        with Store.open(db, read_only=True) as store:
            frame = store.step_frame(run)
            assert frame["lambda_tokens"].drop_nulls().to_list() == pytest.approx(lambdas)
            from polytrace_cli.model import read_workload

            workload = read_workload(store.connection, run).drop_nulls("busiest_rank_tokens")
            ratio = (workload["busiest_rank_tokens"] / workload["mean_rank_tokens"]).to_list()
            assert ratio == pytest.approx(lambdas)


def test_the_record_is_stored_at_ingest_and_decided_again_when_files_are_added(tmp_path):
    db = tmp_path / "s.duckdb"
    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    shutil.copy(CASES / "balance_on" / "train.log", log)
    _ok("ingest", log, "--run", "grown", "--db", db)
    with Store.open(db, read_only=True) as store:
        stored = store.query("SELECT balance_batch, truncated_steps FROM run_semantics").to_dicts()
    assert stored == [{"balance_batch": "on", "truncated_steps": []}]
    # A run's facts fold over its files in their paths' order: the added file, named after train.log,
    # gives the last word on balance_batch.
    extra = tmp_path / "run" / "train2.log"
    extra.write_text("+ python3 -m verl.trainer.main_ppo trainer.balance_batch=False\n"
                     "(TaskRunner pid=1) step:13 - timing_s/gen:60.0 - timing_s/step:70.0\n")
    _ok("ingest", extra, "--run", "grown", "--db", db)
    with Store.open(db, read_only=True) as store:
        assert store.semantics("grown")["balance_batch"].to_list() == ["off"]
        assert store.query("SELECT balance_batch FROM run_semantics")["balance_batch"].to_list() == ["off"]


def test_real_multi_turn_trace_flags_its_short_step(tmp_path):
    trace = need_real_data("polytrace", "search_r1")
    with Store.open(tmp_path / "s.duckdb") as store:
        store.ingest(trace, run="search")
        record = store.semantics("search").row(0, named=True)
        steps = store.steps("search")
        tools = store.analyze("tools", runs="search").filter(pl.col("tool") == "all").row(0, named=True)
    # step 5 holds 47 responses, most of its prompt groups with one of their 8
    assert record["partial_steps"] == [5]
    assert steps.filter(steps["step"] == 5)["partial"].to_list() == [True]
    # only step 0 made tool calls: its per-step latency is the run's
    step0 = steps.filter(steps["step"] == 0).row(0, named=True)
    assert step0["tool_latency_p99_s"] == pytest.approx(tools["p99_s"])
    assert step0["tool_latency_mean_s"] == pytest.approx(tools["mean_s"])


def test_a_checkpoint_left_out_of_the_logged_step_alone_is_added_back(tmp_path):
    """No testing at all; the checkpoint saves of steps 4 and 8 (20 s) are outside timing_s/step:
    the basis is 'logged without overheads' and their step time counts the save."""
    lines = []
    for step in range(1, 11):
        save = " - timing_s/save_checkpoint:20.0" if step in (4, 8) else ""
        lines.append(f"step:{step} - timing_s/gen:10.0 - timing_s/update_actor:5.0 - timing_s/step:17.0{save}"
                     f" - response_length/mean:{300 + step}.0\n")
    (tmp_path / "train.log").write_text("".join(lines))
    db = tmp_path / "s.duckdb"
    _ok("ingest", tmp_path / "train.log", "--run", "ckpt", "--db", db)
    record = _record(db, "ckpt")
    assert (record["step_time_basis"], record["includes_testing"], record["includes_checkpoint"]) == (
        "logged without overheads", None, False)
    steps = {row["step"]: row for row in _json("steps", "ckpt", "--db", db)}
    assert [steps[s]["step_s"] for s in range(1, 11)] == [37.0 if s in (4, 8) else 17.0 for s in range(1, 11)]
    assert steps[4]["logged_step_s"] == 17.0
