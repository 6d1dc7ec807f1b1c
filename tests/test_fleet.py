"""Fleet analyses (`analyze --by task|model`) and figure F12, checked by hand on three small runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import copy_store
from polytrace_cli.analyze.common import ALL_STEPS
from polytrace_cli.analyze.fleet import COLUMNS, by_group
from polytrace_cli.cli import app
from polytrace_cli.report.figures import f12_by_task
from polytrace_cli.report.figures.base import Omitted
from polytrace_cli.store import open_store
from polytrace_cli.store.queries import run_ids

runner = CliRunner()


def _ok(*args):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


def _packed(folder: Path, step: int, groups: list[tuple[int, int, list[int]]]) -> None:
    """One packed-lengths trace step: groups of (dp rank, prompt length, response lengths)."""
    lines = [json.dumps({"step": step, "rank": rank, "dp_rank": rank, "tp_rank": 0, "local_index": index,
                         "input": prompt, "output": outputs, "n_sampling": len(outputs), "validate": False})
             for index, (rank, prompt, outputs) in enumerate(groups)]
    (folder / f"packed_lengths_step_{step}.jsonl").write_text("\n".join(lines) + "\n")


def _step_times(folder: Path, seconds: list[float]) -> None:
    lines = [json.dumps({"step": step, "data": {"timing_s/step": value}}) for step, value in enumerate(seconds, 1)]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def fleet_store_once(tmp_path_factory) -> Path:
    """Run a (math, model m1): step 0 ranks 0 / 1 hold prompts of 10 with responses [100, 200] /
    [300, 400]; step 1 prompts of 20 with [50, 50] on each rank; step times 10, 20, 30 s.
    Run b (math, m2): step 0 prompts of 30, [600] on rank 0 and [200] on rank 1; step times 5 s × 4.
    Run c (code, m1): step 0 prompts of 5, [1000, 1000] on each rank; two step times only (10, 30)."""
    tmp_path = tmp_path_factory.mktemp("fleet")
    db_path = tmp_path / "store.duckdb"
    a, b, c = (tmp_path / name for name in ("a", "b", "c"))
    for folder in (a, b, c):
        folder.mkdir()
    _packed(a, 0, [(0, 10, [100, 200]), (1, 10, [300, 400])])
    _packed(a, 1, [(0, 20, [50, 50]), (1, 20, [50, 50])])
    _step_times(a, [10, 20, 30])
    _packed(b, 0, [(0, 30, [600]), (1, 30, [200])])
    _step_times(b, [5, 5, 5, 5])
    _packed(c, 0, [(0, 5, [1000, 1000]), (1, 5, [1000, 1000])])
    _step_times(c, [10, 30])
    _ok("ingest", a, b, "--task", "math", "--db", db_path)
    _ok("ingest", c, "--task", "code", "--db", db_path)
    con = open_store(db_path)
    con.execute("UPDATE runs SET model = CASE name WHEN 'b' THEN 'm2' ELSE 'm1' END")
    con.close()
    return db_path


@pytest.fixture
def fleet_store(fleet_store_once, db_path):
    """A copy of the three-run store for one test."""
    return copy_store(fleet_store_once, db_path)


def test_by_task_by_hand(fleet_store):
    rows = {row["group"]: row for row in json.loads(_ok("analyze", "--by", "task", "--json", "--db",
                                                         fleet_store).output)["fleet"]}
    assert list(rows) == ["code", "math"]
    math_row, code = rows["math"], rows["code"]
    assert list(math_row) == list(COLUMNS)
    # math responses: 50 ×4, 100, 200, 200, 300, 400, 600 -> mean 200; p50 between 100 and 200,
    # p90 at position 8.1 between 400 and 600, p99 at 8.91.
    assert (math_row["runs"], math_row["sample_runs"], math_row["samples"]) == (2, 2, 10)
    assert math_row["response_mean_tokens"] == pytest.approx(200)
    assert math_row["response_p50_tokens"] == pytest.approx(150)
    assert math_row["response_p90_tokens"] == pytest.approx(420)
    assert math_row["response_p99_tokens"] == pytest.approx(582)
    assert math_row["response_max_tokens"] == 600
    # math prompts, one per response: 10 ×4, 20 ×4, 30 ×2.
    assert math_row["prompt_mean_tokens"] == pytest.approx(18)
    assert math_row["prompt_p50_tokens"] == pytest.approx(20)
    assert math_row["prompt_p90_tokens"] == pytest.approx(30)
    assert math_row["prompt_max_tokens"] == 30
    # Step-time CV: run a std 10 / mean 20 = 0.5, run b 0; the mean of the two.
    assert math_row["step_time_runs"] == 2
    assert math_row["step_time_cv_mean"] == pytest.approx(0.25)
    assert math_row["step_time_cv_max"] == pytest.approx(0.5)
    # λ per step: a step 0 720 / 520, a step 1 1, b step 0 630 / 430; mean over the three steps.
    lambdas = [720 / 520, 1.0, 630 / 430]
    assert (math_row["imbalance_runs"], math_row["imbalance_steps"]) == (2, 3)
    assert math_row["lambda_mean"] == pytest.approx(sum(lambdas) / 3)
    assert math_row["lambda_max"] == pytest.approx(630 / 430)
    # code: a single run with two step times has no CV, rather than one from two points.
    assert code["response_p50_tokens"] == code["response_max_tokens"] == 1000
    assert code["step_time_runs"] == 0 and code["step_time_cv_mean"] is None
    assert code["lambda_mean"] == pytest.approx(1.0)


def test_by_model_groups_other_runs(fleet_store):
    con = open_store(fleet_store, read_only=True)
    fleet = by_group(con, run_ids(con, None), "model")
    con.close()
    rows = {row["group"]: row for row in fleet.to_dicts()}
    assert sorted(rows) == ["m1", "m2"]
    # m1 = runs a and c: responses 50 ×4, 100, 200, 300, 400, 1000 ×4.
    assert rows["m1"]["samples"] == 12 and rows["m1"]["response_max_tokens"] == 1000
    assert rows["m1"]["response_mean_tokens"] == pytest.approx((200 + 1000 + 4000) / 12)
    assert rows["m1"]["step_time_runs"] == 1 and rows["m1"]["step_time_cv_mean"] == pytest.approx(0.5)
    assert rows["m2"]["samples"] == 2 and rows["m2"]["step_time_cv_mean"] == pytest.approx(0.0)


def test_named_runs_and_unlabeled_runs(fleet_store, tmp_path):
    only_b = json.loads(_ok("analyze", "b", "--by", "task", "--json", "--db", fleet_store).output)["fleet"]
    assert [(row["group"], row["runs"], row["samples"]) for row in only_b] == [("math", 1, 2)]
    unlabeled = tmp_path / "d"
    unlabeled.mkdir()
    _packed(unlabeled, 0, [(0, 1, [7]), (1, 1, [9])])
    _ok("ingest", unlabeled, "--db", fleet_store)
    rows = json.loads(_ok("analyze", "--by", "task", "--json", "--db", fleet_store).output)["fleet"]
    assert [row["group"] for row in rows] == ["code", "math", None]
    assert rows[-1]["response_max_tokens"] == 9


def test_by_option_errors_are_one_line(fleet_store):
    bad = runner.invoke(app, ["analyze", "--by", "user", "--db", str(fleet_store)])
    assert bad.exit_code != 0 and "--by takes task or model" in bad.output
    both = runner.invoke(app, ["analyze", "--by", "task", "--only", "lengths", "--db", str(fleet_store)])
    assert both.exit_code != 0 and "--only" in both.output


def test_figure_f12_draws_several_tasks_and_omits_one(fleet_store, tmp_path):
    con = open_store(fleet_store, read_only=True)
    ids = run_ids(con, None)
    data = f12_by_task.frames(con, ids, ALL_STEPS)
    assert data["fleet"]["group"].to_list() == ["code", "math"]
    figure = f12_by_task.render(data)
    assert not isinstance(figure, Omitted)
    one_task = f12_by_task.frames(con, run_ids(con, ["a", "b"]), ALL_STEPS)
    assert f12_by_task.render(one_task) == Omitted("the runs belong to fewer than two tasks")
    con.close()
    _ok("report", "--db", fleet_store, "--out", tmp_path / "report", "--name", "fleet")
    summary = json.loads((tmp_path / "report" / "fleet" / "summary.json").read_text())
    drawn = {figure["id"]: figure for figure in summary["figures"]}
    assert drawn["F12"]["png"] == "f12_by_task.png"
    assert [row["group"] for row in summary["figure_data"]["F12"]["fleet"]] == ["code", "math"]
