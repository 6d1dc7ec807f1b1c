"""`explain --against` and `check --baseline --max-slowdown`: hand-computed decompositions, and pairs of
verl logs the step-log generator writes from one known step-time model with one factor changed.

The pairs: 60 steps of the math length model, 32 prompts × 8 responses over 4 DP ranks, a cap of
16,384 tokens (the longest response reaches it on most steps), validation every 10 steps and a
checkpoint every 30. Each variant changes one factor of that baseline.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

import schema_check
from polytrace_cli.analyze.common import StepRange
from polytrace_cli.cli import app
from polytrace_cli.diagnose.against import Side, compare_sides, explain_against
from polytrace_cli.diagnose.verdict import judge
from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.model import StageFit, StepTimeModel as FittedModel
from polytrace_cli.schemas import json_schema
from polytrace_cli.store import open_store
from polytrace_cli.workload.presets import preset
from polytrace_cli.workload.steplog import Injection, StepTimeModel, write_step_log
from polytrace_cli.workload.synth import WorkloadSpec

SCHEMA = json_schema("explain_against")
runner = CliRunner()

BASE_SPEC = WorkloadSpec(task="math", steps=60, batch=32, n=8, dp_ranks=4, max_response_len=16384, seed=1)
BASE_MODEL = StepTimeModel(validate_every=10, checkpoint_every=30)
# Variant: (spec, model, the cause that must come first, its stage or None for any).
VARIANTS = {
    "gen_cost": (BASE_SPEC, dataclasses.replace(BASE_MODEL, b_tail=0.012 * 1.3, b_vol=2.0e-5 * 1.3),
                 "efficiency", "gen"),
    "longer": (BASE_SPEC, dataclasses.replace(BASE_MODEL, response_scale=1.5), "token_volume", None),
    "imbalanced": (BASE_SPEC, dataclasses.replace(BASE_MODEL, imbalance=1.5), "dp_imbalance", None),
    "validate_often": (BASE_SPEC, dataclasses.replace(BASE_MODEL, validate_every=5), "validation", "testing"),
    "eight_ranks": (dataclasses.replace(BASE_SPEC, dp_ranks=8), BASE_MODEL, "gpu_count", None),
    # The baseline's longest response sits at its 16,384-token cap on every step; this one's cap is twice that.
    "higher_cap": (dataclasses.replace(BASE_SPEC, max_response_len=32768), BASE_MODEL, "long_tail", "gen"),
}
# The same configuration, another seed.
RESEEDED = (dataclasses.replace(BASE_SPEC, seed=2), BASE_MODEL)
# One run whose generation runs 30% slower from step 31 on (a regression landing mid-run).
REGRESSED = (BASE_SPEC, dataclasses.replace(BASE_MODEL, injections=tuple(
    Injection(step, "unexplained", 1.3) for step in range(31, 61))))


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("against")
    lengths, _ = preset("math")
    db = root / "store.duckdb"
    con = open_store(db)
    runs = {"base": (BASE_SPEC, BASE_MODEL), "reseeded": RESEEDED, "regressed": REGRESSED,
            "no_sync": (BASE_SPEC, dataclasses.replace(BASE_MODEL, weight_sync_s=None)),
            **{name: variant[:2] for name, variant in VARIANTS.items()}}
    frames = {}
    for name, (spec, model) in runs.items():
        frames[name] = write_step_log(lengths, spec, model, root / name).frame
        ingest_paths(con, [root / name], run_name=name, task="math")
    comparisons = {name: explain_against(con, name, "base") for name in (*VARIANTS, "reseeded", "no_sync")}
    comparisons["window"] = explain_against(con, "regressed", steps="31:60", against_steps="1:30")
    con.close()
    return db, frames, comparisons


def _side(name: str, stages: dict[str, StageFit], workload: dict[str, float], ranks: int = 4,
          overheads: dict[str, tuple[float, float]] | None = None, step_s: float = 0.0) -> Side:
    model = FittedModel(stages, {}, pl.DataFrame(), pl.Series(dtype=pl.Boolean))
    spent = {"validation": (0.0, 0.0), "checkpoint": (0.0, 0.0), "weight_sync": (0.0, 0.0), "warmup": (0.0, 0.0)}
    spent.update(overheads or {})
    return Side(label=name, run=name, steps=10, step_s=step_s, wall_s=10 * step_s, model=model, workload=workload,
                ranks=ranks, gpus=ranks, overheads=spent, unexplained_s=0.0, model_s=step_s)


def _cause(comparison, cause: str, stage: str | None = None) -> dict:
    return next(c for c in comparison.to_dict()["causes"] if c["cause"] == cause and stage in (None, c["stage"]))


def test_a_changed_cost_per_token_splits_by_hand():
    # A: gen = 10 + 0.001·tokens at 1,000 tokens = 11 s; B: gen = 10 + 0.002·tokens at 2,000 tokens = 14 s.
    # Shapley: workload = (0.001 + 0.002)/2 · 1,000 = 1.5 s; efficiency = 0.001 · 1,500 = 1.5 s;
    # the orders differ by Δb·ΔW = 0.001 · 1,000 = 1 s.
    a = _side("a", {"gen": StageFit("gen", 10.0, {"response_tokens": 0.001}, (), 10, 0.0)},
              {"response_tokens": 1000.0}, step_s=11.0)
    b = _side("b", {"gen": StageFit("gen", 10.0, {"response_tokens": 0.002}, (), 10, 0.0)},
              {"response_tokens": 2000.0}, step_s=14.0)
    comparison = compare_sides(a, b)
    assert _cause(comparison, "token_volume")["seconds"] == pytest.approx(1.5)
    assert _cause(comparison, "efficiency", "gen")["seconds"] == pytest.approx(1.5)
    assert _cause(comparison, "efficiency", "gen")["b_at_same_workload_s"] == pytest.approx(13.0)
    assert comparison.interaction_s == pytest.approx(1.0)
    assert sum(c["seconds"] for c in comparison.causes) == pytest.approx(3.0)
    assert any("differ by 1.0 s" in text for text in comparison.findings)
    # At the mean workload 1,500 tokens: 10 + 3 = 13 s against 10 + 1.5 = 11.5 s, 13% slower.
    assert any("gen ran 13% slower at the same workload" in text and "+100% seconds per response token" in text
               for text in comparison.findings), comparison.findings


def test_the_busiest_rank_splits_into_imbalance_and_gpu_count_by_hand():
    # update_actor = 0.01 s per busiest-rank token in both. A: mean rank 100, busiest 120 (λ 1.2) on 4 ranks;
    # B: mean rank 50, busiest 75 (λ 1.5) on 8 ranks; all ranks hold 400 tokens in both.
    # Δ = 0.01 · (75 − 120) = −0.45 s = imbalance 0.01 · 75 · 0.3 = 0.225 s
    #   + gpu_count 0.01 · 1.35 · (1/8 − 1/4) · 400 = −0.675 s, token volume 0.
    fit = {"update_actor": StageFit("update_actor", 1.0, {"busiest_rank_tokens": 0.01}, (), 10, 0.0)}
    a = _side("a", fit, {"busiest_rank_tokens": 120.0, "mean_rank_tokens": 100.0}, ranks=4, step_s=2.2)
    b = _side("b", fit, {"busiest_rank_tokens": 75.0, "mean_rank_tokens": 50.0}, ranks=8, step_s=1.75)
    comparison = compare_sides(a, b)
    assert _cause(comparison, "dp_imbalance")["seconds"] == pytest.approx(0.225)
    assert _cause(comparison, "gpu_count")["seconds"] == pytest.approx(-0.675)
    assert all(abs(c["seconds"]) < 1e-12 for c in comparison.causes if c["cause"] == "token_volume")
    assert comparison.to_dict()["causes"][0]["cause"] == "gpu_count"


def test_a_term_one_side_cannot_fit_takes_the_other_sides_coefficient_by_hand():
    # A's longest response is 16,384 on every step: its gen line is the constant 20 + 0.012 · 16,384 = 216.608 s.
    # B: gen = 20 + 0.012 · r_max at a mean r_max of 20,000 = 260 s. Borrowing b_tail = 0.012 for A
    # (intercept 216.608 − 0.012 · 16,384 = 20), the whole 43.392 s is the long tail, none of it efficiency.
    a = _side("a", {"gen": StageFit("gen", 216.608, {}, ("r_max",), 10, 0.0)}, {"r_max": 16384.0}, step_s=216.608)
    b = _side("b", {"gen": StageFit("gen", 20.0, {"r_max": 0.012}, (), 10, 0.0)}, {"r_max": 20000.0}, step_s=260.0)
    comparison = compare_sides(a, b)
    assert _cause(comparison, "long_tail")["seconds"] == pytest.approx(43.392)
    assert all(abs(c["seconds"]) < 1e-9 for c in comparison.causes if c["cause"] == "efficiency")
    assert any("r_max did not vary over a's steps" in note for note in comparison.notes)


def test_an_overhead_is_frequency_times_cost_by_hand():
    # Validation once every 10 steps at 120 s (12 s per step) against once every 5 at 120 s (24 s per step).
    fit = {"gen": StageFit("gen", 10.0, {}, (), 10, 0.0)}
    a = _side("a", fit, {}, overheads={"validation": (0.1, 120.0)}, step_s=22.0)
    b = _side("b", fit, {}, overheads={"validation": (0.2, 120.0)}, step_s=34.0)
    validation = _cause(compare_sides(a, b), "validation")
    assert validation["seconds"] == pytest.approx(12.0)
    assert validation["from_frequency_s"] == pytest.approx(12.0)
    assert validation["from_cost_s"] == pytest.approx(0.0)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_changed_factor_is_named_first_and_carries_most_of_the_difference(pairs, name):
    _, _, comparisons = pairs
    _, _, cause, stage = VARIANTS[name]
    doc = comparisons[name].to_dict()
    first = doc["causes"][0]
    assert first["cause"] == cause, doc["causes"][:3]
    if stage is not None:
        assert first["stage"] == stage
    assert first["share"] >= 0.7, first


def test_the_same_configuration_with_another_seed_shows_no_cause_above_3_percent(pairs):
    doc = pairs[2]["reseeded"].to_dict()
    assert max(abs(c["seconds"]) for c in doc["causes"]) < 0.03 * doc["a_step_s"], doc["causes"][:3]
    # A difference this small (under 1% of the step) gets no shares: they would be ratios of noise.
    assert abs(doc["delta_s"]) < 0.01 * doc["a_step_s"] and all(c["share"] is None for c in doc["causes"])


def test_the_causes_sum_to_the_delta_and_the_mean_step_is_the_logs(pairs):
    _, frames, comparisons = pairs
    base_mean = frames["base"]["step_s"].mean()  # verl 0.5: timing_s/step includes validation and checkpoints
    for name, comparison in comparisons.items():
        doc = comparison.to_dict()
        assert sum(c["seconds"] for c in doc["causes"]) == pytest.approx(doc["delta_s"], rel=1e-9, abs=1e-9), name
        schema_check.validate(doc, SCHEMA)
        if name != "window":
            assert doc["a_step_s"] == pytest.approx(base_mean, rel=1e-6)
            assert doc["b_step_s"] == pytest.approx(frames[name]["step_s"].mean(), rel=1e-6)
    validation = _cause(comparisons["validate_often"], "validation")
    assert (validation["frequency_a"], validation["frequency_b"]) == (pytest.approx(0.1), pytest.approx(0.2))
    assert validation["cost_b_s"] == pytest.approx(120.0, rel=0.1)


def test_a_longer_tail_against_a_capped_baseline_is_the_tail_cost_of_the_truth(pairs):
    _, frames, comparisons = pairs
    # The generator's gen_s = 20 + 0.012 · r_max + 2e-5 · response_tokens (times noise and warm-up).
    truth = 0.012 * (frames["higher_cap"]["r_max"].mean() - frames["base"]["r_max"].mean())
    # The slope is fitted on the higher-cap run alone, where it trades off against the intercept: within 15%,
    # and the gen-stage total of tail and efficiency within 5%.
    long_tail = _cause(comparisons["higher_cap"], "long_tail")["seconds"]
    assert long_tail == pytest.approx(truth, rel=0.15)
    assert long_tail + _cause(comparisons["higher_cap"], "efficiency", "gen")["seconds"] == pytest.approx(truth, rel=0.05)


def test_a_timer_one_log_lacks_is_named(pairs):
    # No weight sync at all in no_sync (the generator's weight_sync_s=None): 5 s per step less, and the
    # note says where an untimed sync would have gone.
    doc = pairs[2]["no_sync"].to_dict()
    first = doc["causes"][0]
    assert (first["cause"], first["frequency_a"], first["frequency_b"]) == ("weight_sync", 1.0, 0.0)
    assert first["seconds"] == pytest.approx(-5.0, rel=0.05)
    assert any("update_weights is timed in base's log only" in note for note in doc["notes"])


def test_more_gpus_say_which_stage_stopped_scaling(pairs):
    scaling = pairs[2]["eight_ranks"].to_dict()["scaling"]
    assert (scaling["fewer_gpus"], scaling["more_gpus"]) == (4, 8)
    by_stage = {row["stage"]: row for row in scaling["stages"]}
    # The generator's generation does not depend on the GPU count; the training stages follow the busiest rank.
    assert scaling["stopped_scaling"] == "gen"
    assert by_stage["gen"]["speedup"] == pytest.approx(1.0, abs=0.05)
    assert by_stage["update_actor"]["speedup"] > 1.4
    assert pairs[2]["gen_cost"].to_dict()["scaling"] is None


def test_two_windows_of_one_run_find_the_regression(pairs):
    doc = pairs[2]["window"].to_dict()
    assert (doc["a"], doc["b"]) == ("regressed steps 1:30", "regressed steps 31:60")
    first = doc["causes"][0]
    assert (first["cause"], first["stage"]) == ("efficiency", "gen")
    assert first["share"] >= 0.7
    assert first["b_at_same_workload_s"] / first["a_at_same_workload_s"] == pytest.approx(1.3, abs=0.05)


def test_cli_json_validates_and_the_table_names_the_cause(pairs):
    db = pairs[0]
    result = runner.invoke(app, ["explain", "gen_cost", "--against", "base", "--json", "--db", str(db)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    schema_check.validate(doc, SCHEMA)
    assert doc["causes"][0]["cause"] == "efficiency"
    result = runner.invoke(app, ["explain", "regressed", "--steps", "31:60", "--against-steps", "1:30", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "gen ran 3" in result.output and "slower at the same workload" in result.output
    result = runner.invoke(app, ["explain", "eight_ranks", "--against", "base", "--db", str(db)])
    assert result.exit_code == 0 and "Scaling per stage, 4 → 8 GPUs" in result.output
    assert "gen stopped scaling" in result.output
    # A label is printed as written ("1:100" is also an emoji code).
    result = runner.invoke(app, ["explain", "regressed", "--steps", "31:60", "--against-steps", "1:100", "--db", str(db)])
    assert result.exit_code == 0 and "against regressed steps 1:100:" in result.output, result.output
    result = runner.invoke(app, ["explain", "base", "--steps", "1:30", "--db", str(db)])
    assert result.exit_code != 0 and "--against" in result.output
    result = runner.invoke(app, ["explain", "base", "--against", "base", "--db", str(db)])
    assert result.exit_code != 0 and "compared with itself" in result.output


def test_check_gates_on_the_slowdown_and_names_the_top_cause(pairs):
    db = str(pairs[0])
    result = runner.invoke(app, ["check", "gen_cost", "--baseline", "base", "--max-slowdown", "5%", "--json", "--db", db])
    assert result.exit_code == 1, result.output
    doc = json.loads(result.output)
    schema_check.validate(doc, json_schema("check"))
    (verdict,) = doc["checks"]
    assert (verdict["threshold"], verdict["status"]) == ("max_slowdown", "FAIL")
    # --max-slowdown gates the efficiency at the same workload; --max-step-slowdown the raw mean step.
    assert verdict["measured"] == pytest.approx(judge(pairs[2]["gen_cost"]).efficiency)
    assert (doc["baseline"]["verdict"]["verdict"], doc["baseline"]["verdict"]["stage"]) == ("regression", "gen")
    assert (doc["baseline"]["top_cause"]["cause"], doc["baseline"]["top_cause"]["stage"]) == ("efficiency", "gen")
    result = runner.invoke(app, ["check", "gen_cost", "--baseline", "base", "--max-step-slowdown", "5%", "--json",
                                 "--db", db])
    (raw,) = json.loads(result.output)["checks"]
    assert (raw["threshold"], raw["status"]) == ("max_step_slowdown", "FAIL")
    assert raw["measured"] == pytest.approx(pairs[2]["gen_cost"].slowdown)
    result = runner.invoke(app, ["check", "gen_cost", "--baseline", "base", "--max-slowdown", "5%", "--db", db])
    assert result.exit_code == 1 and "top cause efficiency (gen)" in result.output
    assert "regression: gen +" in result.output
    result = runner.invoke(app, ["check", "reseeded", "--baseline", "base", "--max-slowdown", "0.05", "--db", db])
    assert result.exit_code == 0, result.output
    # More GPUs: the runs do not compare like for like, and the gate says so instead of passing.
    result = runner.invoke(app, ["check", "eight_ranks", "--baseline", "base", "--max-slowdown", "0%", "--db", db])
    assert result.exit_code == 1 and "inconclusive: 8 GPUs in eight_ranks against 4 in base" in result.output


def test_check_without_comparable_steps_is_not_measurable(pairs):
    db = str(pairs[0])
    args = ["check", "gen_cost", "--baseline", "base", "--max-slowdown", "5%", "--steps", "1:5", "--db", db]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 1
    doc = json.loads(result.output)
    schema_check.validate(doc, json_schema("check"))
    (verdict,) = doc["checks"]
    assert verdict["status"] == "not measurable" and "needs 8" in verdict["reason"]
    assert doc["baseline"]["verdict"]["verdict"] == "inconclusive" and doc["baseline"]["a_step_s"] is None
    assert runner.invoke(app, [*args, "--allow-unmeasurable"]).exit_code == 0
    for bad in (["--max-slowdown", "5"], ["--max-slowdown", "fast"], ["--max-slowdown", "-1%"]):
        result = runner.invoke(app, ["check", "gen_cost", "--baseline", "base", *bad, "--db", db])
        assert result.exit_code == 2 and "--max-slowdown" in result.output, result.output
    result = runner.invoke(app, ["check", "gen_cost", "--baseline", "base", "--db", db])
    assert result.exit_code == 2 and "go together" in result.output
    result = runner.invoke(app, ["check", "gen_cost", "--baseline", "nope", "--max-slowdown", "5%", "--db", db])
    assert result.exit_code != 0 and "no run named nope" in result.output


def test_a_report_of_runs_of_one_task_compares_them(pairs, tmp_path):
    from polytrace_cli import Store

    with Store.open(pairs[0], read_only=True) as store:
        index = store.report(["base", "validate_often", "gen_cost"], tmp_path, name="pair")
    summary = json.loads((index.parent / "summary.json").read_text())
    schema_check.validate(summary, json_schema("summary"))
    compared = {(c["a"], c["b"]): c for c in summary["comparisons"]}
    assert set(compared) == {("base", "validate_often"), ("base", "gen_cost")}
    assert compared[("base", "validate_often")]["causes"][0]["cause"] == "validation"
    assert compared[("base", "gen_cost")]["delta_s"] == pytest.approx(pairs[2]["gen_cost"].delta_s)
    page = index.read_text()
    assert "Runs of one task compared" in page and "gen_cost against base (task math)" in page
    markdown = (index.parent / "summary.md").read_text()
    assert "### validate\\_often against base (task math)" in markdown  # run names are escaped Markdown
    assert "- validation (testing) +12" in markdown


def test_runs_without_comparable_steps_are_listed_with_the_reason(pairs):
    from polytrace_cli.report.comparison import html_section, run_comparisons

    con = open_store(pairs[0], read_only=True)
    try:
        ids = [row[0] for row in con.execute("SELECT run_id FROM runs WHERE name IN ('base', 'longer') ORDER BY run_id")
               .fetchall()]
        (entry,) = run_comparisons(con, ids, StepRange(1, 5))
    finally:
        con.close()
    assert entry["delta_s"] is None and "needs 8" in entry["omitted"]
    assert "not compared" in html_section([entry])


def test_real_traces_without_step_timings_get_a_one_line_reason(db_path):
    from tests.conftest import need_real_data

    verl = need_real_data("polytrace", "verl")
    rllm = need_real_data("polytrace", "rllm")
    con = open_store(db_path)
    try:
        ingest_paths(con, [verl], run_name="verl_dapo", task="math")
        ingest_paths(con, [rllm], run_name="rllm_code", task="code")
    finally:
        con.close()
    result = runner.invoke(app, ["explain", "verl_dapo", "--against", "rllm_code", "--db", str(db_path)])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0 and "needs 8" in result.output and "Traceback" not in result.output
    result = runner.invoke(app, ["check", "verl_dapo", "--baseline", "rllm_code", "--max-slowdown", "5%", "--json",
                                 "--db", str(db_path)])
    assert result.exit_code == 1
    assert json.loads(result.output)["checks"][0]["status"] == "not measurable"


def test_the_store_facade_answers_the_same(pairs):
    from polytrace_cli import Store

    with Store.open(pairs[0], read_only=True) as store:
        comparison = store.explain_against("regressed", steps="31:60", against_steps="1:30")
    assert comparison.to_dict() == pairs[2]["window"].to_dict()


def test_synth_writes_a_run_with_one_factor_changed(tmp_path):
    args = ["synth", "--task", "math", "--num-steps", "3", "--batch", "8", "--dp-ranks", "4", "--seed", "5"]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "traces"), "--imbalance", "1.5"])
    assert result.exit_code == 2 and "--imbalance applies to verl logs" in result.output
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "run"), "--format", "verl-jsonl", "--imbalance", "1.5",
                                 "--response-scale", "1.2"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line)["data"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    ratios = [d["global_seqlen/max"] / d["global_seqlen/mean"] for d in lines if "global_seqlen/max" in d]
    assert len(ratios) == 3 and all(1.3 < r < 1.7 for r in ratios)
