"""Each policy against a pair of logs the generator writes from one known model, identical except for
the policy (same workload draws, same noise): the prediction made from the first log must lie within
5 % of the difference in wall time the pair shows."""

from __future__ import annotations

import dataclasses

import polars as pl
import pytest

from polytrace_cli.ingest.runner import ingest_paths
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
