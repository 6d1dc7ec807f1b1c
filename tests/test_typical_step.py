"""Where a run's typical step goes, in one sentence, computed by hand on a small console log."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from polytrace_cli.analyze.typical_step import cadence, typical_steps
from polytrace_cli.cli import app
from polytrace_cli.store import open_store

runner = CliRunner()


def _console_log(path: Path, step_seconds: list[float], testing: dict[int, float]) -> None:
    lines = []
    for step, seconds in enumerate(step_seconds, 1):
        extra = f" - timing_s/testing:{testing[step]}" if step in testing else ""
        lines.append(f"(TaskRunner pid=1) step:{step} - timing_s/gen:{seconds / 2} - timing_s/update_actor:2.0"
                     f"{extra} - timing_s/step:{seconds} - response_length/mean:500 - response_length/max:900")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def test_typical_step_by_hand(tmp_path):
    # Steps 3 and 6 validate (10 s each): the plain steps 1, 2, 4, 5 take 20, 20, 24, 20 s, so the median is
    # 20 s; gen is half of each step, Σ gen / Σ step = 42 / 84 = 50%; update_actor 4 × 2 / 84 = 9.5%; the
    # timers leave 40.5% untimed.
    _console_log(tmp_path / "logs" / "train.log", [20.0, 20.0, 40.0, 24.0, 20.0, 40.0], {3: 10.0, 6: 10.0})
    db = tmp_path / "store.duckdb"
    assert runner.invoke(app, ["ingest", str(tmp_path / "logs"), "--run", "r", "--db", str(db)]).exit_code == 0
    con = open_store(db)
    try:
        typical = typical_steps(con, [1])["r"]
    finally:
        con.close()
    assert typical["step_s"] == 20.0 and typical["steps"] == 4
    assert typical["stages"] == [["gen", pytest.approx(0.5)], ["update_actor", pytest.approx(8 / 84)]]
    assert typical["unaccounted"] == pytest.approx(1 - 0.5 - 8 / 84)
    assert typical["overheads"] == [["validation", "at 2 steps", 10.0]]
    assert typical["text"] == ("Typical step 20 s (median of 4): gen 50%, update_actor 10%, untimed 40%; "
                               "validation at 2 steps +10 s")


def test_cadence_words():
    assert cadence([10, 20, 30]) == "every 10 steps"
    assert cadence([10, 20, 30, 40, 45]) == "mostly every 10 steps (5 steps)"
    assert cadence([3, 6]) == "at 2 steps"
