"""replay-check: pairing rules and error math on hand-made step metrics, and on verl console logs."""

from __future__ import annotations

import pytest

from polytrace_cli.workload.replay import STAGES, compare_runs, load_log, replay_check
from polytrace_cli.errors import PolytraceError
from polytrace_cli.ingest.sniffing import get_ingester

FORMAL = {"gen": 100.0, "reward": 20.0, "old_log_prob": 10.0, "ref": 8.0, "adv": 0.5, "update_actor": 40.0,
          "step": 180.0}
# Benchmark: gen 10% slow, reward 5% fast, the rest exact.
FACTORS = {"gen": 1.10, "reward": 0.95}


def _add_run(con, run_id: int, name: str) -> None:
    con.execute("INSERT INTO runs (run_id, name, framework) VALUES (?, ?, 'verl')", [run_id, name])


def _add_step(con, run_id: int, step: int, values: dict, segment: int = 0) -> None:
    con.executemany(
        "INSERT INTO step_metrics (run_id, segment, step, key, value, file_id) VALUES (?, ?, ?, ?, ?, 0)",
        [(run_id, segment, step, f"timing_s/{k}", v) for k, v in values.items()])


def _bench(step_scale: float = 1.0) -> dict:
    return {k: v * FACTORS.get(k, 1.0) * step_scale for k, v in FORMAL.items()}


def test_known_errors_give_known_accuracies(store):
    _add_run(store, 1, "bench")
    _add_run(store, 2, "formal")
    for step in (1, 2, 3):
        _add_step(store, 1, step, _bench())
        _add_step(store, 2, step, FORMAL)
    report = compare_runs(store, "bench", "formal")
    stages = {row["stage"]: row for row in report.per_stage.to_dicts()}
    assert list(stages) == list(STAGES)
    assert stages["gen"]["mean_error"] == pytest.approx(0.10)
    assert stages["gen"]["accuracy_pct"] == pytest.approx(90.0)
    assert stages["reward"]["mean_error"] == pytest.approx(-0.05)
    assert stages["reward"]["accuracy_pct"] == pytest.approx(95.0)
    assert stages["ref"]["accuracy_pct"] == pytest.approx(100.0)
    assert all(row["steps"] == 3 for row in stages.values())
    # (90 + 95 + 5 × 100) / 7
    assert report.accuracy_pct == pytest.approx(685 / 7)
    assert report.paired_steps == [1, 2, 3] and report.only_benchmark == report.only_formal == []


def test_signed_errors_average_and_missing_steps_are_listed(store):
    _add_run(store, 1, "bench")
    _add_run(store, 2, "formal")
    _add_step(store, 1, 1, {"gen": 110.0})
    _add_step(store, 1, 2, {"gen": 80.0})
    _add_step(store, 1, 9, {"gen": 1.0})       # only in the benchmark
    _add_step(store, 2, 1, {"gen": 100.0})
    _add_step(store, 2, 2, {"gen": 100.0})
    _add_step(store, 2, 4, {"gen": 100.0})     # only in the formal run
    report = compare_runs(store, "bench", "formal")
    gen = report.per_stage.row(0, named=True)
    assert gen["stage"] == "gen" and gen["steps"] == 2
    assert gen["mean_error"] == pytest.approx((0.10 - 0.20) / 2)
    assert gen["mean_abs_error"] == pytest.approx(0.15)
    assert gen["max_abs_error"] == pytest.approx(0.20)
    assert report.accuracy_pct == pytest.approx(85.0)
    assert (report.only_benchmark, report.only_formal) == ([9], [4])


