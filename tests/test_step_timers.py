"""Whether a run's step time counts its testing and checkpoint timers: the store's decision follows
the rule its docstring states, checked against that rule written out here step by step."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polytrace_cli.semantics.step_timers import INCLUSION_AGREEMENT, step_time_inclusion


def quantile(ordered: list[float], q: float) -> float:
    """Linear interpolation between the order statistics around q × (n − 1)."""
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def rule(steps: list[tuple[float, float, float, float]]) -> dict:
    """The decision for (step_s, stage seconds, testing_s, save_checkpoint_s) per step (0: not logged)."""
    residuals = [(total - stage, testing, save) for total, stage, testing, save in steps]
    baseline = sorted(r for r, testing, save in residuals if testing <= 0 and save <= 0)
    centre = quantile(baseline, 0.5) if baseline else 0.0
    spread = quantile(baseline, 0.75) - quantile(baseline, 0.25) if baseline else 0.0
    decided = {}
    for key, index, other in (("step_time_includes_testing", 1, 2), ("step_time_includes_checkpoint", 2, 1)):
        with_timer = [row for row in residuals if row[index] > 0]
        alone = [row for row in with_timer if row[other] <= 0] or with_timer
        votes = [row[0] > centre + row[index] / 2 for row in alone if row[index] > 2 * spread]
        share = sum(votes) / len(votes) if votes else None
        decided[key] = (None if share is None else True if share >= INCLUSION_AGREEMENT
                        else False if share <= 1 - INCLUSION_AGREEMENT else None)
    return decided


RUN_IDS = itertools.count(1)


def store_steps(con, steps) -> int:
    """A new run holding the steps; its id."""
    run_id = next(RUN_IDS)
    con.execute("INSERT INTO runs (run_id, name) VALUES (?, ?)", [run_id, f"run {run_id}"])
    con.execute("INSERT INTO files (file_id, run_id, path, sha256, bytes, format, parser_version, lines, stored,"
                " ignored, rejected, rows, seconds) VALUES (?, ?, ?, '', 0, 'verl-console', '1', 0, 0, 0, 0, 0, 0)",
                [run_id, run_id, f"run{run_id}.log"])
    rows = []
    for step, (total, stage, testing, save) in enumerate(steps):
        for key, value in (("timing_s/step", total), ("timing_s/gen", stage), ("timing_s/testing", testing),
                           ("timing_s/save_checkpoint", save)):
            if value > 0:
                rows.append((run_id, step, key, value, run_id))
    con.executemany("INSERT INTO step_metrics (run_id, segment, step, key, value, file_id) VALUES (?, 0, ?, ?, ?, ?)",
                    rows)
    return run_id


# Halves: every interpolation and comparison of the rule is exact in binary floating point.
seconds = st.integers(0, 400).map(lambda n: n / 2)
step = st.tuples(st.integers(20, 400).map(lambda n: n / 2), st.integers(2, 20).map(lambda n: n / 2),
                 st.one_of(st.just(0.0), seconds), st.one_of(st.just(0.0), st.just(0.0), seconds))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(step, min_size=1, max_size=40))
def test_the_decision_is_the_rule(store, steps):
    assert step_time_inclusion(store, store_steps(store, steps)) == rule(steps)


def test_testing_counted_in_the_step_time_is_told_and_a_checkpoint_left_out_too(store):
    # Every step: 2 s beyond its 10 s of stages. Steps 3, 6, 9 test for 30 s inside the step time;
    # steps 4 and 8 save a checkpoint for 20 s outside it.
    steps = [(12.0, 10.0, 0.0, 0.0)] * 10
    for index in (3, 6, 9):
        steps[index] = (42.0, 10.0, 30.0, 0.0)
    for index in (4, 8):
        steps[index] = (12.0, 10.0, 0.0, 20.0)
    assert step_time_inclusion(store, store_steps(store, steps)) == {"step_time_includes_testing": True,
                                             "step_time_includes_checkpoint": False}
