"""The parameters "what would help" proposes, chosen from the run's data, by hand on small inputs."""

from __future__ import annotations

import numpy as np

from polytrace_cli.simulate.advice import choose_rollout_share, overhead_interval, response_cap


def test_the_cap_cuts_the_longest_five_percent_and_never_goes_below_the_mean():
    lengths = [np.arange(1.0, 101.0), None, np.arange(101.0, 201.0)]
    choice = response_cap(lengths)
    # 200 responses 1..200: the 95 % quantile is 190.05 → 191, cutting 192..200's 9 and 191 itself not
    assert choice.policy == "max-response-len=191"
    assert choice.why == "cuts the longest 4.5% of the responses (above 191 tokens; mean 100)"
    # one very long response among equal ones: the quantile is the common length, the mean is above it
    skewed = [np.r_[np.full(99, 100.0), 10_000.0]]
    assert response_cap(skewed).policy == "max-response-len=199"
    # every response at the same length: nothing to cut
    assert response_cap([np.full(50, 512.0)]) is None and response_cap([None]) is None


def test_no_cap_on_a_collapsed_run_or_below_the_typical_length():
    # 8 steps collapsed to 1 token, 2 of about 1,000: the 95% quantile would cap at about 1,000, but read from
    # a collapsed run it would cut the responses the run should write.
    collapsed = [np.ones(50)] * 8 + [np.arange(1000.0, 1050.0)] * 2
    assert response_cap(collapsed) is not None and response_cap(collapsed, collapsed=True) is None
    # 3 steps of 10 responses of 1,000 tokens, 2 of 1,000 responses of 10: the pooled quantile is 10 and the
    # pooled mean 24.6, so the cap would be 25, below the typical step's mean response (the median, 1,000).
    few_long = [np.full(10, 1000.0)] * 3 + [np.full(1000, 10.0)] * 2
    assert response_cap(few_long) is None


def test_an_overhead_above_five_percent_is_spaced_out_to_about_two():
    steps = np.arange(1, 101)
    testing = np.where(steps % 10 == 0, 60.0, 0.0)            # 10 validations of 60 s
    choice = overhead_interval(steps, testing, wall_s=6000.0, name="validation", option="validate-every")
    # 600 / 6000 = 10 %: ⌈10 / 2⌉ = 5 times the logged interval of 10 → every 50, on steps 50 and 100
    assert choice.policy == "validate-every=50"
    assert choice.why == "validation every 10 steps takes 10.0% of the wall time; every 50 (2 times) about 2.0%"
    assert overhead_interval(steps, testing, wall_s=20_000.0, name="validation", option="validate-every") is None
    single = np.where(steps == 50, 600.0, 0.0)
    assert overhead_interval(steps, single, wall_s=6000.0, name="validation", option="validate-every") is None


def test_the_rollout_share_is_the_one_saving_most():
    assert choose_rollout_share({0.25: 10.0, 0.5: 30.0, 0.75: None}) == 0.5
    assert choose_rollout_share({0.25: None}) is None
