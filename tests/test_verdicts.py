"""Comparisons that refuse nonsense (`diagnose.comparable`) and verdicts that workload drift cannot fool
(`diagnose.verdict`, `check --baseline`).

The verl runs are written by the step-log generator from one known step-time model (40 steps of the
math length model, 32 prompts × 8 responses over 4 DP ranks, a 16,384-token cap the longest response
reaches, validation every 10 steps): a base whose responses grow by 20% over the run, the same with a
critic (values and update_critic timed, `critic/vf_loss` logged), the same with another model path,
and runs against the base as the benchmark draws them (benchmarks/verdicts.py): responses × 1.25 and
× 0.8 (workload only), responses × 1.25 with ref 5% slower, generation 10% faster. The TRL runs are console
logs as the Trainer prints them (one dict per step, `step_time`, no stage timer, no per-rank data).
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

import schema_check
from polytrace_cli.analyze.common import StepRange
from polytrace_cli.cli import app
from polytrace_cli.diagnose.against import explain_against
from polytrace_cli.diagnose.comparable import Profile, compare_profiles, relative_change
from polytrace_cli.diagnose.verdict import IMPROVEMENT, INCONCLUSIVE, NO_CHANGE, REGRESSION, judge
from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.schemas import json_schema
from polytrace_cli.store import open_store
from polytrace_cli.workload.presets import preset
from polytrace_cli.workload.steplog import StepTimeModel, write_step_log
from polytrace_cli.workload.synth import WorkloadSpec

runner = CliRunner()
STEPS = 40
SPEC = WorkloadSpec(task="math", steps=STEPS, batch=32, n=8, dp_ranks=4, max_response_len=16384, seed=11,
                    drift=1.2 ** (1 / STEPS) - 1)
MODEL = StepTimeModel(validate_every=10)
# A critic as verl times it: `timing_s/values` and `timing_s/update_critic`, the two critic sections of
# verl's timing metrics (volcengine/verl @ 7fd55735213b077cb8ae921397f3c5e00c5e7a98,
# verl/trainer/ppo/metric_utils.py, compute_timing_metrics), each following the tokens of the busiest rank.
CRITIC = dataclasses.replace(MODEL, token_stages=(*MODEL.token_stages, ("values", 4.0, 1.2e-5),
                                                  ("update_critic", 8.0, 3.0e-5)))


def slower(model: StepTimeModel, stage: str, factor: float = 1.05) -> StepTimeModel:
    """One token stage `factor` times slower at every workload."""
    return dataclasses.replace(model, token_stages=tuple(
        (name, a * factor, b * factor) if name == stage else (name, a, b) for name, a, b in model.token_stages))


def scaled(ratio: float, model: StepTimeModel = MODEL) -> StepTimeModel:
    return dataclasses.replace(model, response_scale=ratio)


RUNS = {
    "base": (SPEC, MODEL),
    "critic": (dataclasses.replace(SPEC, seed=12), CRITIC),
    "longer": (dataclasses.replace(SPEC, seed=13), scaled(1.25)),
    "ref_slower": (dataclasses.replace(SPEC, seed=14), scaled(1.25, slower(MODEL, "ref"))),
    # Shorter than the base: the base is drawn × 1.25 and these × 1.0, so neither is cut below the cap.
    "base_long": (dataclasses.replace(SPEC, seed=15), scaled(1.25)),
    "shorter": (dataclasses.replace(SPEC, seed=16), MODEL),
    "gen_faster": (dataclasses.replace(SPEC, seed=18), dataclasses.replace(
        MODEL, a_gen=MODEL.a_gen * 0.9, b_tail=MODEL.b_tail * 0.9, b_vol=MODEL.b_vol * 0.9)),
}


def _trl_log(path: Path, seed: int, base_s: float, per_token_s: float, steps: int = 40) -> None:
    """A TRL console log: a dict per step under a bar redrawn with carriage returns, step_time =
    base_s + per_token_s × the longest response (± 0.1 s)."""
    rng = random.Random(seed)
    lines = ["trl==0.19.1"]
    elapsed, tokens = 0.0, 0
    bar = f"\r  0%|          | 0/{steps} [00:00<?, ?it/s]"
    for step in range(1, steps + 1):
        mean = rng.uniform(200, 400)
        longest = round(rng.uniform(500, 1000), 1)
        seconds = base_s + per_token_s * longest + rng.uniform(-0.1, 0.1)
        elapsed += seconds
        tokens += int(64 * (mean + 150))
        drawn = f"\r{100 * step // steps:3d}%|█| {step}/{steps} [00:{int(elapsed) % 60:02d}<00:10, {seconds:.2f}s/it]"
        metrics = {"loss": 0.001, "num_tokens": float(tokens), "completions/mean_length": round(mean, 2),
                   "completions/max_length": longest, "completions/clipped_ratio": 0.0, "reward": 0.5,
                   "step_time": round(seconds, 3), "epoch": round(step / steps, 2)}
        lines.append(bar + drawn + "\r" + " " * 40 + "\r" + repr(metrics))
        bar = drawn
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("verdicts")
    lengths, _ = preset("math")
    db = root / "store.duckdb"
    con = open_store(db)
    for name, (spec, model) in RUNS.items():
        write_step_log(lengths, spec, model, root / name)
        ingest_paths(con, [root / name], run_name=name, task="math")
    # The base again under another model path (the generator always writes Qwen2.5-7B).
    other = root / "other_model"
    other.mkdir()
    for log in (root / "base").glob("*.log"):
        (other / log.name).write_text(log.read_text().replace("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen3-0.6B"))
    ingest_paths(con, [other], run_name="other_model", task="math")
    for name, seed in (("trl_a", 1), ("trl_c", 3)):
        (root / name).mkdir()
        _trl_log(root / name / "train.log", seed, 2.0, 0.012)
        ingest_paths(con, [root / name], run_name=name, task="gsm8k")
    comparisons = {name: explain_against(con, name, "base") for name in
                   ("critic", "longer", "ref_slower", "other_model", "gen_faster")}
    comparisons["shorter"] = explain_against(con, "shorter", "base_long")
    comparisons["trl_same"] = explain_against(con, "trl_c", "trl_a")
    con.close()
    return db, comparisons


def test_a_run_that_logs_value_metrics_trains_a_critic(fresh_store, tmp_path):
    # verl writes critic/values/* and critic/vf_explained_var only with use_critic; critic/advantages,
    # critic/returns, critic/score and critic/rewards come from every run (volcengine/verl @
    # 7fd55735213b077cb8ae921397f3c5e00c5e7a98, verl/trainer/ppo/metric_utils.py, compute_data_metrics).
    from polytrace_cli.diagnose.comparable import CRITIC_ONLY, logs_critic_keys
    from polytrace_cli.ingest.driver import ingest_paths
    from polytrace_cli.ingest.formats.verl.names import METRIC_ALIASES

    critic_keys = {key for key, name in METRIC_ALIASES.items() if name == CRITIC_ONLY}
    assert "critic/values/mean" in critic_keys and "critic/vf_explained_var" in critic_keys
    assert not any(key.startswith(("critic/advantages", "critic/returns", "critic/score", "critic/rewards"))
                   for key in critic_keys)
    from polytrace_cli.store import open_store

    con = open_store(fresh_store(tmp_path / "critic.duckdb"))
    for name, extra in (("ppo", " - critic/vf_loss:0.12"), ("grpo", " - critic/advantages/mean:0.0")):
        log = tmp_path / name / "train.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"step:1 - timing_s/step:10.0{extra}\n")
        ingest_paths(con, [log])
    ids = dict(con.execute("SELECT name, run_id FROM runs").fetchall())
    assert logs_critic_keys(con, ids["ppo"]) and not logs_critic_keys(con, ids["grpo"])
    con.close()


def test_runs_that_match_compare_and_each_difference_is_named():
    base = Profile("A", framework="verl", model="Qwen/Qwen2.5-7B-Instruct", estimator="grpo", gpus=8,
                   stages=("gen", "ref", "update_actor"), per_rank=True)
    assert compare_profiles(base, dataclasses.replace(base, label="B")).comparable
    ppo = dataclasses.replace(base, label="B", model="Qwen/Qwen3-0.6B", estimator="gae", critic=True, gpus=16,
                              stages=("gen", "values", "update_actor", "update_critic"))
    guard = compare_profiles(base, ppo)
    assert [d.kind for d in guard.differences] == ["algorithm", "estimator", "model", "gpus", "stages"]
    assert guard.reasons == ["B trains a critic and A does not", "advantage estimator gae in B against grpo in A",
                             "model Qwen/Qwen3-0.6B in B against Qwen/Qwen2.5-7B-Instruct in A",
                             "16 GPUs in B against 8 in A", "values, update_critic timed in B only; ref timed in A only"]
    assert (guard.only_in_a, guard.only_in_b) == (("ref",), ("values", "update_critic"))
    # What a side does not know is no difference.
    assert compare_profiles(base, dataclasses.replace(base, label="B", model=None, gpus=None)).comparable


def test_no_percentage_over_a_base_near_zero():
    assert relative_change(1.1, 1.0, 0.01) == pytest.approx(0.1)
    assert relative_change(1.0, 1e-12, 0.01) is None
    assert relative_change(5.0, 0.0, 0.0) is None


def test_a_critic_is_its_own_cause_never_an_efficiency(store):
    doc = store[1]["critic"].to_dict()
    schema_check.validate(doc, json_schema("explain_against"))
    by_stage = {c["stage"]: c for c in doc["causes"] if c["stage"] in ("values", "update_critic")}
    assert {c["cause"] for c in by_stage.values()} == {"stage_only_in_b"}
    assert not any(c["cause"] == "efficiency" and c["stage"] in ("values", "update_critic") for c in doc["causes"])
    # values = 4 s + 1.2e-5 s per token of the busiest rank; the cause is all of it.
    assert by_stage["values"]["seconds"] > 4.0
    assert doc["comparable"]["comparable"] is False
    assert [d["kind"] for d in doc["comparable"]["differences"]] == ["algorithm", "stages"]
    assert doc["comparable"]["b"]["critic"] is True and doc["comparable"]["a"]["critic"] is False
    assert "critic and base do not compare like for like: critic trains a critic and base does not" in doc["findings"][1]
    assert any(f.startswith("stage only in B: update_critic +") for f in doc["findings"])
    assert sum(c["seconds"] for c in doc["causes"]) == pytest.approx(doc["delta_s"])


def test_a_scaling_table_has_only_stages_both_runs_time():
    from polytrace_cli.diagnose.against import Side, _scaling
    from polytrace_cli.model import StageFit, StepTimeModel as FittedModel
    import polars as pl

    def side(label, gpus, stages):
        fits = {name: StageFit(name, seconds, {}, (), 10, 0.1) for name, seconds in stages.items()}
        model = FittedModel(fits, {}, pl.DataFrame(), pl.Series(dtype=pl.Boolean))
        return Side(label=label, run=label, steps=10, step_s=sum(stages.values()), wall_s=0.0, model=model,
                    workload={}, ranks=gpus, gpus=gpus, overheads={}, unexplained_s=0.0, model_s=0.0)

    # ref is timed by the 4-GPU run only; reward is near zero on both.
    scaling = _scaling(side("A", 4, {"gen": 40.0, "ref": 10.0, "reward": 1e-4}),
                       side("B", 16, {"gen": 20.0, "reward": 1e-6}), "busiest_rank_tokens")
    rows = {row["stage"]: row for row in scaling["stages"]}
    assert set(rows) == {"gen", "reward"}
    assert rows["gen"]["speedup"] == pytest.approx(2.0)
    assert rows["reward"]["speedup"] is None and not rows["reward"]["stopped"]


def test_the_verdict_sees_through_workload_drift(store):
    longer, shorter = judge(store[1]["longer"]), judge(store[1]["shorter"])
    for verdict in (longer, shorter):
        assert verdict.verdict == NO_CHANGE, verdict.headline()
    # The raw step is far slower (or faster) for the workload alone, and the verdict says so apart.
    assert store[1]["longer"].slowdown > 0.03 and store[1]["shorter"].slowdown < -0.03
    (volume,) = [w for w in longer.workload if w["cause"] == "token_volume"]
    assert volume["text"].startswith("token volume (response tokens +16%") and "workload, not a regression" in volume["text"]


def test_a_five_percent_slower_stage_is_a_regression_named_with_its_seconds(store):
    # ref holds about 4% of the step: 5% of it is 0.2% of the step, behind responses 16% longer.
    stage = "ref"
    verdict = judge(store[1]["ref_slower"])
    assert (verdict.verdict, verdict.stage) == (REGRESSION, stage), verdict.headline()
    carrying = next(s for s in verdict.stages if s.stage == stage)
    assert carrying.b_s / carrying.a_s == pytest.approx(1.05, abs=0.02)
    assert carrying.low_s > 0 and verdict.seconds == pytest.approx(carrying.seconds)
    assert verdict.headline().startswith(f"regression: {stage} +")
    assert all(s.call != "slower" for s in verdict.stages if s.stage != stage)


def test_a_faster_generation_is_an_improvement(store):
    verdict = judge(store[1]["gen_faster"])
    assert (verdict.verdict, verdict.stage) == (IMPROVEMENT, "gen"), verdict.headline()
    gen = next(s for s in verdict.stages if s.stage == "gen")
    assert gen.b_s / gen.a_s == pytest.approx(0.9, abs=0.02) and gen.high_s < 0
    assert verdict.efficiency < -0.05 and verdict.interval[1] < 0


def test_a_feature_neither_run_varied_at_different_levels_is_inconclusive_by_hand():
    from polytrace_cli.diagnose.verdict import _confounded

    # Both runs' longest response sits at one value on every step (the cap; 0.7 × the cap in B): neither gen
    # line has a term for it, and its cost cannot be told from gen's efficiency.
    a = _side("a", {"gen": (216.6, {"response_tokens": 2e-5})}, {"r_max": 16384.0, "response_tokens": 2e6}, 260.0)
    b = _side("b", {"gen": (157.6, {"response_tokens": 2e-5})}, {"r_max": 11469.0, "response_tokens": 1.4e6}, 190.0)
    for side in (a, b):
        intercept, terms, _ = side.lines["gen"]
        side.lines["gen"] = (intercept, terms, ("r_max",))
    (reason,) = _confounded(a, b, ["gen"])
    assert reason.startswith("r_max did not vary over either side's steps (11,469 against 16,384 per step)")
    b.workload["r_max"] = 16384.0
    assert _confounded(a, b, ["gen"]) == []


def test_runs_that_do_not_compare_are_inconclusive(store):
    for name, reason in (("critic", "critic trains a critic and base does not"),
                         ("other_model", "model Qwen/Qwen3-0.6B in other_model against Qwen/Qwen2.5-7B-Instruct")):
        verdict = judge(store[1][name])
        assert verdict.verdict == INCONCLUSIVE and any(r.startswith(reason) for r in verdict.reasons)


def _side(name: str, stages: dict, workload: dict[str, float], step_s: float, per_rank: bool = False):
    import polars as pl

    from polytrace_cli.diagnose.against import Side
    from polytrace_cli.model import StageFit, StepTimeModel as FittedModel

    fits = {stage: StageFit(stage, intercept, terms, (), 10, 0.0) for stage, (intercept, terms) in stages.items()}
    model = FittedModel(fits, {}, pl.DataFrame(), pl.Series(dtype=pl.Boolean))
    spent = {"validation": (0.0, 0.0), "checkpoint": (0.0, 0.0), "weight_sync": (0.0, 0.0), "warmup": (0.0, 0.0)}
    side = Side(label=name, run=name, steps=10, step_s=step_s, wall_s=10 * step_s, model=model, workload=workload,
                ranks=1, gpus=1, overheads=spent, unexplained_s=0.0, model_s=step_s)
    return dataclasses.replace(side, per_rank=True) if per_rank else side


def test_no_percentage_per_unit_over_a_coefficient_near_zero_by_hand():
    from polytrace_cli.diagnose.against import compare_sides

    # A TRL-like whole step: A = 2 + 0.012 · r_max + 1e-15 · response_tokens (a bound fit's "zero") at r_max 800
    # and 200,000 response tokens = 11.6 s; B = 2 + 0.012 · r_max + 1e-4 · response_tokens = 31.6 s. The
    # response-token term of A holds 2e-10 s, below 1% of A's step: no "seconds per response token" change.
    a = _side("a", {"whole_step": (2.0, {"r_max": 0.012, "response_tokens": 1e-15})},
              {"r_max": 800.0, "response_tokens": 200_000.0}, step_s=11.6)
    b = _side("b", {"whole_step": (2.0, {"r_max": 0.012, "response_tokens": 1e-4})},
              {"r_max": 800.0, "response_tokens": 200_000.0}, step_s=31.6)
    findings = compare_sides(a, b).findings
    efficiency = next(f for f in findings if f.startswith("efficiency"))
    assert "seconds per response token" not in efficiency, efficiency
    assert "whole_step ran 172% slower at the same workload" in efficiency  # (31.6 − 11.6) / 11.6, base 11.6 s


def test_no_rank_talk_without_per_rank_data_by_hand():
    from polytrace_cli.diagnose.against import compare_sides

    # Without per-rank data a "rank" holds total / ranks: the finding names the tokens logged, never a rank.
    workload_a = {"response_tokens": 900.0, "mean_rank_tokens": 900.0, "total_tokens": 900.0,
                  "busiest_rank_tokens": 900.0}
    workload_b = {"response_tokens": 1030.0, "mean_rank_tokens": 1030.0, "total_tokens": 1030.0,
                  "busiest_rank_tokens": 1030.0}
    line = {"whole_step": (1.0, {"busiest_rank_tokens": 0.01})}
    comparison = compare_sides(_side("a", line, workload_a, 10.0), _side("b", line, workload_b, 11.3))
    volume = next(f for f in comparison.findings if f.startswith("token_volume"))
    assert "rank" not in volume and "tokens per step 1,030 against 900 (+14%)" in volume, volume
    with_ranks = compare_sides(_side("a", line, workload_a, 10.0, per_rank=True),
                               _side("b", line, workload_b, 11.3, per_rank=True))
    assert any("the mean rank held 1,030 tokens against 900" in f for f in with_ranks.findings)


def test_trl_runs_compare_on_their_whole_step(store):
    doc = store[1]["trl_same"].to_dict()
    assert "rank" not in " ".join(doc["findings"])
    assert doc["comparable"]["comparable"] is True
    assert doc["comparable"]["a"]["per_rank"] is False and doc["comparable"]["a"]["stages"] == ["whole_step"]
    assert judge(store[1]["trl_same"]).verdict == NO_CHANGE


def test_check_cli_verdicts_windows_and_a_lake_baseline(store, tmp_path):
    db = str(store[0])
    result = runner.invoke(app, ["check", "ref_slower", "--baseline", "base", "--max-slowdown", "0%", "--json", "--db", db])
    assert result.exit_code == 1, result.output
    doc = json.loads(result.output)
    schema_check.validate(doc, json_schema("check"))
    assert (doc["baseline"]["verdict"]["verdict"], doc["baseline"]["verdict"]["stage"]) == ("regression", "ref")
    # The raw mean step fails a 3% gate on workload alone; the efficiency gate passes it.
    result = runner.invoke(app, ["check", "longer", "--baseline", "base", "--max-slowdown", "5%",
                                 "--max-step-slowdown", "3%", "--json", "--db", db])
    doc = json.loads(result.output)
    assert result.exit_code == 1 and [c["status"] for c in doc["checks"]] == ["pass", "FAIL"]
    assert doc["baseline"]["verdict"]["verdict"] == "no change"
    result = runner.invoke(app, ["check", "critic", "--baseline", "base", "--max-slowdown", "5%", "--db", db])
    assert result.exit_code == 1 and "inconclusive: critic trains a critic" in result.output
    # A window of one run against another window of it.
    result = runner.invoke(app, ["check", "base", "--steps", "21:40", "--baseline-steps", "1:20", "--max-slowdown",
                                 "5%", "--json", "--db", db])
    doc = json.loads(result.output)
    assert doc["baseline"]["baseline"] == "base steps 1:20" and doc["baseline"]["verdict"]["verdict"] != "regression"
    # A baseline kept in a lake: the same run name, read from there.
    assert runner.invoke(app, ["lake", str(tmp_path / "lake"), "base", "--db", db]).exit_code == 0
    # Within a 5% limit the regression of one stage passes the gate, and is still named.
    result = runner.invoke(app, ["check", "ref_slower", "--baseline", "base", "--baseline-db", str(tmp_path / "lake"),
                                 "--max-slowdown", "5%", "--db", db])
    assert result.exit_code == 0 and "regression: ref +" in result.output, result.output
    assert "tells the rest" not in result.output  # explain cannot read a baseline kept elsewhere
    for bad, message in ((["--baseline", "base"], "go together"), (["--max-step-slowdown", "5"], "--max-step-slowdown"),
                         (["--baseline-db", str(tmp_path / "nowhere"), "--max-slowdown", "5%"], "nowhere")):
        result = runner.invoke(app, ["check", "ref_slower", *bad, "--db", db])
        assert result.exit_code == 2 and message in result.output, result.output


def test_the_report_compares_only_runs_that_match(store):
    from polytrace_cli.report.comparison import html_section, markdown_lines, run_comparisons

    con = open_store(store[0], read_only=True)
    try:
        ids = [row[0] for row in con.execute(
            "SELECT run_id FROM runs WHERE name IN ('base', 'critic', 'ref_slower') ORDER BY run_id").fetchall()]
        entries = run_comparisons(con, ids, StepRange())
    finally:
        con.close()
    summary = json_schema("summary")
    item = {**summary["properties"]["comparisons"]["items"], "$defs": summary["$defs"]}
    for entry in entries:
        schema_check.validate(json.loads(json.dumps(entry, default=str)), item)
    compared = {(c["a"], c["b"]): c for c in entries}
    critic = compared[("base", "critic")]
    assert critic["delta_s"] is None and critic["causes"] == [] and critic["verdict"] is None
    assert critic["omitted"].startswith("the runs do not compare like for like: critic trains a critic")
    slower_ref = compared[("base", "ref_slower")]
    assert slower_ref["verdict"]["verdict"] == "regression" and slower_ref["verdict"]["stage"] == "ref"
    page = html_section(entries)
    assert "not compared: the runs do not compare like for like" in page
    assert "verdict at the same workload: regression: ref +" in page
    assert any(line.startswith("- verdict at the same workload: regression: ref +") for line in markdown_lines(entries))


def test_compare_says_when_runs_do_not_compare_and_takes_no_percentage_over_zero(store):
    import polars as pl

    from polytrace_cli.analyze.results import compare_frame

    result = runner.invoke(app, ["compare", "base", "critic", "--only", "stages", "--db", str(store[0])])
    assert result.exit_code == 0, result.output
    assert "note: critic and base do not compare like for like: critic trains a critic and base does not" in result.output
    result = runner.invoke(app, ["compare", "base", "longer", "--only", "stages", "--db", str(store[0])])
    assert result.exit_code == 0 and "do not compare" not in result.output
    # (B − A) / |A| over an A of 1e-12 would be +1e14 %: no relative change over a base near zero.
    summary = pl.DataFrame({"run": ["a", "b"], "seconds": [1e-12, 1.0], "share": [0.2, 0.3]})
    frame = compare_frame("a", "b", {"stages": summary})
    relative = dict(zip(frame["metric"], frame["relative_delta"]))
    assert relative["seconds"] is None and relative["share"] == pytest.approx(0.5)


def test_watch_alerts_when_a_stage_leaves_the_baselines_band(store, tmp_path):
    from polytrace_cli.watch import WatchSettings, watch_log
    from polytrace_cli.watch.baseline import BaselineBand

    # The same configuration as the base, another seed; generation takes 25 s more (about 9%) from step 21 on.
    # The log is watched whole into a store of its own, on a clock that only the watch's sleeps move.
    lengths, _ = preset("math")
    shifted = dataclasses.replace(MODEL, level_shifts=((21, "gen", 25.0),))
    write_step_log(lengths, dataclasses.replace(SPEC, seed=99), shifted, tmp_path / "live")
    baseline_con = open_store(store[0], read_only=True)
    try:
        band = BaselineBand.of_run(baseline_con, "base")
    finally:
        baseline_con.close()
    con = open_store(tmp_path / "watch.duckdb")
    now = [0.0]
    events = []
    try:
        watch_log(con, tmp_path / "live", events.append, WatchSettings(poll=1.0, idle_exit=3.0, run="live"),
                  clock=lambda: now[0], sleep=lambda seconds: now.__setitem__(0, now[0] + seconds), baseline=band)
    finally:
        con.close()
    schema = json_schema("watch")
    for event in events:
        schema_check.validate(event, schema)
    efficiency = [e for e in events if e["event"] == "alert" and e["kind"] == "efficiency"]
    assert [(e["stage"], e["direction"]) for e in efficiency] == [("gen", "slower")], efficiency
    assert efficiency[0]["step"] == 25 and efficiency[0]["share"] > 0.04
    assert not any(e["kind"] == "baseline" for e in events if e["event"] == "alert")


def test_real_ppo_with_a_critic_against_an_agent_loop_grpo_run_is_not_called_an_efficiency(tmp_path):
    from tests.conftest import need_real_data

    ppo = need_real_data("real", "verl03-ppo-gsm8k-raysubmit")
    grpo = need_real_data("real", "verl05dev-agentloop-opd-wandb")
    db = tmp_path / "real.duckdb"
    con = open_store(db)
    try:
        ingest_paths(con, [ppo], run_name="ppo", task="gsm8k")
        ingest_paths(con, [grpo], run_name="grpo", task="gsm8k")
        doc = explain_against(con, "grpo", "ppo").to_dict()
    finally:
        con.close()
    schema_check.validate(doc, json_schema("explain_against"))
    # verl03 times values and update_critic (a critic) and not ref; verl05 times ref and no critic stage.
    assert [d["kind"] for d in doc["comparable"]["differences"]] == ["algorithm", "gpus", "stages"]
    one_sided = {c["stage"]: c["cause"] for c in doc["causes"] if c["group"] == "stages"}
    assert one_sided == {"ref": "stage_only_in_b", "values": "stage_only_in_a", "update_critic": "stage_only_in_a"}
    assert not any(c["cause"] == "efficiency" and c["stage"] in one_sided for c in doc["causes"])
    assert {row["stage"] for row in doc["scaling"]["stages"]}.isdisjoint(one_sided)
    assert all(row["speedup"] is None or row["speedup"] > 0.5 for row in doc["scaling"]["stages"])
    assert not any("0.00×" in finding for finding in doc["findings"])
    result = runner.invoke(app, ["check", "grpo", "--baseline", "ppo", "--max-slowdown", "5%", "--json", "--db", str(db)])
    assert result.exit_code == 1
    verdict = json.loads(result.output)["baseline"]["verdict"]
    assert verdict["verdict"] == "inconclusive" and verdict["reasons"][0] == "ppo trains a critic and grpo does not"
