"""Real console logs read right: repeated steps, old and new stage keys, validation keys, run meta
from the printed config, and text hygiene. Each case has a small fixture with hand-known truth."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from polytrace_cli.ingest.driver import ingest_paths

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "verl" / "console_fixes"


def _ingest(store, path: Path):
    reports = ingest_paths(store, [path])
    assert [r.status for r in reports] == ["ingested"] * len(reports), [r.message for r in reports]
    return reports


def _meta(store) -> dict:
    return json.loads(store.execute("SELECT meta FROM runs").fetchall()[0][0])


def test_a_step_printed_twice_with_other_keys_is_one_step(store):
    [report] = _ingest(store, FIXTURES / "repeated_step.log")
    assert (report.lines, report.stored, report.ignored, report.rejected) == (6, 6, 0, 0)
    rows = store.execute(
        "SELECT segment, step, gen_s, step_s, is_validation_only FROM steps ORDER BY segment, step").fetchall()
    # Step 1: validation line then training line, one step. Step 2: training then validation, one
    # step. Step 3 printed again with the same keys: a restarted job, a second segment.
    assert rows == [(0, 1, 10.0, 20.0, False), (0, 2, 11.0, 21.0, False), (0, 3, 12.0, 22.0, False),
                    (1, 3, 12.5, 22.5, False)]
    flags = store.execute("SELECT segment, step, flag, line_no FROM step_flags ORDER BY line_no").fetchall()
    assert flags == [(1, 3, "restart", 6)]


STEPS_COLUMNS_BEFORE = [
    "run_id", "segment", "step", "gen_s", "reward_s", "old_log_prob_s", "ref_s", "values_s", "adv_s",
    "update_actor_s", "update_critic_s", "testing_s", "save_checkpoint_s", "step_s", "response_length_mean",
    "response_length_max", "response_length_min", "prompt_length_mean", "prompt_length_max", "prompt_length_min",
    "clip_ratio", "total_tokens", "throughput", "is_validation_only", "has_testing", "has_checkpoint",
    "truncated_line", "flags",
]


def test_steps_view_keeps_every_column_and_maps_aliases(store):
    columns = [row[0] for row in store.execute("DESCRIBE steps").fetchall()]
    assert [c for c in columns if c in STEPS_COLUMNS_BEFORE] == STEPS_COLUMNS_BEFORE
    # Every view column ending in _s is fed by at least one alias.
    canonical = {row[0] for row in store.execute("SELECT DISTINCT canonical FROM metric_aliases").fetchall()}
    assert {c for c in columns if c.endswith("_s")} <= canonical
    store.execute("INSERT INTO runs (run_id, name) VALUES (nextval('run_id_seq'), 'r')")
    run_id = store.execute("SELECT run_id FROM runs").fetchall()[0][0]
    store.execute(
        "INSERT INTO step_metrics (run_id, segment, step, key, value, text_value, file_id, line_no) VALUES"
        " (?, 0, 1, 'timing_s/gen', 3.0, NULL, 0, 1), (?, 0, 1, 'timing/generation', 4.0, NULL, 0, 2),"
        " (?, 0, 1, 'response_length/max', 100, NULL, 0, 1), (?, 0, 2, 'actor/loss', 0.5, NULL, 0, 3)",
        [run_id] * 4)
    store.execute("INSERT INTO step_flags (run_id, segment, step, flag, detail, file_id, line_no)"
                  " VALUES (?, 0, 1, 'truncated_line', '', 0, 1)", [run_id])
    rows = store.execute("SELECT step, gen_s, response_length_max, step_s, truncated_line, flags FROM steps"
                         " ORDER BY step").fetchall()
    # Two keys feeding one column: the larger value, as before.
    assert rows == [(1, 4.0, 100.0, None, True, ["truncated_line"]), (2, None, None, None, False, [])]


def test_test_score_keys_mark_validation(store, tmp_path):
    log = tmp_path / "train.log"
    log.write_text("step:1 - actor/loss:0.1 - timing_s/step:2.0\n"
                   "step:2 - test_score/openai/gsm8k:0.5 - val-core/acc:0.4\n"
                   "step:3 - test_score/openai/gsm8k:0.6\n"
                   "step:4 - actor/loss:0.2 - test_score/openai/gsm8k:0.7\n")
    _ingest(store, log)
    rows = store.execute("SELECT step, is_validation_only FROM steps ORDER BY step").fetchall()
    assert rows == [(1, False), (2, True), (3, True), (4, False)]


def test_verl_01_timing_keys_feed_the_stages_and_the_step_time_is_derived_from_them(store):
    from polytrace_cli.analyze import stages

    [report] = _ingest(store, FIXTURES.parent / "console_v01" / "train.log")
    rows = store.execute("SELECT step, gen_s, ref_s, values_s, adv_s, update_critic_s, update_actor_s, step_s"
                         " FROM steps ORDER BY step").fetchall()
    assert rows == [(1, 30.0, 2.0, 3.0, 0.5, 6.0, 8.0, None), (2, 34.0, 2.0, 3.0, 0.5, 6.0, 10.0, None),
                    (3, 38.0, 2.0, 3.0, 0.5, 6.0, 12.0, None)]
    stats = {row["stage"]: row for row in stages.stage_stats(store, [1]).to_dicts()}
    assert stats["gen"]["mean_s"] == 34.0 and stats["update_actor"]["mean_s"] == 10.0
    # No step total in the log: the step time is the sum of the timers, labelled so in every view.
    assert stats["step"]["mean_s"] == pytest.approx((49.5 + 55.5 + 61.5) / 3)
    assert _meta(store)["step_time_logged"] is False
    assert any("derived from stage timers" in note for note in report.notes), report.notes


def test_step_time_inclusion_is_decided_from_the_numbers(store):
    """verl 0.8: the step time leaves testing out (290 s) and counts the checkpoint (30 s); every
    step has 1.5 s beyond its stages, weight sync (12 s) included as a stage of its own."""
    from polytrace_cli.analyze import stages

    _ingest(store, FIXTURES.parent / "console_v08" / "train.log")
    meta = _meta(store)
    assert (meta["step_time_includes_testing"], meta["step_time_includes_checkpoint"]) == (False, True)
    assert store.execute("SELECT DISTINCT update_weights_s FROM steps").fetchall() == [(12.0,)]
    detail = stages.per_step(store, [1])
    assert detail["unexplained_s"].to_list() == [1.5] * 10
    # step 5's testing (290 s) is outside timing_s/step (179 s): the step time adds it back and counts it
    assert detail.filter(pl.col("step") == 5)["stage_sum_s"].to_list() == [105.0 + 72.5 + 290.0]
    assert detail.filter(pl.col("step") == 5)["step_s"].to_list() == [179.0 + 290.0]
    assert detail.filter(pl.col("step") == 4)["stage_sum_s"].to_list() == [104.0 + 72.5 + 30.0]
    stats = {row["stage"]: row for row in stages.stage_stats(store, [1]).to_dicts()}
    assert stats["update_weights"]["mean_s"] == 12.0
    summary = stages.summary(store, [1]).row(0, named=True)
    assert summary["mean_unexplained_s"] == 1.5
    assert (summary["step_includes_testing"], summary["step_includes_checkpoint"]) == (False, True)


def test_step_time_inclusion_that_cannot_be_told_gives_no_unexplained_time(store):
    from polytrace_cli.analyze import stages

    store.execute("INSERT INTO runs (run_id, name) VALUES (1, 'x')")
    # Steps 1-2 have 2 s beyond their stages. Step 3's testing seems counted, step 4's does not:
    # the votes split, so the run cannot tell, and steps 3-4 get no unexplained time.
    for step, (total, testing) in enumerate([(12, None), (12, None), (42, 30), (14, 30)], start=1):
        values = {"timing_s/step": total, "timing_s/gen": 10}
        if testing:
            values["timing_s/testing"] = testing
        for key, value in values.items():
            store.execute("INSERT INTO step_metrics (run_id, segment, step, key, value, file_id) VALUES (1, 0, ?, ?, ?, 1)",
                          [step, key, value])
    inclusion = stages.step_time_inclusion(store, [1]).row(0)
    assert inclusion == ("x", None, None)
    assert stages.per_step(store, [1])["unexplained_s"].to_list() == [2.0, 2.0, None, None]


def test_timers_beyond_the_step_give_no_negative_unexplained_time(store):
    from polytrace_cli.analyze import stages

    store.execute("INSERT INTO runs (run_id, name) VALUES (1, 'x')")
    for step, (total, gen) in enumerate([(12, 10), (10, 10.005), (10, 15)], start=1):
        for key, value in {"timing_s/step": total, "timing_s/gen": gen}.items():
            store.execute("INSERT INTO step_metrics (run_id, segment, step, key, value, file_id) VALUES (1, 0, ?, ?, ?, 1)",
                          [step, key, value])
    detail = stages.per_step(store, [1])
    assert detail["unexplained_s"].to_list() == [2.0, 0.0, None]
    assert detail["timers_exceed_step"].to_list() == [False, False, True]


def test_run_meta_from_the_printed_config_never_a_shell_variable(store):
    _ingest(store, FIXTURES.parent / "console_config" / "train.log")
    meta = _meta(store)
    assert meta["model"] == "/models/Qwen2.5-7B-Instruct"
    assert meta["adv_estimator"] == "grpo"
    assert meta["project_name"] == "verl_grpo_example_gsm8k"
    assert meta["experiment_name"] == "qwen2_7b_grpo_gsm8k_long"
    assert meta["max_response_len"] == 2048
    assert not any("$" in str(value) for value in meta.values()), meta


def test_shell_variables_are_never_stored_without_a_config(store, tmp_path):
    log = tmp_path / "train.log"
    log.write_text("python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=$MODEL_PATH"
                   " algorithm.adv_estimator=${ADV} trainer.n_gpus_per_node=8\n"
                   "step:1 - actor/loss:0.100\n")
    _ingest(store, log)
    meta = _meta(store)
    assert "model" not in meta and "adv_estimator" not in meta
    assert meta["n_gpus_per_node"] == 8


# --- text hygiene: one bad line is one bad line, never a binary file ------------------------

def _console_report(store, path: Path):
    [report] = ingest_paths(store, [path])
    assert (report.status, report.format) == ("ingested", "verl-console"), report.message
    return report


def test_nul_bytes_make_bad_lines_not_a_binary_file(store, tmp_path):
    from polytrace_cli.ingest.registry import is_binary

    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    # A NUL in a value of a metric line (the rest parses: stored, that value as text), a line of NULs (a crash that
    # left zero-filled blocks: rejected), and a final NUL block without newline.
    log.write_bytes(b"step:1 - a:1.0\nstep:2 - a:2.0\nstep:3 - a:3.0\n\x00\x00\x00\x00\nstep:4 - a:4.0 - note:o\x00k\n"
                    b"step:5 - a:5.0\nstep:6 - a:6.0\n\x00\x00")
    assert not is_binary(log.read_bytes())
    report = _console_report(store, log)
    assert (report.lines, report.stored, report.ignored, report.rejected) == (8, 6, 0, 2)
    assert store.execute("SELECT step, value FROM step_metrics WHERE key = 'a' ORDER BY step").fetchall() == [
        (step, float(step)) for step in range(1, 7)]
    assert store.execute("SELECT value, text_value FROM step_metrics WHERE key = 'note'").fetchall() == [
        (None, "o\ufffdk")]
    assert store.execute("SELECT line_no, reason FROM ingest_errors ORDER BY line_no").fetchall() == [
        (4, "line holds NUL bytes and no text"), (8, "line holds NUL bytes and no text")]


def test_bad_utf8_makes_one_bad_line(store, tmp_path):
    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    log.write_bytes(b"step:1 - a:1.0\nloading \xff\xfe shard\nstep:2 - a:2.0\n")
    report = _console_report(store, log)
    assert (report.lines, report.stored, report.ignored, report.rejected) == (3, 2, 0, 1)
    assert store.execute("SELECT line_no, reason FROM ingest_errors").fetchall() == [
        (2, "line holds bytes that are not UTF-8")]


def test_bom_and_cr_only_line_endings_lose_nothing(store, tmp_path):
    bom = tmp_path / "a" / "train.log"
    bom.parent.mkdir()
    bom.write_bytes(b"\xef\xbb\xbfstep:1 - a:1.0\nstep:2 - a:2.0\n")
    report = _console_report(store, bom)
    assert (report.lines, report.stored) == (2, 2)
    bom_and_bad = tmp_path / "b" / "train.log"
    bom_and_bad.parent.mkdir()
    bom_and_bad.write_bytes(b"\xef\xbb\xbfstep:1 - a:1.0\nx \xff\nstep:2 - a:2.0\n")
    report = _console_report(store, bom_and_bad)
    assert (report.lines, report.stored, report.rejected) == (3, 2, 1)
    cr_only = tmp_path / "c" / "train.log"
    cr_only.parent.mkdir()
    cr_only.write_bytes(b"Loading\rstep:1 - a:1.0\rstep:2 - a:2.0\rstep:3 - a:3.0\r")
    report = _console_report(store, cr_only)
    assert (report.lines, report.stored, report.ignored, report.rejected) == (4, 3, 1, 0)
    runs = dict(store.execute("SELECT r.name, count(DISTINCT sm.step) FROM step_metrics sm JOIN runs r USING (run_id)"
                              " GROUP BY r.name").fetchall())
    assert runs == {"a": 2, "b": 2, "c": 3}
