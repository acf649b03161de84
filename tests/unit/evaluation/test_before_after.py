"""The frozen evaluation's summary (evaluation/before_after.py) on hand-computed cases."""

import pytest

from evaluation.before_after import (
    HELD_IN_ALL,
    Change,
    Rate,
    before_after_rows,
    paired_change,
    row_record,
    wilson_interval,
)


def test_wilson_interval_matches_hand_computed_values():
    # 0 of 10: centre = (0 + z^2/20) / (1 + z^2/10) = 0.13877 = half-width, so [0, 0.2775].
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.27753, abs=1e-4)
    # 5 of 10: centre 0.5, half = z * sqrt(0.025 + z^2/400) / (1 + z^2/10) = 0.26340.
    assert wilson_interval(5, 10) == pytest.approx((0.23659, 0.76341), abs=1e-4)
    # 10 of 10 mirrors 0 of 10.
    assert wilson_interval(10, 10) == pytest.approx((1 - 0.27753, 1.0), abs=1e-4)


def test_wilson_interval_refuses_impossible_counts():
    with pytest.raises(ValueError, match="successes <= n"):
        wilson_interval(3, 2)
    with pytest.raises(ValueError, match="n >= 1"):
        wilson_interval(0, 0)


def test_paired_change_counts_tasks_that_moved_and_uses_agresti_min():
    before = {f"t{i}": i < 2 for i in range(10)}  # t0, t1 solved
    after = {f"t{i}": i in (1, 2, 3, 4) for i in range(10)}  # t0 lost; t2, t3, t4 gained
    c = paired_change(before, after)
    assert (c.n, c.gained, c.lost) == (10, 3, 1)
    assert c.change == pytest.approx(0.2)
    # Agresti-Min: g = 3.5, l = 1.5, n = 12: d = 2/12, half = z * sqrt(5 - 4/12) / 12 = 0.35284.
    assert c.interval == pytest.approx((2 / 12 - 0.35284, 2 / 12 + 0.35284), abs=1e-4)


def test_no_task_changed_still_has_an_interval_around_zero():
    c = Change(40, 0, 0)
    lo, hi = c.interval
    assert c.change == 0 and lo < 0 < hi and hi == pytest.approx(-lo)


def test_paired_change_refuses_different_task_sets():
    with pytest.raises(ValueError, match="different tasks"):
        paired_change({"a": True}, {"b": True})


def test_rows_per_category_then_the_held_in_pool_and_held_out_last():
    cats = {"b1": "base", "b2": "base", "m1": "miss_param", "m2": "miss_param", "r1": "recovery"}
    before = {t: (c, t == "m1") for t, c in cats.items()}
    after = {t: (c, t in ("b1", "m1", "m2")) for t, c in cats.items()}
    rows = before_after_rows(before, after, held_out=["recovery"])
    assert [r.name for r in rows] == ["base", "miss_param", "recovery", HELD_IN_ALL]
    base, miss, rec, pooled = rows
    assert (base.before, base.after, base.change.gained) == (Rate(0, 2), Rate(1, 2), 1)
    assert (miss.before, miss.after) == (Rate(1, 2), Rate(2, 2))
    assert rec.held_out and rec.change.change == 0
    assert (pooled.before, pooled.after, pooled.change.gained, pooled.change.lost) == (Rate(1, 4), Rate(3, 4), 2, 0)
    record = row_record(pooled)
    assert record["change"]["value"] == pytest.approx(0.5) and record["after"]["successes"] == 3


def test_rows_refuse_a_task_whose_category_differs_between_snapshots():
    with pytest.raises(ValueError, match="is 'base' in one snapshot"):
        before_after_rows({"t": ("base", True)}, {"t": ("miss_param", True)}, held_out=[])
