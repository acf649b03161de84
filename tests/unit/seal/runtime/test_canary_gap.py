"""The weight-sync canary's comparison (issue 46 item 5): a replica's NaN never passes it."""

from __future__ import annotations

import math

import pytest

from seal.runtime.fleet_counters import canary_gap

LEARNER = [-1.25, -0.5, -3.0, -0.75]
BOUND = 0.05  # trainer.canary_max_diff's order


def test_matching_logprobs_pass_and_a_shifted_one_fails():
    assert canary_gap(LEARNER, LEARNER) == 0.0
    assert canary_gap([x + 0.01 for x in LEARNER], LEARNER) == pytest.approx(0.01)
    assert canary_gap(LEARNER[:-1], LEARNER) == math.inf
    assert canary_gap([], []) == 0.0


@pytest.mark.parametrize("at", [0, 2, 3])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_logprob_on_either_side_fails_wherever_it_is(at, value):
    got = [value if i == at else x for i, x in enumerate(LEARNER)]
    # What the fleet compared before: max() returns NaN when the first gap is NaN and skips it elsewhere,
    # and NaN > bound is False, so a replica serving NaN weights passed.
    if math.isnan(value):
        old = max(abs(a - b) for a, b in zip(got, LEARNER))
        assert not old > BOUND
    assert canary_gap(got, LEARNER) > BOUND and canary_gap(LEARNER, got) > BOUND
