"""Learning curves over frozen snapshots (evaluation/curves.py): pooling over seeds and
the paired difference between two arms, step by step."""

import pytest

from evaluation.before_after import wilson_interval
from evaluation.curves import arm_curve, curve_record, difference_curve, held_in, in_category

RESULTS = {"b1": ("base", True), "b2": ("base", False), "m1": ("miss_param", True), "r1": ("recovery", True)}


def test_views_of_one_snapshot():
    assert held_in(RESULTS, ["recovery"]) == {"b1": True, "b2": False, "m1": True}
    assert in_category(RESULTS, "base") == {"b1": True, "b2": False}


def test_a_point_pools_the_seeds_that_have_a_snapshot_at_its_step():
    runs = {
        0: {0: {"a": False, "b": True}, 5: {"a": True, "b": True}},
        1: {0: {"a": False, "b": False}, 5: {"a": True, "b": False}, 10: {"a": True, "b": True}},
    }
    points = arm_curve(runs)
    assert [p.step for p in points] == [0, 5, 10]
    assert [(p.pooled.successes, p.pooled.n) for p in points] == [(1, 4), (3, 4), (2, 2)]
    assert sorted(points[2].by_seed) == [1]  # seed 0 has no snapshot at step 10
    record = curve_record(points)
    assert record[1]["rate"] == 0.75 and record[1]["ci95"] == list(wilson_interval(3, 4))
    assert record[1]["by_seed"]["0"]["successes"] == 2


def test_the_difference_is_paired_over_seed_task_pairs_both_arms_played():
    first = {0: {0: {"a": False, "b": True}, 5: {"a": False, "b": True}}, 1: {5: {"a": True, "b": False}}}
    second = {0: {0: {"a": False, "b": True}, 5: {"a": True, "b": True}}, 1: {5: {"a": True, "b": True}}}
    d0, d5 = difference_curve(first, second)
    assert (d0.step, d0.seeds, d0.change.n, d0.change.change) == (0, (0,), 2, 0.0)
    # step 5: seed 0 gains a, seed 1 gains b; no loss
    assert (d5.seeds, d5.change.n, d5.change.gained, d5.change.lost) == ((0, 1), 4, 2, 0)
    lo, hi = d5.change.interval
    assert lo < 0.5 < hi


def test_runs_of_different_tasks_cannot_be_paired():
    with pytest.raises(ValueError, match="different tasks"):
        difference_curve({0: {5: {"a": True}}}, {0: {5: {"b": True}}})
