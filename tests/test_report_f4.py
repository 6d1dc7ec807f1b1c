"""F4 stacks the stages the stages analysis measures (weight sync included), validation and checkpoint where
the run's step time counts them, and only the rest as unexplained; numbers by hand on small console logs."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from polytrace_cli.analyze.common import ALL_STEPS
from polytrace_cli.cli import app
from polytrace_cli.report.figures import f04_stage_breakdown
from polytrace_cli.report.figures.base import Omitted
from polytrace_cli.store import open_store

runner = CliRunner()


def _log(path: Path, step_at_validation: float) -> None:
    """Six steps of gen 10 s, weight sync 3 s, update_actor 2 s and step 16 s (1 s unexplained); steps 3 and 6
    also validate for 5 s and take `step_at_validation` seconds."""
    lines = []
    for step in range(1, 7):
        validating = step in (3, 6)
        extra = " - timing_s/testing:5.0" if validating else ""
        seconds = step_at_validation if validating else 16.0
        lines.append(f"step:{step} - timing_s/gen:10.0 - timing_s/update_weights:3.0 - timing_s/update_actor:2.0"
                     f"{extra} - timing_s/step:{seconds} - response_length/mean:500 - response_length/max:900")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def frames(tmp_path_factory):
    """Run `inside`: the step timer counts validation (21 s = 16 + 5); run `outside`: it does not (16 s)."""
    folder = tmp_path_factory.mktemp("f4")
    db = folder / "store.duckdb"
    for run, seconds in (("inside", 21.0), ("outside", 16.0)):
        _log(folder / run / "train.log", seconds)
        result = runner.invoke(app, ["ingest", str(folder / run / "train.log"), "--run", run, "--db", str(db)])
        assert result.exit_code == 0, result.output
    con = open_store(db)
    try:
        run_ids = [row[0] for row in con.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()]
        yield f04_stage_breakdown.frames(con, run_ids, ALL_STEPS)
    finally:
        con.close()


def _stacked(frames, run: str, step: int) -> dict[str, float]:
    drawn = f04_stage_breakdown.drawn_stages(frames["stages"])
    part = drawn.filter((pl.col("run") == run) & (pl.col("step") == step))
    return dict(zip(part["stage"].to_list(), part["seconds"].to_list()))


def test_weight_sync_and_counted_validation_are_stages_not_unexplained(frames):
    assert _stacked(frames, "inside", 1) == pytest.approx(
        {"gen": 10.0, "update_weights": 3.0, "update_actor": 2.0, "unexplained": 1.0})
    assert _stacked(frames, "inside", 3) == pytest.approx(
        {"gen": 10.0, "update_weights": 3.0, "update_actor": 2.0, "testing": 5.0, "unexplained": 1.0})


def test_validation_outside_the_logged_step_total_is_added_back(frames):
    # The step time is the wall time: the validation the logged total leaves out is stacked onto it.
    assert _stacked(frames, "outside", 3) == pytest.approx(
        {"gen": 10.0, "update_weights": 3.0, "update_actor": 2.0, "testing": 5.0, "unexplained": 1.0})
    step = frames["stages"].filter((pl.col("run") == "outside") & (pl.col("step") == 3)).row(0, named=True)
    assert step["step_s"] == pytest.approx(21.0) and step["step_time_basis"] == "logged without overheads"


def test_the_stage_order_is_the_analysis_order(frames):
    drawn = f04_stage_breakdown.drawn_stages(frames["stages"])
    order = drawn.sort("order")["stage"].unique(maintain_order=True).to_list()
    assert order == ["gen", "update_actor", "update_weights", "testing", "unexplained"]
    figure = f04_stage_breakdown.render(frames)
    assert not isinstance(figure, Omitted)
    labels = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    assert labels == ["gen", "update_actor", "update_weights", "validation", "unexplained", "step time"]