def test_restart_uses_latest_segment_and_skips_validation_and_checkpoint_steps(store):
    _add_run(store, 1, "bench")
    _add_run(store, 2, "formal")
    # Formal: step 2 ran once in segment 0 (then crashed) and again after the restart in segment 1.
    _add_step(store, 2, 1, {"gen": 100.0, "step": 150.0})
    _add_step(store, 2, 2, {"gen": 999.0, "step": 999.0})
    _add_step(store, 2, 2, {"gen": 100.0, "step": 150.0}, segment=1)
    _add_step(store, 2, 3, {"gen": 100.0, "step": 300.0, "save_checkpoint": 140.0}, segment=1)
    # A later segment that only validated at step 3 (resume): validation-only rows are never paired.
    store.execute("INSERT INTO step_metrics VALUES (2, 2, 3, 'val-core/acc', 0.5, NULL, 0, NULL)")
    for step in (1, 2, 3):
        _add_step(store, 1, step, {"gen": 120.0, "step": 150.0})
    report = compare_runs(store, "bench", "formal")
    rows = {(r["step"], r["stage"]): r["error"] for r in report.per_step.to_dicts()}
    assert rows[(2, "gen")] == pytest.approx(0.2)          # segment 1, not the 999 of segment 0
    assert (3, "step") not in rows                          # checkpoint time inside the formal step
    assert rows[(3, "gen")] == pytest.approx(0.2)
    assert report.segments == {"bench": 1, "formal": 3}


def test_runs_without_timings_are_a_clear_error(store):
    _add_run(store, 1, "bench")
    _add_run(store, 2, "formal")
    _add_step(store, 2, 1, {"gen": 1.0})
    with pytest.raises(PolytraceError, match="run bench has no stage timings"):
        compare_runs(store, "bench", "formal")
    with pytest.raises(PolytraceError, match="no such log file"):
        load_log(store, "/nonexistent/log.txt", "formal")


def _console_line(step: int, values: dict) -> str:
    return f"step:{step} - " + " - ".join(f"timing_s/{k}:{v:.3f}" for k, v in values.items())


def _needs_verl_console():
    if get_ingester("verl-console") is None:
        pytest.skip("verl console ingester not available")


def test_console_logs_end_to_end(store, tmp_path):
    _needs_verl_console()
    formal = tmp_path / "formal" / "train.log"
    bench = tmp_path / "bench" / "train.log"
    formal.parent.mkdir()
    bench.parent.mkdir()
    formal.write_text("\n".join(_console_line(s, FORMAL) for s in range(1, 6)) + "\n")
    bench.write_text("starting replay\n" + "\n".join(_console_line(s, _bench()) for s in range(1, 5)) + "\n")
    report = replay_check(store, bench, formal)
    stages = {row["stage"]: row["accuracy_pct"] for row in report.per_stage.to_dicts()}
    assert stages["gen"] == pytest.approx(90.0, abs=1e-6)
    assert stages["reward"] == pytest.approx(95.0, abs=1e-6)
    assert stages["update_actor"] == pytest.approx(100.0)
    assert report.only_formal == [5]
    # Checking again reuses the same runs instead of adding new ones.
    replay_check(store, bench, formal)
    assert store.execute("SELECT count(*) FROM runs").fetchall()[0][0] == 2


def test_console_log_with_restart_validation_and_ray_prefix(store, tmp_path):
    _needs_verl_console()
    prefix = "\x1b[36m(TaskRunner pid=14640)\x1b[0m "
    formal = tmp_path / "formal" / "output.log"
    bench = tmp_path / "bench" / "output.log"
    formal.parent.mkdir()
    bench.parent.mkdir()
    first_try = {**FORMAL, "gen": 500.0}
    formal.write_text("\n".join([
        prefix + "step:0 - val-core/openai/gsm8k/reward/mean@1:0.250",
        prefix + _console_line(1, FORMAL),
        prefix + _console_line(2, first_try),          # the step the job crashed in
        "Traceback (most recent call last):",
        prefix + _console_line(2, FORMAL),             # restart: step goes backwards, new segment
        prefix + _console_line(3, FORMAL),
    ]) + "\n")
    bench.write_text("\n".join(_console_line(s, _bench()) for s in (1, 2, 3)) + "\n")
    report = replay_check(store, bench, formal)
    gen = {r["step"]: r["error"] for r in report.per_step.to_dicts() if r["stage"] == "gen"}
    assert gen == pytest.approx({1: 0.10, 2: 0.10, 3: 0.10})  # step 2 from the re-run, not the 500 s try
    assert report.paired_steps == [1, 2, 3] and report.only_formal == []
    assert max(report.segments.values()) == 2
