"""One store holding a verl, a TRL, a slime and a NeMo-RL run of one task: their stages side by side on the
canonical names, and what each stage holds in each framework (or that it has no counterpart there).

The verl and TRL logs are generated here with known numbers (verl's console line `step:N - key:value`,
TRL's Trainer dicts); the slime and NeMo-RL logs are the fixtures of their format tests (see
`test_ingest_slime.py`, `test_ingest_nemo_rl.py` for the source files and commits they follow).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from polytrace_cli.cli import app
from polytrace_cli.facade import Store

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def four_frameworks(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("frameworks")
    verl, trl = root / "verl.log", root / "trl.log"
    verl.write_text("".join(
        f"step:{s} - timing_s/gen:{100 + s} - timing_s/reward:5.0 - timing_s/old_log_prob:8.0 - timing_s/ref:7.0"
        f" - timing_s/adv:0.5 - timing_s/update_actor:40.0 - timing_s/update_weights:12.0"
        f" - timing_s/step:{172.5 + s} - response_length/mean:{600 + s}\n" for s in (1, 2, 3)))
    trl.write_text("GRPOConfig(output_dir='out', logging_steps=1, max_steps=3, disable_tqdm=True, report_to=[])\n"
                   + "".join(f"{{'loss': 0.01, 'reward': 0.5, 'completions/mean_length': {610 + s}.0, "
                             f"'num_tokens': {5000 * s}.0, 'step_time': {150 + s}.0, 'epoch': 0.{s}}}\n" for s in (1, 2, 3)))
    db = root / "store.duckdb"
    with Store.open(db) as store:
        for run, path in (("verl", verl), ("trl", trl), ("slime", FIXTURES / "slime" / "colocate.log"),
                          ("nemo", FIXTURES / "nemo_rl" / "grpo_math.log")):
            [report] = store.ingest([path], run=run, task="math")
            assert report.status == "ingested", report.message
    return db


def test_the_four_runs_share_the_canonical_stages(four_frameworks):
    with Store.open(four_frameworks, read_only=True) as store:
        runs = dict(store.runs().select("run", "framework").iter_rows())
        stages = store.analyze("stages", ["verl", "trl", "slime", "nemo"])
        meanings = store.stage_meanings(["verl", "trl", "slime", "nemo"])
    assert runs == {"verl": "verl", "trl": "trl", "slime": "slime", "nemo": "nemo_rl"}
    means = {(run, stage): round(mean, 3) for run, stage, mean in stages.select("run", "stage", "mean_s").iter_rows()}
    # Step time: verl (173.5, 174.5, 175.5), TRL (151, 152, 153), slime (164.3, 177.9, 221.9), NeMo-RL's three
    # training steps (45.12, 47.0, 46.4).
    assert {run: means[(run, "step")] for run in runs} == {"verl": 174.5, "trl": 152.0, "slime": 188.033,
                                                           "nemo": 46.173}
    assert means[("verl", "gen")] == 102.0 and means[("nemo", "gen")] == round((20.11 + 21.5 + 21.0) / 3, 3)
    assert means[("slime", "update_actor")] == round((41.3 + 43.0 + 44.1) / 3, 3)
    assert means[("nemo", "update_actor")] == round((10.02 + 10.1 + 10.0) / 3, 3)
    assert ("slime", "gen") not in means and ("trl", "gen") not in means
    holds = {stage: dict(zip(meanings.columns[1:], texts)) for stage, *texts in meanings.iter_rows()}
    assert holds["gen_s"]["slime"] == "no counterpart" and holds["gen_s"]["trl"] == "no counterpart"
    assert holds["gen_s"]["nemo"].startswith("timing/train/generation")
    assert holds["ref_s"]["nemo"] == "no counterpart" and "reference" in holds["old_log_prob_s"]["nemo"]
    assert holds["trainer_wait_s"]["slime"].startswith("perf/train_wait_time")
    assert holds["step_s"]["trl"].startswith("step_time")


def test_the_command_line_says_what_has_no_counterpart(four_frameworks):
    runner = CliRunner()
    result = runner.invoke(app, ["analyze", "verl", "trl", "slime", "nemo", "--only", "stages", "--wide",
                                 "--db", str(four_frameworks)], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert "what a stage holds in each run's framework" in result.output
    assert "perf/train_wait_time" in result.output and "timing/train/policy_training" in result.output
    compared = runner.invoke(app, ["compare", "verl", "slime", "--only", "stages", "--db", str(four_frameworks)],
                             env={"COLUMNS": "300"})
    assert compared.exit_code == 0, compared.output
    assert "no counterpart" in compared.output and "perf/train_wait_time" in compared.output


def test_explain_against_a_run_of_another_framework_says_what_its_stages_hold(tmp_path):
    verl, slime = tmp_path / "verl.log", tmp_path / "slime.log"
    verl.write_text("".join(
        f"step:{s} - timing_s/gen:{100 + s % 3} - timing_s/old_log_prob:8.0 - timing_s/update_actor:40.0"
        f" - timing_s/update_weights:12.0 - timing_s/step:{160 + s % 3} - response_length/mean:{600 + s}\n"
        for s in range(1, 11)))
    slime.write_text("".join(
        f"perf {r}: {{'perf/rollout_time': {90 + r % 2}.0, 'rollout/response_len/mean': {600 + r}.0}}\n"
        f"perf {r}: {{'perf/update_weights_time': 3.0, 'perf/train_wait_time': {95 + r % 2}.0, 'perf/log_probs_time': 9.0,"
        f" 'perf/actor_train_time': 41.0, 'perf/train_time': 50.0, 'perf/step_time': {145 + r % 2}.0}}\n"
        for r in range(1, 11)))
    db = tmp_path / "store.duckdb"
    runner = CliRunner()
    for run, path in (("verl", verl), ("slime", slime)):
        assert runner.invoke(app, ["ingest", str(path), "--run", run, "--task", "math", "--db", str(db)]).exit_code == 0
    result = runner.invoke(app, ["explain", "slime", "--against", "verl", "--db", str(db)], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "slime against verl" in result.output
    assert "what a stage holds in each run's framework" in result.output and "no counterpart" in result.output


def test_the_report_lists_runs_of_other_frameworks_with_their_stages_side_by_side(four_frameworks):
    from polytrace_cli.analyze.common import ALL_STEPS
    from polytrace_cli.report.comparison import markdown_lines, run_comparisons

    with Store.open(four_frameworks, read_only=True) as store:
        ids = store.run_ids(["verl", "trl", "slime", "nemo"])
        comparisons = run_comparisons(store.connection, ids, ALL_STEPS)
    by_pair = {(entry["a"], entry["b"]): entry for entry in comparisons}
    # Runs of one task but of other frameworks are not compared: listed with their reason, never with a
    # verdict, and with what each canonical stage holds in each framework beside its mean seconds.
    for entry in comparisons:
        assert entry["omitted"] and entry["verdict"] is None and entry["stages"]
    first = comparisons[0]["a"]
    slime = by_pair[(first, "slime")]["stages"]
    rows = {row["stage"]: row for row in slime}
    assert rows["trainer_wait"]["b_mean_s"] is not None and rows["trainer_wait"]["b_meaning"].startswith("perf/train_wait")
    if first == "verl":
        assert rows["gen"]["a_mean_s"] == 102.0 and rows["gen"]["b_mean_s"] is None
        assert rows["gen"]["b_meaning"] == "no counterpart"
    text = "\n".join(markdown_lines(comparisons))
    assert "across frameworks, the canonical stages: trainer_wait:" in text
