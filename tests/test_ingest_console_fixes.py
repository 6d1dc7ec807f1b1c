"""Real console logs read right: repeated steps, old and new stage keys, validation keys, run meta
from the printed config, and text hygiene. Each case has a small fixture with hand-known truth."""

from __future__ import annotations

import json
from pathlib import Path

from polytrace_cli.ingest.runner import ingest_paths

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


def test_verl_01_timing_keys_feed_the_stages_without_inventing_a_step_time(store):
    from polytrace_cli.analyze import stages

    [report] = _ingest(store, FIXTURES.parent / "console_v01" / "train.log")
    rows = store.execute("SELECT step, gen_s, ref_s, values_s, adv_s, update_critic_s, update_actor_s, step_s"
                         " FROM steps ORDER BY step").fetchall()
    assert rows == [(1, 30.0, 2.0, 3.0, 0.5, 6.0, 8.0, None), (2, 34.0, 2.0, 3.0, 0.5, 6.0, 10.0, None),
                    (3, 38.0, 2.0, 3.0, 0.5, 6.0, 12.0, None)]
    stats = {row["stage"]: row for row in stages.stage_stats(store, [1]).to_dicts()}
    assert stats["gen"]["mean_s"] == 34.0 and stats["update_actor"]["mean_s"] == 10.0
    # No step total in the log: none is made up, and the run says so.
    assert "step" not in stats
    assert _meta(store)["step_time_logged"] is False
    assert any("step time is not logged" in note for note in report.notes), report.notes
