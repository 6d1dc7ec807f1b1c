"""AReaL's console log: the stats table per step drawn by tabulate.

`fixtures/areal/console.log` is written by `fixtures/areal/write_console.py` with the real `tabulate`
(0.9.0) in the layout of AReaL's `areal/utils/printing.py` `tabulate_stats` and the lines of
`areal/utils/stats_logger.py` `StatsLogger.commit`, at inclusionAI/AReaL commit
4aef98d8d818af55b43621aaadba047ae10f4e77; the keys follow `areal/trainer/rl_trainer.py`
(`stats_tracker.record_timing(...)` -> `timeperf/<name>`) and `areal/trainer/ppo/actor.py` (scope
`ppo_actor`, `<name>/avg`).
"""

from __future__ import annotations

from pathlib import Path

from polytrace_cli.ingest.driver import ingest_paths

FIXTURES = Path(__file__).parent / "fixtures" / "areal"


def _steps(con, run: str) -> list[tuple]:
    return con.execute(
        "SELECT segment, step, trainer_wait_s, old_log_prob_s, ref_s, update_actor_s, update_weights_s,"
        " prompt_length_mean, clip_ratio FROM steps JOIN runs USING (run_id) WHERE name = ? ORDER BY 1, 2",
        [run]).fetchall()


def test_the_stats_tables_give_the_trackers_steps(store):
    [report] = ingest_paths(store, [FIXTURES / "console.log"], run_name="areal")
    assert report.format == "areal-console"
    assert (report.lines, report.stored, report.ignored, report.rejected) == (18, 4, 14, 0)
    assert dict(store.execute("SELECT rule, lines FROM ignored_lines").fetchall()) == {
        "other": 3, "stats line": 2, "step line": 2, "table border": 6, "warning": 1}
    # `Train step 1` is global step 0, the step W&B and TensorBoard are given.
    assert _steps(store, "areal") == [(0, 0, 41.25, 6.5, 6.125, 20.0, 3.5, 200.0, 0.0625),
                                      (0, 1, 5.5, None, None, 21.0, 3.25, None, None)]
    assert store.execute("SELECT value FROM step_metrics WHERE key = 'ppo_actor/seq_len/avg' ORDER BY step"
                         ).fetchall() == [(812.5,), (840.0,)]
    assert store.execute("SELECT framework, meta FROM runs").fetchone() == (
        "areal", '{"framework": "areal", "value_significant_digits": 5}')


def test_several_dicts_a_commit_a_bad_row_and_a_restart(store, tmp_path):
    text = (FIXTURES / "console.log").read_text()
    lines = text.splitlines()
    step_line, stats_line, empty_message = lines[1:4]
    table = lines[4:11]
    # One commit of two dicts: the second is logged at the next step. A row with a value that is not a
    # number is rejected alone. Then the job starts again at its first step.
    bad = [row.replace("6.1250e+00", "n/a       ") for row in table]
    two = [step_line, stats_line.replace("(1/1)", "(1/2)"), empty_message, *table,
           stats_line.replace("(1/1)", "(2/2)"), empty_message, *bad]
    log = tmp_path / "train.log"
    log.write_text("\n".join(two) + "\n" + text)
    [report] = ingest_paths(store, [log], run_name="again")
    assert report.rejected == 1
    [(reason,)] = store.execute("SELECT reason FROM ingest_errors").fetchall()
    assert reason == "AReaL stats table row holds a value that is not a number: 'n/a'"
    assert [row[:4] for row in _steps(store, "again")] == [(0, 0, 41.25, 6.5), (0, 1, 41.25, 6.5), (1, 0, 41.25, 6.5),
                                                          (1, 1, 5.5, None)]
    assert store.execute("SELECT segment, step, flag FROM step_flags").fetchall() == [(1, 0, "restart")]
