"""Each policy against a pair of logs the generator writes from one known model, identical except for
the policy (same workload draws, same noise): the prediction made from the first log must lie within
5 % of the difference in wall time the pair shows."""

from __future__ import annotations

import dataclasses

import numpy as np

import polars as pl
import pytest

from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.simulate import whatif_run
from polytrace_cli.workload.presets import preset
from polytrace_cli.workload.steplog import StepTimeModel, write_step_log
from polytrace_cli.workload.synth import with_overrides

WITHIN = 0.05


def _pair(store, tmp_path, before: StepTimeModel, after: StepTimeModel, *, steps: int = 120, cap: int = 8192,
          batch: int = 16, ranks: int = 4) -> float:
    """Write both logs, ingest the first as run `before`, and return Σ wall(before) − Σ wall(after)."""
    lengths, base = preset("math")
    spec = with_overrides(base, steps=steps, batch=batch, n=8, dp_ranks=ranks, max_response_len=cap, drift=0.0,
                          seed=21)
    walls = []
    for name, truth in (("before", before), ("after", after)):
        written = write_step_log(lengths, spec, truth, tmp_path / name)
        frame = written.frame
        overheads = (frame["testing_s"].fill_null(0) + frame["save_checkpoint_s"].fill_null(0)).sum()
        walls.append(float(frame["step_s"].sum()) + (0.0 if truth.step_includes_overheads else float(overheads)))
        if name == "before":
            assert [r.status for r in ingest_paths(store, written.files, run_name=name)] == ["ingested"]
    return walls[0] - walls[1]


def _saving(store, policy: str) -> float:
    scenario = whatif_run(store, "before", [policy]).scenarios[0]
    assert scenario.saving_s is not None, scenario.note
    return scenario.saving_s


def test_no_validation_pair(store, tmp_path):
    before = StepTimeModel(validate_every=10, validate_before_train=False)
    truth = _pair(store, tmp_path, before, dataclasses.replace(before, validate_every=None))
    assert truth > 0
    assert _saving(store, "no-validation") == pytest.approx(truth, rel=WITHIN)


def test_validate_every_pair(store, tmp_path):
    before = StepTimeModel(validate_every=10, validate_before_train=False, step_includes_overheads=False)
    truth = _pair(store, tmp_path, before, dataclasses.replace(before, validate_every=30))
    assert truth > 0
    assert _saving(store, "validate-every=30") == pytest.approx(truth, rel=WITHIN)


@pytest.mark.parametrize(("dispatch", "batch"), [("contiguous", 32), ("balanced", 8)])
def test_balance_pair(store, tmp_path, dispatch, batch):
    # "balanced": verl's balance_batch ran and the ranks were still unequal after it (8 responses a rank)
    before = StepTimeModel(rank_dispatch=dispatch, noise_sigma=0.02)
    truth = _pair(store, tmp_path, before, dataclasses.replace(before, rank_dispatch="even"), ranks=8, batch=batch,
                  cap=32768)
    assert truth > 0
    assert _saving(store, "balance") == pytest.approx(truth, rel=WITHIN)


def test_max_response_len_pair(store, tmp_path):
    # the pair differs by the cut alone: the same responses, those above 3000 tokens cut there
    before = StepTimeModel(noise_sigma=0.02)
    truth = _pair(store, tmp_path, before, dataclasses.replace(before, truncate_responses_at=3000), cap=32768)
    assert truth > 0
    assert _saving(store, "max-response-len=3000") == pytest.approx(truth, rel=WITHIN)


def test_one_step_off_takes_a_measured_training_scale_and_drops_the_colocation_switch(store, tmp_path):
    from polytrace_cli.simulate.policies import pipelined_wall, split_generation

    # by hand: 3 steps, generation 10/12/8 s of which 2 s switch, 60 % tail; on a quarter of the GPUs
    fixed, tail, volume = 2.0, [4.8, 6.0, 3.6], [3.2, 4.0, 2.4]
    gen = split_generation(np.full(3, fixed), np.array(tail), np.array(volume), np.full(3, 2.0), 0.25)
    assert gen == pytest.approx([4.8 + 12.8, 6.0 + 16.0, 3.6 + 9.6])
    assert pipelined_wall(gen, np.array([20.0, 20.0, 20.0])) == pytest.approx(17.6 + 22.0 + 20.0 + 20.0)
    # on a generated run: giving the default scale explicitly changes nothing; a measured 1.0 (training no
    # slower on fewer GPUs) can only make the pipeline faster, and the note says which scale was used
    truth = StepTimeModel(noise_sigma=0.02)
    _pair(store, tmp_path, truth, truth, cap=32768, batch=32, ranks=8)
    default = whatif_run(store, "before", ["one-step-off=0.25"]).scenarios[0]
    explicit = whatif_run(store, "before", ["one-step-off=0.25"], training_scale=1 / 0.75).scenarios[0]
    measured = whatif_run(store, "before", ["one-step-off=0.25"], training_scale=1.0).scenarios[0]
    assert explicit.saving_s == pytest.approx(default.saving_s)
    assert measured.saving_s >= default.saving_s
    assert "assumed, not measured" in default.note and "as measured and given" in measured.note
    assert "generate_sequences is not logged" in default.note


def test_the_colocation_switch_is_read_per_step_from_generate_sequences(store, tmp_path, db_path):
    # gen = 30 s of which generate_sequences 20 s (10 s switch) on every step
    from typer.testing import CliRunner

    from polytrace_cli.cli import app
    from polytrace_cli.model import read_workload

    lines = [f"step:{s} - timing_s/gen:30 - timing_s/generate_sequences:20 - timing_s/update_actor:10 - "
             f"timing_s/step:45" for s in range(1, 9)]
    (tmp_path / "train.log").write_text("\n".join(lines) + "\n")
    assert [r.status for r in ingest_paths(store, [tmp_path / "train.log"], run_name="gs")] == ["ingested"]
    frame = read_workload(store, "gs")
    assert (frame["gen_s"] - frame["generate_sequences_s"]).to_list() == [10.0] * 8
    store.close()
    result = CliRunner().invoke(app, ["whatif", "gs", "--policy", "balance", "--training-scale", "1.2",
                                      "--db", str(db_path)])
    assert result.exit_code == 2 and "--training-scale goes with --policy one-step-off" in result.stderr
